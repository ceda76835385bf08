//! Which databases the reaper serves, with no configuration: every database that has
//! lockext, picked up after CREATE EXTENSION, let go at DROP EXTENSION, and never in the
//! way of DROP DATABASE. Real server, real clients; a round held open with gdb.
//!
//! Run with `--test-threads=1 --nocapture` to see the timings.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use lockext_cluster_tests::gdb::Gdb;
use lockext_cluster_tests::*;

const FAST: &str = "lockext.reap_interval = '200ms'";

/// Where a round is stopped: at the end of one batch's transaction (every batch commits its
/// own). Stopped there, the round is connected to its database with more batches to go,
/// and the next batch begins by looking whether a DROP DATABASE wants the database.
const BETWEEN_BATCHES: &str = "CommitTransactionCommand";

fn expired_lease(c: &mut Client, lock: &str) {
    c.query_one(
        "SELECT lockext.lock_acquire($1, 'dead-client', '1 millisecond')",
        &[&lock],
    )
    .expect("lock_acquire");
}

fn lease_exists(c: &mut Client, lock: &str) -> bool {
    c.query_one(
        "SELECT count(*) = 1 FROM lockext.locks WHERE lock_id = $1",
        &[&lock],
    )
    .expect("lease row")
    .get(0)
}

/// reaper_status's (rounds, reaped_total, last_error) for `db`, if it has a row.
fn status(c: &mut Client, db: &str) -> Option<(i64, i64, Option<String>)> {
    c.query_opt(
        "SELECT rounds, reaped_total, last_error FROM lockext.reaper_status() WHERE database = $1",
        &[&db],
    )
    .expect("reaper_status")
    .map(|r| (r.get(0), r.get(1), r.get(2)))
}

fn reload(c: &mut Client, alter_system: &str) {
    c.batch_execute(alter_system).unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
}

/// The server log's lines after the first `skip` bytes, from a lockext process or naming
/// `db`, at a level above DEBUG.
fn loud_lines(cluster: &Cluster, skip: usize, db: &str) -> Vec<String> {
    let log = cluster.log();
    log.get(skip..)
        .unwrap_or("")
        .lines()
        .filter(|l| l.contains("lockext") || l.contains(&format!("\"{db}\"")))
        .filter(|l| !l.contains(" DEBUG: ") && !l.contains(" DEBUG1: "))
        .filter(|l| !l.contains("client backend") || l.contains("ERROR") || l.contains("WARNING"))
        .map(str::to_string)
        .collect()
}

/// Seconds since midnight of a log line's `%m` timestamp ("2026-12-01 15:16:26.549 UTC").
fn line_seconds(line: &str) -> f64 {
    let time = line.split(' ').nth(1).expect("a time");
    let parts: Vec<f64> = time.split(':').map(|p| p.parse().unwrap()).collect();
    parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
}

