//! Session-bound leases with real sessions on a real server: a lease ends with its backend
//! (terminated, its client killed), and a DBA can forbid them.
//!
//! Run with `--test-threads=1 --nocapture` to see the measured numbers.

use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use lockext_cluster_tests::leases::*;
use lockext_cluster_tests::*;

// ---------------------------------------------------------------------------------------
// 5. A session-bound lease ends with its backend
// ---------------------------------------------------------------------------------------

#[test]
fn session_bound_gone_after_terminate() {
    let cluster = Cluster::start("modes-term", "");
    let mut admin = cluster.connect();
    for (mode, extra) in [
        ("exclusive", "session_bound => true"),
        ("shared", "mode => 'shared', session_bound => true"),
    ] {
        let id = format!("sb:{mode}");
        let mut s = cluster.connect();
        let pid: i32 = s.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        let token = acquire(&mut s, &id, "doomed", "1 hour", extra)
            .unwrap()
            .expect("granted");
        // In shared mode an ordinary reader holds alongside; it must stay.
        let mut bystander = cluster.connect();
        if mode == "shared" {
            acquire(
                &mut bystander,
                &id,
                "bystander",
                "1 hour",
                "mode => 'shared'",
            )
            .unwrap()
            .expect("a second reader");
        }
        let row = admin
            .query_one(
                "SELECT mode, pid, session_bound FROM lockext.holders WHERE lock_id = $1 AND owner = 'doomed'",
                &[&id],
            )
            .unwrap();
        assert_eq!(row.get::<_, String>(0), mode);
        assert_eq!(row.get::<_, Option<i32>>(1), Some(pid));
        assert!(row.get::<_, bool>(2), "holders says it is session-bound");

        let t0 = Instant::now();
        let terminated: bool = admin
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .unwrap()
            .get(0);
        assert!(terminated);
        let gone = time_until_gone(&mut admin, &id, "doomed", t0);
        println!(
            "{mode} session-bound lease (ttl 1 hour) gone {gone:?} after pg_terminate_backend"
        );
        assert!(gone < Duration::from_secs(1), "took {gone:?}");
        assert!(s.simple_query("SELECT 1").is_err(), "the session is dead");
        if mode == "shared" {
            let left = holders(&mut admin, &id);
            assert_eq!(left.len(), 1, "{left:?}");
            assert_eq!(left[0].0, "bystander", "the other reader keeps its lease");
            assert!(release(&mut bystander, &id, "bystander"));
        }
        let next = acquire(&mut admin, &id, "next", "1 minute", "")
            .unwrap()
            .expect("the lock is free again");
        assert!(next > token);
        assert!(release(&mut admin, &id, "next"));
    }

    // A normal close ends it too.
    let mut s = cluster.connect();
    acquire(
        &mut s,
        "sb:close",
        "closer",
        "1 hour",
        "session_bound => true",
    )
    .unwrap()
    .unwrap();
    let t0 = Instant::now();
    drop(s);
    let gone = time_until_gone(&mut admin, "sb:close", "closer", t0);
    println!("session-bound lease gone {gone:?} after the client closed its connection");
    assert!(gone < Duration::from_secs(1), "took {gone:?}");

    // And a session-bound lease is not ended by another session closing.
    let mut keeper = cluster.connect();
    acquire(
        &mut keeper,
        "sb:keep",
        "keeper",
        "1 hour",
        "session_bound => true",
    )
    .unwrap()
    .unwrap();
    drop(cluster.connect());
    sleep(ms(300));
    assert_eq!(holders(&mut admin, "sb:keep").len(), 1);
}

// ---------------------------------------------------------------------------------------
// 6. A session-bound lease ends when its client process is killed
// ---------------------------------------------------------------------------------------

/// A psql client process running `script`, its stdin kept open so that it stays
/// connected (idle or busy) until killed.
fn psql(cluster: &Cluster, script: &str) -> (Child, ChildStdin) {
    let mut child = Command::new(format!("{PG_BIN}/psql"))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", cluster.port.to_string())
        .env("PGUSER", "postgres")
        .env("PGDATABASE", "postgres")
        .env("PGAPPNAME", "modes-psql")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn psql");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(script.as_bytes()).unwrap();
    stdin.flush().unwrap();
    (child, stdin)
}

/// Waits until `owner` holds `lock`; (backend pid, token).
fn visible(c: &mut Client, lock: &str, owner: &str) -> (i32, i64) {
    eventually(
        Duration::from_secs(10),
        "the client's lease is visible",
        || {
            c.query_opt(
                "SELECT pid, fence_token FROM lockext.holders WHERE lock_id = $1 AND owner = $2",
                &[&lock, &owner],
            )
            .unwrap()
            .map(|r| (r.get::<_, i32>(0), r.get::<_, i64>(1)))
        },
    )
}