#[test]
fn create_extension_in_a_new_database_is_served_and_drop_extension_lets_it_go_quietly() {
    let cluster = Cluster::start("rdb-create", FAST);
    let mut c = cluster.connect();
    c.batch_execute("CREATE DATABASE app").unwrap();
    let mut app = cluster.connect_to("app");
    // Nothing to serve yet: a database without lockext has no row.
    thread::sleep(Duration::from_secs(4));
    assert_eq!(status(&mut c, "app"), None);

    let created = Instant::now();
    app.batch_execute("CREATE EXTENSION lockext").unwrap();
    expired_lease(&mut app, "in-app");
    eventually(
        Duration::from_secs(10),
        "the expired lease in app is reaped",
        || (!lease_exists(&mut app, "in-app")).then_some(()),
    );
    let took = created.elapsed();
    println!("CREATE EXTENSION to the first lease reaped in app: {took:?}");
    assert!(took < Duration::from_secs(6), "picked up after {took:?}");
    let (rounds, reaped, error) = status(&mut c, "app").expect("app has a reaper_status row");
    assert!(
        rounds >= 1 && reaped == 1 && error.is_none(),
        "{rounds} {reaped} {error:?}"
    );

    // DROP EXTENSION: the reaper lets the database go, and says nothing about it.
    let log_before = cluster.log().len();
    app.batch_execute("DROP EXTENSION lockext").unwrap();
    eventually(
        Duration::from_secs(10),
        "app's reaper_status row is gone",
        || status(&mut c, "app").is_none().then_some(()),
    );
    thread::sleep(Duration::from_secs(4)); // another look or two at app
    assert_eq!(status(&mut c, "app"), None);
    let loud = loud_lines(&cluster, log_before, "app");
    assert!(loud.is_empty(), "after DROP EXTENSION: {loud:#?}");

    // And picked up again when it comes back.
    app.batch_execute("CREATE EXTENSION lockext").unwrap();
    expired_lease(&mut app, "again");
    eventually(Duration::from_secs(10), "reaped again", || {
        (!lease_exists(&mut app, "again")).then_some(())
    });
    // postgres was served throughout (idle: its first round, then none until it is due).
    assert!(status(&mut c, "postgres").is_some_and(|(rounds, _, e)| rounds >= 1 && e.is_none()));
}

/// A database without lockext is looked at (a round connects, finds no extension, exits)
/// every few seconds, never more often, and nothing about it reaches the log above DEBUG.
#[test]
fn a_database_without_lockext_is_looked_at_every_few_seconds_and_logs_nothing() {
    let cluster = Cluster::start("rdb-plain", &format!("{FAST}\nlog_min_messages = debug1"));
    let mut c = cluster.connect();
    let log_before = cluster.log().len();
    c.batch_execute("CREATE DATABASE plain").unwrap();
    let look = "no extension lockext in database \"plain\"";
    let looks = eventually(Duration::from_secs(20), "four looks at plain", || {
        let log = cluster.log();
        let looks: Vec<String> = log
            .lines()
            .filter(|l| l.contains(look))
            .map(str::to_string)
            .collect();
        (looks.len() >= 4).then_some(looks)
    });
    let times: Vec<f64> = looks.iter().map(|l| line_seconds(l)).collect();
    for pair in times.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= 2.5, "looked again after {gap:.3} s: {looks:#?}");
    }
    assert!(
        looks.iter().all(|l| l.contains("DEBUG")),
        "looks are DEBUG lines: {looks:#?}"
    );
    let loud = loud_lines(&cluster, log_before, "plain");
    assert!(loud.is_empty(), "{loud:#?}");
    assert_eq!(status(&mut c, "plain"), None);
}