#[test]
fn session_bound_gone_after_client_sigkill() {
    let cluster = Cluster::start("modes-kill", "");
    let mut admin = cluster.connect();

    // The client sits idle after taking the lease (working on something else).
    let (mut child, _stdin) = psql(
        &cluster,
        "SELECT lockext.lock_acquire('sk:idle', 'idle-client', '1 hour', session_bound => true);\n",
    );
    let (pid, _) = visible(&mut admin, "sk:idle", "idle-client");
    let t0 = Instant::now();
    child.kill().expect("kill -9 psql");
    child.wait().unwrap();
    let gone = time_until_gone(&mut admin, "sk:idle", "idle-client", t0);
    println!(
        "idle client killed with SIGKILL: session-bound lease (ttl 1 hour) gone after {gone:?}"
    );
    assert!(gone < Duration::from_secs(1), "took {gone:?}");
    assert!(!backend_alive(&mut admin, pid));

    // The client's backend is busy in a long statement when the client dies; with
    // client_connection_check_interval the backend notices and exits.
    let (mut child, _stdin) = psql(
        &cluster,
        "SET client_connection_check_interval = '100ms';\n\
         SELECT lockext.lock_acquire('sk:busy', 'busy-client', '1 hour', session_bound => true);\n\
         SELECT pg_sleep(600);\n",
    );
    let (pid, _) = visible(&mut admin, "sk:busy", "busy-client");
    eventually(
        Duration::from_secs(10),
        "the client's backend sleeps",
        || {
            let q: Option<String> = admin
                .query_opt(
                    "SELECT query FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
                    &[&pid],
                )
                .unwrap()
                .map(|r| r.get(0));
            q.filter(|q| q.contains("pg_sleep")).map(|_| ())
        },
    );
    let t0 = Instant::now();
    child.kill().expect("kill -9 psql");
    child.wait().unwrap();
    let gone = time_until_gone(&mut admin, "sk:busy", "busy-client", t0);
    println!(
        "busy client (pg_sleep, client_connection_check_interval 100ms) killed with SIGKILL: lease gone after {gone:?}"
    );
    assert!(gone < Duration::from_secs(1), "took {gone:?}");

    // Without session_bound the lease outlives its client, until its TTL.
    let (mut child, _stdin) = psql(
        &cluster,
        "SELECT lockext.lock_acquire('sk:plain', 'plain-client', '4 seconds');\n",
    );
    let (pid, token) = visible(&mut admin, "sk:plain", "plain-client");
    let t0 = Instant::now();
    child.kill().expect("kill -9 psql");
    child.wait().unwrap();
    eventually(
        Duration::from_secs(2),
        "the dead client's backend exits",
        || (!backend_alive(&mut admin, pid)).then_some(()),
    );
    sleep(Duration::from_secs(2).saturating_sub(t0.elapsed()));
    let h = holders(&mut admin, "sk:plain");
    assert_eq!(
        h,
        [held("plain-client", "exclusive", token)],
        "a lease without session_bound survives its client's death"
    );
    let gone = time_until_gone(&mut admin, "sk:plain", "plain-client", t0);
    println!("lease without session_bound (ttl 4 s) still held 2 s after its client died; gone {gone:?} after the kill");
    assert!(gone > Duration::from_secs(2));
}

// ---------------------------------------------------------------------------------------
// 7. A DBA can forbid session-bound leases
// ---------------------------------------------------------------------------------------