/// `lockext.database` narrows the reaper to the databases it names, and '' to none; '*'
/// (the default) is every database again. Templates and databases that refuse connections
/// are never entered, even with lockext and expired leases in them.
#[test]
fn the_setting_narrows_it_and_templates_and_closed_databases_are_never_entered() {
    let cluster = Cluster::start("rdb-narrow", &format!("{FAST}\nlockext.database = 'app_a'"));
    let mut c = cluster.connect();
    for db in ["app_a", "app_b", "tmpl", "closed"] {
        c.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
        let mut d = cluster.connect_to(db);
        d.batch_execute("CREATE EXTENSION lockext").unwrap();
        expired_lease(&mut d, "old");
    }
    c.batch_execute(
        "ALTER DATABASE tmpl IS_TEMPLATE true; ALTER DATABASE closed ALLOW_CONNECTIONS false",
    )
    .unwrap();
    let mut a = cluster.connect_to("app_a");
    let mut b = cluster.connect_to("app_b");
    eventually(Duration::from_secs(10), "app_a is reaped", || {
        (!lease_exists(&mut a, "old")).then_some(())
    });
    let (rounds_of_postgres, _, _) = status(&mut c, "postgres").unwrap_or((0, 0, None));
    thread::sleep(Duration::from_secs(2));
    assert!(
        lease_exists(&mut b, "old"),
        "app_b is not named: not reaped"
    );
    assert_eq!(status(&mut c, "app_b"), None);
    assert_eq!(
        status(&mut c, "postgres").map(|s| s.0).unwrap_or(0),
        rounds_of_postgres,
        "postgres is not named: no rounds"
    );

    // '' serves none.
    reload(&mut c, "ALTER SYSTEM SET lockext.database = ''");
    eventually(Duration::from_secs(10), "app_a let go", || {
        status(&mut c, "app_a").is_none().then_some(())
    });
    expired_lease(&mut a, "while-none");
    thread::sleep(Duration::from_secs(2));
    assert!(lease_exists(&mut a, "while-none"), "no database is served");

    // '*' serves every database with lockext, but neither the template nor the closed one.
    reload(&mut c, "ALTER SYSTEM SET lockext.database = '*'");
    eventually(Duration::from_secs(10), "app_a and app_b reaped", || {
        (!lease_exists(&mut a, "while-none") && !lease_exists(&mut b, "old")).then_some(())
    });
    thread::sleep(Duration::from_secs(2));
    c.batch_execute(
        "ALTER DATABASE closed ALLOW_CONNECTIONS true; ALTER DATABASE tmpl IS_TEMPLATE false",
    )
    .unwrap();
    for db in ["tmpl", "closed"] {
        let mut d = cluster.connect_to(db);
        assert!(lease_exists(&mut d, "old"), "{db} was entered");
    }
    let served: Vec<String> = c
        .query(
            "SELECT database FROM lockext.reaper_status() ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        !served.iter().any(|d| d == "tmpl" || d == "closed"),
        "{served:?}"
    );
}

/// DROP DATABASE of a served database, many times over while rounds run back to back
/// (reap_interval 10 ms): each succeeds at once, as for a database without sessions.
#[test]
fn drop_database_succeeds_while_rounds_run_back_to_back() {
    let cluster = Cluster::start(
        "rdb-drop",
        "lockext.reap_interval = '10ms'\nlockext.reap_batch_size = 1",
    );
    let mut c = cluster.connect();
    for i in 0..5 {
        c.batch_execute("CREATE DATABASE doomed").unwrap();
        {
            let mut d = cluster.connect_to("doomed");
            d.batch_execute("CREATE EXTENSION lockext").unwrap();
            d.batch_execute(
                "SELECT count(lockext.lock_acquire('l-' || g, 'dead', '1 millisecond')) \
                 FROM generate_series(1, 2000) g",
            )
            .unwrap();
        }
        eventually(Duration::from_secs(10), "a round in doomed", || {
            reaper_pid(&mut c, "doomed")
        });
        let started = Instant::now();
        let dropped = c.batch_execute(if i % 2 == 0 {
            "DROP DATABASE doomed"
        } else {
            "DROP DATABASE doomed WITH (FORCE)"
        });
        let took = started.elapsed();
        println!("DROP DATABASE #{i} during a round: {dropped:?} in {took:?}");
        dropped.expect("DROP DATABASE while the reaper serves it");
        assert!(
            took < Duration::from_secs(4),
            "DROP DATABASE waited {took:?}"
        );
    }
    let log = cluster.log();
    assert!(!log.contains("being accessed by other users"), "{log}");
    // A round registered just before a DROP DATABASE locked the database waits in its
    // connection for the DROP, then PostgreSQL ends it, as it would a client's connection.
    let late = log
        .lines()
        .filter(|l| l.contains("lockext reaper") && l.contains("FATAL"))
        .count();
    println!("rounds that came too late and were refused their connection: {late}");
    assert!(
        !log.lines()
            .any(|l| l.contains("lockext") && l.contains("ERROR")),
        "{log}"
    );
}

/// Which backend holds the database object in `mode`, granted, if one does.
fn holds_database_lock(c: &mut Client, db: &str, mode: &str) -> bool {
    c.query_one(
        "SELECT count(*) > 0 FROM pg_locks l JOIN pg_database d ON l.objid = d.oid \
         WHERE l.locktype = 'object' AND l.classid = 'pg_database'::regclass \
           AND d.datname = $1 AND l.mode = $2 AND l.granted",
        &[&db, &mode],
    )
    .unwrap()
    .get(0)
}

/// A database with lockext and `n` expired leases, and a round of it stopped between two
/// batches (batch size 1: thousands of batches to go). Returns the gdb holding the round.
fn stopped_round(cluster: &Cluster, c: &mut Client, db: &str, owner: &str, n: i32) -> Gdb {
    c.batch_execute(&format!("CREATE DATABASE {db} OWNER {owner}"))
        .unwrap();
    {
        let mut d = cluster.connect_to(db);
        d.batch_execute("CREATE EXTENSION lockext").unwrap();
        d.execute(
            "SELECT count(lockext.lock_acquire('l-' || g, 'dead', '1 millisecond')) \
             FROM generate_series(1, $1) g",
            &[&n],
        )
        .unwrap();
    }
    // The long round: one still there a moment later (a round that found nothing to do,
    // begun before the leases committed, may be seen as it exits).
    let pid = eventually(
        Duration::from_secs(20),
        "a long round in the database",
        || {
            let pid = reaper_pid(c, db)?;
            thread::sleep(Duration::from_millis(300));
            (reaper_pid(c, db) == Some(pid)).then_some(pid)
        },
    );
    let mut gdb = Gdb::attach_and_break(pid, BETWEEN_BATCHES);
    gdb.wait_for_breakpoint(Duration::from_secs(20));
    // DROP ... WITH (FORCE) sends it SIGTERM: delivered when gdb lets it run.
    gdb.command(
        "-interpreter-exec console \"handle SIGTERM nostop noprint pass\"",
        Duration::from_secs(10),
    );
    gdb
}

/// What happens when DROP DATABASE comes while a round is connected: a stopped round holds
/// the database like any session (DROP DATABASE fails after its 5 s, 55006); a round that
/// runs leaves it at its next batch, and DROP DATABASE (plain, and WITH (FORCE)) succeeds
/// although the round had thousands of batches to go. FORCE is run by the database's
/// owner, no superuser: PostgreSQL lets it end only processes of roles it is a member of,
/// and a round counts as the owner's (on a build where it did not, FORCE failed at once
/// with 42501, "must be a member of the role whose process is being terminated").
const LEASES: i32 = 50000;

#[test]
fn drop_database_during_a_round_that_is_forced_open() {
    let cluster = Cluster::start(
        "rdb-held",
        // One round for all its batches (lockext.reap_round_batches would end it after
        // 100 and start another: the round the test stops must be the one that runs on).
        "lockext.reap_interval = '200ms'\nlockext.reap_batch_size = 1\n\
         lockext.reap_round_batches = 1000000",
    );
    let mut c = cluster.connect();
    c.batch_execute("CREATE ROLE app_owner LOGIN CREATEDB")
        .unwrap();

    let mut gdb = stopped_round(&cluster, &mut c, "held", "postgres", LEASES);
    let refused = c
        .batch_execute("DROP DATABASE held")
        .expect_err("a stopped round holds the database");
    let code = refused.code().map(|s| s.code().to_string());
    let message = refused.as_db_error().map(|e| e.message().to_string());
    println!("DROP DATABASE while the round is stopped: {code:?} {message:?}");
    assert_eq!(code.as_deref(), Some("55006"), "{refused}");

    for (db, user, sql) in [
        ("held", "postgres", "DROP DATABASE held"),
        ("forced", "app_owner", "DROP DATABASE forced WITH (FORCE)"),
    ] {
        if db == "forced" {
            gdb = stopped_round(&cluster, &mut c, "forced", "app_owner", LEASES);
        }
        let url = cluster
            .url("postgres")
            .replace("user=postgres", &format!("user={user}"));
        let (tx, rx) = mpsc::channel();
        let statement = sql.to_string();
        thread::spawn(move || {
            let mut d = Client::connect(&url, NoTls).unwrap();
            let started = Instant::now();
            let result = d.batch_execute(&statement).map_err(|e| e.to_string());
            tx.send((result, started.elapsed())).unwrap();
        });
        eventually(
            Duration::from_secs(5),
            "DROP DATABASE holds its lock",
            || holds_database_lock(&mut c, db, "AccessExclusiveLock").then_some(()),
        );
        let reaped = {
            let mut d = Client::connect(&cluster.url("postgres"), NoTls).unwrap();
            d.query_one(
                "SELECT reaped_total FROM lockext.reaper_status() WHERE database = $1",
                &[&db],
            )
            .map(|r| r.get::<_, i64>(0))
            .unwrap_or(0)
        };
        gdb.release();
        let (result, took) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        println!(
            "{sql}, the round let go at its next batch ({reaped} of {LEASES} reaped): {result:?} in {took:?}"
        );
        result.expect("DROP DATABASE once the round runs on");
        // Without letting go, the round's remaining batches would outlast DROP DATABASE's
        // 5 s (tens of thousands, at well under 10 000 a second).
        assert!(
            reaped < i64::from(LEASES - 30000),
            "the round had most of its batches to go: {reaped}"
        );
    }
    let log = cluster.log();
    assert!(
        !log.lines()
            .any(|l| l.contains("lockext reaper") && l.contains("ERROR")),
        "{log}"
    );
}