#[test]
fn session_leases_off_refused() {
    let cluster = Cluster::start("modes-off", "");
    let mut admin = cluster.connect();
    admin
        .batch_execute(
            "CREATE ROLE app LOGIN;
             GRANT lockext_user TO app;
             ALTER ROLE app SET lockext.session_leases = off;",
        )
        .unwrap();
    let url = cluster.url("postgres").replace("user=postgres", "user=app");
    let mut app = Client::connect(&url, NoTls).expect("connect as app");
    let setting: String = app
        .query_one("SHOW lockext.session_leases", &[])
        .unwrap()
        .get(0);
    assert_eq!(setting, "off");

    expect_sqlstate(
        acquire(
            &mut app,
            "off:1",
            "app",
            "1 minute",
            "session_bound => true",
        ),
        "0A000",
        "a session-bound lease with lockext.session_leases off",
    );
    expect_sqlstate(
        acquire(
            &mut app,
            "off:1",
            "app",
            "1 minute",
            "mode => 'shared', session_bound => true",
        ),
        "0A000",
        "a session-bound shared lease with lockext.session_leases off",
    );
    expect_sqlstate(
        app.query(
            "SELECT * FROM lockext.lock_acquire_all(ARRAY['off:1', 'off:2'], 'app', '1 minute', session_bound => true)",
            &[],
        ),
        "0A000",
        "session-bound lock_acquire_all with lockext.session_leases off",
    );
    assert!(all_locks(&mut admin).is_empty(), "nothing is held");
    assert!(holders(&mut admin, "off:1").is_empty());
    assert!(holders(&mut admin, "off:2").is_empty());
    // The role cannot turn it back on.
    expect_sqlstate(
        app.batch_execute("SET lockext.session_leases = on"),
        "42501",
        "a non-superuser setting lockext.session_leases",
    );
    // Ordinary leases still work for it.
    acquire(&mut app, "off:1", "app", "1 minute", "")
        .unwrap()
        .expect("an ordinary lease");
    assert!(release(&mut app, "off:1", "app"));

    // A superuser's session, SET off.
    admin
        .batch_execute("SET lockext.session_leases = off")
        .unwrap();
    expect_sqlstate(
        acquire(
            &mut admin,
            "off:2",
            "dba",
            "1 minute",
            "session_bound => true",
        ),
        "0A000",
        "a session-bound lease after SET lockext.session_leases = off",
    );
    assert!(holders(&mut admin, "off:2").is_empty());
    admin
        .batch_execute("SET lockext.session_leases = on")
        .unwrap();
    acquire(
        &mut admin,
        "off:2",
        "dba",
        "1 minute",
        "session_bound => true",
    )
    .unwrap()
    .expect("a session-bound lease once it is on again");
    println!("session_bound refused with 0A000 while lockext.session_leases = off (role and session settings)");
}

// ---------------------------------------------------------------------------------------
// 7. An exit that finds its lease row locked waits for it, one second at most
// ---------------------------------------------------------------------------------------

/// Rows of `lock` in the lease table, whatever their state (`holders` shows live leases).
fn lease_rows(c: &mut Client, lock: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM lockext.locks WHERE lock_id = $1",
        &[&lock],
    )
    .unwrap()
    .get(0)
}

/// The exit hook waits for a lease row that another transaction holds (a renewal or
/// release in flight: end_mine.sql), so that the lease cannot outlive its session; but
/// only for `lock_timeout` = 1 s (exit_settings.sql): a transaction left open on the row
/// must not keep the backend, and a shutdown, from ending. Past it, the reaper ends the
/// lease once the row is free. The row is held open by a transaction that locked it, so
/// the wait is forced, not hoped for.
#[test]
fn session_exit_waits_for_a_locked_row_one_second_then_the_reaper_ends_it() {
    let cluster = Cluster::start("modes-exit-wait", "lockext.reap_interval = '100ms'");
    let mut admin = cluster.connect();
    let mut s = cluster.connect();
    let pid: i32 = s.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let token = acquire(
        &mut s,
        "sb:held",
        "doomed",
        "1 hour",
        "session_bound => true",
    )
    .unwrap()
    .expect("granted");

    // Another transaction holds the lease row, as a renewal in flight does, and stays open.
    let mut holder = cluster.connect();
    holder
        .batch_execute("BEGIN; SELECT 1 FROM lockext.locks WHERE lock_id = 'sb:held' FOR UPDATE")
        .unwrap();
    let terminated: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap()
        .get(0);
    assert!(terminated);
    // The exiting backend waits for the row (naps between tries): the exit does not skip
    // a lease in flight.
    eventually(
        Duration::from_secs(10),
        "the exiting backend waits for the locked lease row",
        || {
            admin
                .query_opt(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Extension'",
                    &[&pid],
                )
                .unwrap()
        },
    );
    // It gives up after lock_timeout and exits, although the row is still held.
    let t0 = Instant::now();
    eventually(
        Duration::from_secs(30),
        "the exiting backend is gone while the row is still held",
        || {
            admin
                .query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
                .unwrap()
                .is_none()
                .then_some(())
        },
    );
    println!(
        "the exit gave up waiting for the held lease row and ended {:?} after it was first seen waiting",
        t0.elapsed()
    );
    assert_eq!(
        lease_rows(&mut admin, "sb:held"),
        1,
        "the lease row stays while another transaction holds it"
    );
    assert!(
        holder.simple_query("SELECT 1").is_ok(),
        "the row's holder is unaffected"
    );

    // Once the row is free, the reaper ends the lease of the session that is gone.
    holder.batch_execute("COMMIT").unwrap();
    eventually(
        Duration::from_secs(30),
        "the reaper ends the lease of the exited session",
        || (lease_rows(&mut admin, "sb:held") == 0).then_some(()),
    );
    let next = acquire(&mut admin, "sb:held", "next", "1 minute", "")
        .unwrap()
        .expect("the lock is free again");
    assert!(next > token);
    assert!(release(&mut admin, "sb:held", "next"));
}