/// A round that fails is not retried in a tight loop: each failure doubles its database's
/// wait (from 1 s, up to a minute), and each failure is one log line. The failure here:
/// lockext's table renamed under the reaper's statements.
#[test]
fn failing_rounds_back_off_and_recover() {
    let cluster = Cluster::start("rdb-backoff", FAST);
    let mut c = cluster.connect();
    expired_lease(&mut c, "before");
    eventually(Duration::from_secs(10), "reaped before", || {
        (!lease_exists(&mut c, "before")).then_some(())
    });
    let failed = "the reaper of database \"postgres\" failed";
    // Something due a second from now (a round runs only where something is), then the
    // break: from the first failed round on, rounds retry whatever is due.
    c.query_one(
        "SELECT lockext.lock_acquire('due', 'dead-client', '1 second')",
        &[],
    )
    .unwrap();
    c.batch_execute("ALTER TABLE lockext.locks RENAME TO locks_away")
        .unwrap();
    let broken = Instant::now();
    thread::sleep(Duration::from_secs(12));
    let failures = cluster.log().matches(failed).count();
    println!("failed rounds in the 12 s after the break: {failures}");
    // Every 200 ms that would be 60; 1 + 2 + 4 s apart, at most 4 or 5.
    assert!(
        (2..=5).contains(&failures),
        "{failures} failures:\n{}",
        cluster.log()
    );
    let (_, _, error) = status(&mut c, "postgres").expect("a row for postgres");
    assert!(
        error.as_deref().is_some_and(|e| e.contains("locks")),
        "{error:?}"
    );
    c.batch_execute("ALTER TABLE lockext.locks_away RENAME TO locks")
        .unwrap();
    expired_lease(&mut c, "after");
    eventually(
        Duration::from_secs(70),
        "reaped again once repaired",
        || (!lease_exists(&mut c, "after")).then_some(()),
    );
    println!("recovered {:?} after the break", broken.elapsed());
    assert_eq!(status(&mut c, "postgres").and_then(|s| s.2), None);
}

/// A database whose schema `lockext` belongs to another role (an installation made before
/// CREATE EXTENSION refused such a schema: its owner made it first) is not reaped: a
/// round runs as a superuser and names `lockext.*` objects, which that role could swap for
/// its own. Here the database's owner does exactly that, with a `lockext.free_at` that
/// makes it a superuser when called; no round may call it.
#[test]
fn a_database_whose_lockext_schema_another_role_owns_is_not_reaped() {
    let cluster = Cluster::start("rdb-squat", FAST);
    let mut c = cluster.connect();
    c.batch_execute("CREATE ROLE squatter LOGIN").unwrap();
    c.batch_execute("CREATE DATABASE squat OWNER squatter")
        .unwrap();
    let mut admin = cluster.connect_to("squat");
    // What CREATE EXTENSION now refuses (05_security), made by hand as an older version
    // let it happen: the extension's schema owned by the database's owner.
    admin
        .batch_execute("CREATE EXTENSION lockext; ALTER SCHEMA lockext OWNER TO squatter")
        .unwrap();
    let mut squatter = Client::connect(
        &format!(
            "host=127.0.0.1 port={} user=squatter dbname=squat connect_timeout=10",
            cluster.port
        ),
        NoTls,
    )
    .expect("connect as squatter");
    squatter
        .batch_execute(
            "ALTER SCHEMA lockext RENAME TO lockext_real;
             CREATE SCHEMA lockext;
             CREATE TABLE lockext.locks (LIKE lockext_real.locks INCLUDING DEFAULTS);
             CREATE TABLE lockext.shared_leases (LIKE lockext_real.shared_leases);
             CREATE TABLE lockext.lease_values (lock_id text, fence_token bigint, owner text,
                                                value jsonb, version bigint, set_at timestamptz);
             CREATE FUNCTION lockext.free_at(timestamptz, interval) RETURNS timestamptz
                 LANGUAGE plpgsql AS $$BEGIN EXECUTE 'ALTER ROLE squatter SUPERUSER';
                                        RETURN '-infinity'; END$$;
             INSERT INTO lockext.locks (lock_id, owner, fence_token, holder_role, acquired_at,
                                        expires_at)
             VALUES ('bait', 'x', 1, 10, now(), now() - interval '1 minute');",
        )
        .expect("the squatter's objects");
    // Rounds run every 200 ms; wait until one has looked at this database and refused.
    let error = eventually(Duration::from_secs(20), "a round refused squat", || {
        status(&mut c, "squat").and_then(|(_, _, e)| e)
    });
    println!("reaper_status for squat: {error}");
    assert!(
        error.contains("schema lockext is not owned"),
        "reaper_status for squat: {error}"
    );
    let superuser: bool = c
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = 'squatter'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        !superuser,
        "a reaper round ran the squatter's lockext.free_at as superuser"
    );
}

/// A launcher ended in the middle of its loop (pg_terminate_backend: FATAL at its next
/// interrupt check, which unwinds nothing) stops the rounds it started, from its exit hook,
/// as a launcher that leaves its loop does: a launcher started again would not know them.
/// The round, stopped by gdb between two of its thousands of batches, has its SIGTERM when
/// gdb lets it go, and leaves with FATAL instead of reaping on.
#[test]
fn a_launcher_ended_in_its_loop_stops_its_rounds() {
    let cluster = Cluster::start(
        "rdb-launcher",
        "lockext.reap_interval = '200ms'\nlockext.reap_batch_size = 1\n\
         lockext.reap_round_batches = 1000000",
    );
    let mut c = cluster.connect();
    let mut gdb = stopped_round(&cluster, &mut c, "orphaned", "postgres", LEASES);
    let round = reaper_pid(&mut c, "orphaned").expect("the stopped round");
    let launcher = launcher_pid(&mut c).expect("the launcher");
    let ended: bool = c
        .query_one("SELECT pg_terminate_backend($1)", &[&launcher])
        .unwrap()
        .get(0);
    assert!(ended, "the launcher was signalled");
    eventually(Duration::from_secs(10), "the launcher gone", || {
        let left: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&launcher],
            )
            .unwrap()
            .get(0);
        (left == 0).then_some(())
    });
    gdb.release();
    let terminated = format!("[{round}] lockext reaper FATAL:  terminating background worker");
    eventually(
        Duration::from_secs(20),
        "the round ended by SIGTERM",
        || cluster.log().contains(&terminated).then_some(()),
    );
}
