//! Upgrades without an outage, as they happen: a server running 0.2.0's own library, with
//! live leases of every kind, fence marks and a waiter; its package replaced by this
//! build's while it runs (install(1), `packages.rs`); then
//! - with preload: every backend keeps 0.2.0's library until the restart, which ends the
//!   sessions (and the waiter); after it the database's SQL is still 0.2.0's, served by
//!   this library (`src/compat.rs`) until ALTER EXTENSION lockext UPDATE;
//! - without preload: sessions older than the package keep 0.2.0's library beside new ones
//!   that load this one at once, and the update meets a waiter that 0.2.0's library is
//!   running.
//!
//! 0.1.0's library cannot be built from this history (`packages.rs`): 0.1.0's SQL is
//! served by this library from rows written as 0.1.0 wrote them, as in 99_upgrade_window.
//!
//! The first run builds 0.2.0 from its release commit (minutes), once.

use std::thread;
use std::time::{Duration, Instant};

use lockext_cluster_tests::leases::{expect_sqlstate, sqlstate};
use lockext_cluster_tests::packages::{Package, Server};
use lockext_cluster_tests::*;

const CONF: &str = "lockext.database = 'postgres'\nlockext.reap_interval = '200ms'\n";

/// A cluster on a private copy of the server's installation, with 0.2.0's package
/// installed and started, `CREATE EXTENSION lockext` (0.2.0) done, and roles: `holder`
/// and `other` (lockext_user), `ops` (lockext_admin).
struct Setup {
    cluster: Cluster,
    server: Server,
    new: Package,
}

/// None on a server 0.2.0 was not released for (it built for PostgreSQL 15 only): the
/// test then says so and passes, and runs where `make cluster-test` runs on 15.
fn setup(name: &str, extra_conf: &str) -> Option<Setup> {
    let major = pg_major(PG_BIN.path());
    if major != 15 {
        println!("skipped on PostgreSQL {major}: 0.2.0 was released for PostgreSQL 15 only");
        return None;
    }
    let new = Package::installed();
    let old = Package::released_0_2_0();
    assert_ne!(new.version, old.version, "make install this build first");
    let cluster = Cluster::init_with_env(name, &format!("{CONF}{extra_conf}"), &[]);
    let server = Server::copy_with(&cluster.dir.join("server"), &old);
    cluster.pg_ctl_from(&server.bin, "start -w -t 60");
    cluster
        .connect()
        .batch_execute(
            "CREATE EXTENSION lockext;
             CREATE ROLE holder IN ROLE lockext_user;
             CREATE ROLE other IN ROLE lockext_user;
             CREATE ROLE ops IN ROLE lockext_admin;",
        )
        .expect("set up 0.2.0");
    assert_eq!(version(&mut cluster.connect()), "0.2.0");
    Some(Setup {
        cluster,
        server,
        new,
    })
}

fn version(c: &mut Client) -> String {
    c.query_one(
        "SELECT extversion FROM pg_extension WHERE extname = 'lockext'",
        &[],
    )
    .expect("extversion")
    .get(0)
}

/// A session acting as `role`.
fn session(cluster: &Cluster, role: &str) -> Client {
    let mut c = cluster.connect();
    c.batch_execute(&format!("SET ROLE {role}"))
        .expect("SET ROLE");
    c
}

fn acquire(
    c: &mut Client,
    lock: &str,
    owner: &str,
    extra: &str,
) -> Result<Option<i64>, postgres::Error> {
    c.query_one(
        &format!(
            "SELECT fence_token FROM lockext.lock_acquire('{lock}', '{owner}', '1 hour'{extra})"
        ),
        &[],
    )
    .map(|row| row.get(0))
}

fn renew(c: &mut Client, lock: &str, owner: &str, token: i64) -> Result<bool, postgres::Error> {
    c.query_one(
        "SELECT lockext.lock_renew($1, $2, '1 hour', $3) IS NOT NULL",
        &[&lock, &owner, &token],
    )
    .map(|row| row.get(0))
}

fn release(c: &mut Client, lock: &str, owner: &str, token: i64) -> Result<bool, postgres::Error> {
    c.query_one(
        "SELECT lockext.lock_release($1, $2, $3)",
        &[&lock, &owner, &token],
    )
    .map(|row| row.get(0))
}

fn fence(c: &mut Client, resource: &str, token: i64) -> Result<(), postgres::Error> {
    c.execute("SELECT lockext.fence($1, $2)", &[&resource, &token])
        .map(|_| ())
}

/// The hint of a refusal, which must name the command to run.
fn assert_refused_with_the_command(r: Result<Option<i64>, postgres::Error>, what: &str) {
    let e = r.expect_err(what);
    let db = e.as_db_error().unwrap_or_else(|| panic!("{what}: {e:?}"));
    assert_eq!(db.code().code(), "55000", "{what}: {db:?}");
    let hint = db.hint().unwrap_or_default();
    assert!(
        hint.contains("ALTER EXTENSION lockext UPDATE"),
        "{what}: the hint names the command: {hint}"
    );
}

/// What 0.2.0's library handed out: an exclusive lease, a shared lease and a permit held
/// by `holder`, a session-bound lease of `sb`'s session, and marks.
struct Held {
    exclusive: i64,
    shared: i64,
    permit: i64,
    session_bound: i64,
}

impl Held {
    fn highest(&self) -> i64 {
        self.exclusive
            .max(self.shared)
            .max(self.permit)
            .max(self.session_bound)
    }
}

fn take_with_0_2_0(holder: &mut Client, sb: &mut Client) -> Held {
    let held = Held {
        exclusive: acquire(holder, "ledger", "holder-1", "").unwrap().unwrap(),
        shared: acquire(holder, "catalog", "reader-1", ", mode => 'shared'")
            .unwrap()
            .unwrap(),
        permit: acquire(holder, "pool", "worker-1", ", permits => 2")
            .unwrap()
            .unwrap(),
        session_bound: acquire(sb, "ephemeral", "sb-1", ", session_bound => true")
            .unwrap()
            .unwrap(),
    };
    // 0.2.0's layout (an epoch over 43 bits): every token is above 2^55.
    assert!(
        held.exclusive > 1 << 55,
        "a 0.2.0 token: {}",
        held.exclusive
    );
    holder
        .query_one(
            "SELECT lockext.fenced_update('account', $1, '{\"v\": 1}')",
            &[&held.exclusive],
        )
        .expect("fenced_update at 0.2.0");
    fence(holder, "queue", held.exclusive).expect("fence at 0.2.0");
    held
}

/// A waiter for `lock` in a session of `role`, up to 60 s: its answer, or its error.
fn spawn_waiter(
    cluster: &Cluster,
    role: &str,
    lock: &str,
    owner: &str,
) -> thread::JoinHandle<Result<Option<i64>, postgres::Error>> {
    let mut c = session(cluster, role);
    let (lock, owner) = (lock.to_string(), owner.to_string());
    thread::spawn(move || acquire(&mut c, &lock, &owner, ", wait => '60 seconds'"))
}

/// Whether the session running `lock_acquire` for `owner` holds a lock on lockext.locks
/// (it looked at the leases: it is in its wait).
fn waiting_on_the_table(c: &mut Client, owner: &str) -> bool {
    c.query_one(
        "SELECT EXISTS (SELECT FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid \
                         WHERE a.state = 'active' AND a.query LIKE '%' || $1 || '%' \
                           AND a.pid <> pg_backend_pid() \
                           AND l.relation = 'lockext.locks'::regclass)",
        &[&owner],
    )
    .expect("pg_locks")
    .get(0)
}

fn leases_of(c: &mut Client, lock: &str) -> i64 {
    c.query_one(
        "SELECT (SELECT count(*) FROM lockext.locks WHERE lock_id = $1) \
              + (SELECT count(*) FROM lockext.shared_leases WHERE lock_id = $1)",
        &[&lock],
    )
    .expect("count leases")
    .get(0)
}

fn reaper_rounds(c: &mut Client) -> i64 {
    c.query_one(
        "SELECT coalesce(max(rounds), 0) FROM lockext.reaper_status() WHERE database = 'postgres'",
        &[],
    )
    .expect("reaper_status")
    .get(0)
}

/// 0.1.0 has exclusive leases only.
fn exclusive_leases_of(c: &mut Client, lock: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM lockext.locks WHERE lock_id = $1",
        &[&lock],
    )
    .expect("count leases")
    .get(0)
}

fn reaper_error(c: &mut Client) -> Option<String> {
    c.query_opt(
        "SELECT last_error FROM lockext.reaper_status() WHERE database = 'postgres' AND rounds > 0",
        &[],
    )
    .expect("reaper_status")
    .and_then(|row| row.get(0))
}

/// What every version's SQL must keep in the window and after the update: the holder's
/// leases renewable with their tokens, refused to another role, an administrator's
/// renew or release of them refused (window) or done (after), and the marks.
fn check_leases_and_marks(s: &Setup, held: &Held, window: bool) {
    let mut holder = session(&s.cluster, "holder");
    let mut other = session(&s.cluster, "other");
    let mut ops = session(&s.cluster, "ops");
    assert!(renew(&mut holder, "ledger", "holder-1", held.exclusive).unwrap());
    assert!(renew(&mut holder, "catalog", "reader-1", held.shared).unwrap());
    assert!(renew(&mut holder, "pool", "worker-1", held.permit).unwrap());
    assert!(!renew(&mut holder, "ledger", "holder-1", held.exclusive - 1).unwrap());
    assert!(!renew(&mut other, "ledger", "holder-1", held.exclusive).unwrap());
    assert!(!release(&mut other, "ledger", "holder-1", held.exclusive).unwrap());
    assert!(!release(&mut other, "catalog", "reader-1", held.shared).unwrap());
    if window {
        assert_refused_with_the_command(
            renew(&mut ops, "ledger", "holder-1", held.exclusive).map(|_| None),
            "an administrator's renew of another role's lease in the window",
        );
    } else {
        assert!(renew(&mut ops, "ledger", "holder-1", held.exclusive).unwrap());
    }
    assert_eq!(leases_of(&mut holder, "ledger"), 1);
    let live: bool = holder
        .query_one(
            "SELECT lockext.lock_check('ledger', $1)",
            &[&held.exclusive],
        )
        .unwrap()
        .get(0);
    assert!(live, "lock_check: the holder's grant is live");
    // The marks refuse older tokens, and take the holder's.
    expect_sqlstate(
        fence(&mut other, "account", held.exclusive - 1),
        "55L01",
        "an older token on account",
    );
    expect_sqlstate(
        fence(&mut other, "queue", held.exclusive - 1),
        "55L01",
        "an older token on queue",
    );
    let stored: bool = holder
        .query_one(
            "SELECT lockext.fenced_update('account', $1, '{\"v\": 2}')",
            &[&held.exclusive],
        )
        .unwrap()
        .get(0);
    assert!(stored, "the holder's token writes");
    let stale: bool = other
        .query_one(
            "SELECT lockext.fenced_update('account', $1, '{\"v\": 0}')",
            &[&(held.exclusive - 1)],
        )
        .unwrap()
        .get(0);
    assert!(!stale, "an older token does not");
}

#[test]
fn preloaded_0_2_0_restarted_onto_this_library_then_updated() {
    // 0.2.0's reaper reaps nowhere: the lease that expires below is left for this one.
    let Some(s) = setup("upgrade-preloaded", "lockext.database = 'nowhere'\n") else {
        return;
    };
    let mut holder = session(&s.cluster, "holder");
    let mut sb = session(&s.cluster, "holder");
    let held = take_with_0_2_0(&mut holder, &mut sb);
    holder
        .execute(
            "SELECT lockext.lock_acquire('short', 'holder-8', '1 second')",
            &[],
        )
        .expect("a short lease at 0.2.0");
    let waiter = spawn_waiter(&s.cluster, "other", "ledger", "waiter-1");
    let mut su = s.cluster.connect();
    eventually(Duration::from_secs(10), "the waiter is queued", || {
        let n: i64 = su
            .query_one(
                "SELECT count(*) FROM lockext.waiters WHERE lock_id = 'ledger'",
                &[],
            )
            .unwrap()
            .get(0);
        (n == 1).then_some(())
    });

    // The package is replaced under the running server.
    s.server.install(&s.new);
    // Every backend forks from the postmaster, which preloaded 0.2.0's library: a new
    // session still runs 0.2.0 (it grants), and an update before the restart fails as a
    // whole, on the first function of 0.3.0 that 0.2.0's library lacks.
    let mut fresh = session(&s.cluster, "holder");
    let before_restart = acquire(&mut fresh, "before-restart", "holder-9", "").unwrap();
    assert!(before_restart.is_some(), "0.2.0's library still grants");
    let e = su
        .batch_execute("ALTER EXTENSION lockext UPDATE")
        .unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("42883"), "{e:?}");
    assert!(
        format!("{e:?}").contains("could not find function"),
        "{e:?}"
    );
    assert_eq!(version(&mut su), "0.2.0", "nothing changed");
    su.batch_execute("ALTER SYSTEM SET lockext.database = 'postgres'")
        .expect("reap postgres from the restart on");
    drop((holder, sb, fresh, su));

    // The restart: the new library everywhere. The waiter's session ends with it.
    s.cluster
        .pg_ctl_from(&s.server.bin, "restart -m fast -w -t 60");
    match waiter.join().expect("waiter thread") {
        Ok(answer) => panic!("the waiter outlived the restart: {answer:?}"),
        Err(e) => assert!(
            e.is_closed() || sqlstate(&e).as_deref() == Some("57P01"),
            "the waiter's session ended with the server's: {e:?}"
        ),
    }

    // The window: 0.2.0's SQL, this library.
    let mut su = s.cluster.connect();
    assert_eq!(version(&mut su), "0.2.0");
    let mut other = session(&s.cluster, "other");
    assert_refused_with_the_command(
        acquire(&mut other, "fresh", "other-1", ""),
        "a grant in the window",
    );
    let asked = Instant::now();
    assert_refused_with_the_command(
        acquire(&mut other, "ledger", "waiter-2", ", wait => '30 seconds'"),
        "a wait in the window",
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "refused at once, not after the wait"
    );
    check_leases_and_marks(&s, &held, true);
    let waits = eventually(Duration::from_secs(10), "the reaper says it waits", || {
        reaper_error(&mut su).filter(|e| e.contains("ALTER EXTENSION lockext UPDATE"))
    });
    println!("window: the reaper of postgres: {waits}");
    // The session-bound lease ended with its session, at the restart (0.2.0's exit hook).
    assert_eq!(leases_of(&mut su, "ephemeral"), 0, "ended with its session");
    // Two rounds after the short lease has expired, it is still there: the reaper waits.
    eventually(Duration::from_secs(10), "the short lease expires", || {
        let live: bool = su
            .query_one(
                "SELECT lockext.lock_check('short', fence_token) FROM lockext.locks \
                  WHERE lock_id = 'short'",
                &[],
            )
            .unwrap()
            .get(0);
        (!live).then_some(())
    });
    let rounds = reaper_rounds(&mut su);
    eventually(Duration::from_secs(10), "two more rounds", || {
        (reaper_rounds(&mut su) >= rounds + 2).then_some(())
    });
    assert_eq!(
        leases_of(&mut su, "short"),
        1,
        "the reaper touches nothing meanwhile"
    );

    // The update, then every lease, mark and waiter as the current version serves them.
    su.batch_execute("SET lock_timeout = '10s'; ALTER EXTENSION lockext UPDATE")
        .expect("the update");
    assert_eq!(version(&mut su), Package::installed().version);
    check_leases_and_marks(&s, &held, false);
    let mut other = session(&s.cluster, "other");
    assert_eq!(
        acquire(&mut other, "ledger", "other-1", "").unwrap(),
        None,
        "still held"
    );
    // The reaper is back, and clears the expired lease.
    eventually(
        Duration::from_secs(10),
        "the reaper clears the expired lease",
        || (leases_of(&mut su, "short") == 0 && reaper_error(&mut su).is_none()).then_some(()),
    );
    // A waiter is served by the queue again, with a token above every 0.2.0 one.
    let waiter = spawn_waiter(&s.cluster, "other", "ledger", "waiter-3");
    eventually(Duration::from_secs(10), "the new waiter is queued", || {
        let n: i64 = su
            .query_one(
                "SELECT count(*) FROM lockext.waiters WHERE lock_id = 'ledger'",
                &[],
            )
            .unwrap()
            .get(0);
        (n == 1).then_some(())
    });
    let mut holder = session(&s.cluster, "holder");
    assert!(release(&mut holder, "ledger", "holder-1", held.exclusive).unwrap());
    let next = waiter
        .join()
        .expect("waiter thread")
        .expect("lock_acquire after the update")
        .expect("the waiter gets the lock");
    let highest = held.highest().max(before_restart.unwrap_or(0));
    assert!(
        next > highest,
        "token {next} after the update, {highest} before"
    );
    assert!(release(&mut holder, "catalog", "reader-1", held.shared).unwrap());
    assert!(release(&mut holder, "pool", "worker-1", held.permit).unwrap());
    println!(
        "preloaded: 0.2.0 tokens up to {highest}; the first grant after the update {next}; \
         leases kept, renewed and released by their holder across restart and update"
    );
}

#[test]
fn not_preloaded_0_2_0_old_sessions_beside_new_ones_and_an_update_behind_a_waiter() {
    let Some(s) = setup("upgrade-not-preloaded", "shared_preload_libraries = ''\n") else {
        return;
    };
    // Sessions that load 0.2.0's library before the package changes, and keep it.
    let mut old_holder = session(&s.cluster, "holder");
    let mut old_sb = session(&s.cluster, "holder");
    let held = take_with_0_2_0(&mut old_holder, &mut old_sb);
    let waiter = spawn_waiter(&s.cluster, "other", "ledger", "waiter-1");
    let mut su = s.cluster.connect();
    eventually(Duration::from_secs(10), "the waiter polls", || {
        waiting_on_the_table(&mut su, "waiter-1").then_some(())
    });

    s.server.install(&s.new);
    // A new session loads the new library at once: the window begins for it.
    let mut new_holder = session(&s.cluster, "holder");
    assert_refused_with_the_command(
        acquire(&mut new_holder, "fresh", "holder-2", ""),
        "a grant in a new session",
    );
    check_leases_and_marks(&s, &held, true);
    // An old session still runs 0.2.0 on 0.2.0's tables, and grants; this library's
    // fencing knows its tokens.
    let old_grant = acquire(&mut old_holder, "old-session", "holder-3", "")
        .unwrap()
        .expect("0.2.0's library grants in an old session");
    fence(&mut new_holder, "old-resource", old_grant).expect("a token of an old session fences");

    // The update waits for the waiter's transaction (it keeps lockext.locks open) and
    // everything queued behind it would wait too: with a lock_timeout it gives up, whole.
    let e = su
        .batch_execute("SET lock_timeout = '1s'; ALTER EXTENSION lockext UPDATE")
        .unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("55P03"), "{e:?}");
    assert_eq!(version(&mut su), "0.2.0", "nothing changed");
    assert!(
        waiting_on_the_table(&mut su, "waiter-1"),
        "the waiter still waits"
    );

    // The holder releases (through this library, in a new session): the waiter, still
    // running 0.2.0, takes the lock with a 0.2.0 token.
    assert!(release(&mut new_holder, "ledger", "holder-1", held.exclusive).unwrap());
    let waited = waiter
        .join()
        .expect("waiter thread")
        .expect("the waiter's lock_acquire")
        .expect("the waiter gets the lock");
    assert!(waited > held.highest(), "the waiter's token {waited}");
    su.batch_execute("SET lock_timeout = '10s'; ALTER EXTENSION lockext UPDATE")
        .expect("the update, once no transaction holds the tables");
    assert_eq!(version(&mut su), Package::installed().version);

    // An old session cannot run 0.2.0's code on 0.3.0's tables: its library lacks the
    // symbols the updated functions call. It must reconnect.
    expect_sqlstate(
        acquire(&mut old_holder, "old-session-2", "holder-4", ""),
        "42883",
        "an old session's call after the update",
    );
    // The waiter's lease, taken by 0.2.0 in the window, is its own after the update.
    let mut other = session(&s.cluster, "other");
    assert!(renew(&mut other, "ledger", "waiter-1", waited).unwrap());
    let mut holder = session(&s.cluster, "holder");
    assert!(
        !renew(&mut holder, "ledger", "waiter-1", waited).unwrap(),
        "not another role's"
    );
    assert!(renew(&mut holder, "old-session", "holder-3", old_grant).unwrap());
    expect_sqlstate(
        fence(&mut holder, "account", held.exclusive - 1),
        "55L01",
        "the mark after the update",
    );
    // Without preload there is no token ledger: no grant, with the setting in the hint.
    expect_sqlstate(
        acquire(&mut holder, "after", "holder-5", ""),
        "55000",
        "a grant without preload",
    );
    assert!(release(&mut other, "ledger", "waiter-1", waited).unwrap());
    drop((holder, other, old_holder, old_sb, new_holder));
    su.batch_execute("ALTER SYSTEM SET shared_preload_libraries = 'lockext'")
        .expect("preload lockext");
    drop(su);
    s.cluster
        .pg_ctl_from(&s.server.bin, "restart -m fast -w -t 60");
    let mut holder = session(&s.cluster, "holder");
    let next = acquire(&mut holder, "after", "holder-5", "")
        .unwrap()
        .expect("a grant once preloaded");
    assert!(
        next > waited.max(old_grant),
        "token {next} after the update and the restart"
    );
    println!(
        "not preloaded: 0.2.0 tokens up to {} (the waiter's, in the window); the first grant after the update {next}",
        waited.max(old_grant)
    );
}

#[test]
fn sql_0_1_0_served_by_this_library_then_updated() {
    // This library from the start: 0.1.0's SQL, with rows as 0.1.0 wrote them.
    let cluster = Cluster::start("upgrade-0-1-0", CONF);
    let mut su = cluster.connect();
    su.batch_execute(
        "DROP EXTENSION lockext;
         CREATE EXTENSION lockext VERSION '0.1.0';
         CREATE ROLE holder IN ROLE lockext_user;
         CREATE ROLE other IN ROLE lockext_user;
         INSERT INTO lockext.token_epoch
         SELECT true, 4096, system_identifier, timeline_id,
                (SELECT oid FROM pg_database WHERE datname = current_database()), 0, now()
           FROM pg_control_system(), pg_control_checkpoint();
         SELECT setval('lockext.fence_token_seq', 41);
         INSERT INTO lockext.locks VALUES
             ('ledger', 'holder-1', (4096::bigint << 43) | 41, 'holder'::regrole, now(), now() + interval '1 hour'),
             ('expired', 'holder-0', (4096::bigint << 43) | 40, 'holder'::regrole, now() - interval '2 hours', now() - interval '1 hour');
         INSERT INTO lockext.resources VALUES ('account', (4096::bigint << 43) | 41, '{\"v\": 1}', now());",
    )
    .expect("0.1.0 as 0.1.0 left it");
    let token = (4096_i64 << 43) | 41;
    let mut holder = session(&cluster, "holder");
    let mut other = session(&cluster, "other");
    assert_refused_with_the_command(
        acquire(&mut other, "ledger", "other-1", ""),
        "a grant at 0.1.0",
    );
    assert_refused_with_the_command(
        acquire(&mut other, "expired", "other-1", ""),
        "a take-over at 0.1.0",
    );
    assert!(renew(&mut holder, "ledger", "holder-1", token).unwrap());
    assert!(!renew(&mut other, "ledger", "holder-1", token).unwrap());
    expect_sqlstate(
        fence(&mut other, "account", token - 1),
        "55L01",
        "the mark at 0.1.0",
    );
    let waits = eventually(Duration::from_secs(10), "the reaper says it waits", || {
        reaper_error(&mut su).filter(|e| e.contains("0.1.0"))
    });
    println!("0.1.0: the reaper of postgres: {waits}");
    assert_eq!(
        exclusive_leases_of(&mut su, "expired"),
        1,
        "the reaper waits for the update"
    );

    su.batch_execute("SET lock_timeout = '10s'; ALTER EXTENSION lockext UPDATE")
        .expect("0.1.0 to the current version");
    assert_eq!(version(&mut su), Package::installed().version);
    eventually(
        Duration::from_secs(10),
        "the reaper clears the expired lease",
        || (exclusive_leases_of(&mut su, "expired") == 0).then_some(()),
    );
    assert!(renew(&mut holder, "ledger", "holder-1", token).unwrap());
    assert!(!release(&mut other, "ledger", "holder-1", token).unwrap());
    expect_sqlstate(
        fence(&mut other, "account", token - 1),
        "55L01",
        "the mark after the update",
    );
    // A waiter after the update is served when the 0.1.0 lease is released.
    let waiter = spawn_waiter(&cluster, "other", "ledger", "waiter-1");
    eventually(Duration::from_secs(10), "the waiter is queued", || {
        let n: i64 = su
            .query_one(
                "SELECT count(*) FROM lockext.waiters WHERE lock_id = 'ledger'",
                &[],
            )
            .unwrap()
            .get(0);
        (n == 1).then_some(())
    });
    assert!(release(&mut holder, "ledger", "holder-1", token).unwrap());
    let next = waiter
        .join()
        .unwrap()
        .unwrap()
        .expect("the waiter gets the lock");
    assert!(
        next > token,
        "token {next} after the update, {token} at 0.1.0"
    );
}

/// The third review's findings 2 and 3 on 0.3.0, both in the window between installing
/// this library and `ALTER EXTENSION UPDATE` and after it:
/// - a reinstall right after the new library is loaded (`DROP EXTENSION lockext CASCADE;
///   CREATE EXTENSION lockext`) took the 0.2.0 tables with it, and 0.3.0's next grant was
///   token 1: below every token 0.2.0 handed out;
/// - a `pg_dump` of the 0.2.0 database restored into a new database failed on the epoch
///   row's `boot` column (its error ignored, exit status 0), and the next grant was below
///   the restored row's token.
///
/// The reaper adopts every database's evidence within a round of the restart (whatever its
/// SQL version), before the reinstall can take it away; the epoch row keeps `boot`.
#[test]
fn a_reinstall_in_the_window_and_a_0_2_0_dump_restored_later_stay_above_0_2_0s_tokens() {
    use lockext_cluster_tests::checks::Checks;
    use lockext_cluster_tests::crash::{createdb, pg_dump, pg_restore};
    let mut checks = Checks::new("0.2.0's tokens after a reinstall and a restore");
    let Some(s) = setup("upgrade-ledger", "") else {
        return;
    };
    let mut holder = session(&s.cluster, "holder");
    let mut sb = session(&s.cluster, "holder");
    let held = take_with_0_2_0(&mut holder, &mut sb);
    let old = held.highest();
    drop((holder, sb));
    let dump = s.cluster.dir.join("v020.dump");
    pg_dump(&s.cluster, "postgres", &dump);

    s.server.install(&s.new);
    s.cluster
        .pg_ctl_from(&s.server.bin, "restart -m fast -w -t 60");
    let mut su = s.cluster.connect();
    assert_eq!(version(&mut su), "0.2.0", "the window");
    // The reaper's first round adopts what the 0.2.0 tables say: the ledger turns Wide.
    eventually(
        Duration::from_secs(30),
        "the ledger adopts 0.2.0's layout",
        || {
            let text: String = su
                .query_one(
                    "SELECT coalesce(pg_read_file('pg_lockext/ledger', 0, 200, true), '')",
                    &[],
                )
                .ok()?
                .get(0);
            text.contains("layout 1").then_some(())
        },
    );

    // Finding 2: the reinstall in the window.
    su.batch_execute("DROP EXTENSION lockext CASCADE")
        .expect("drop in the window");
    su.batch_execute("CREATE EXTENSION lockext; GRANT lockext_user TO holder")
        .expect("create again");
    let mut holder = session(&s.cluster, "holder");
    let fresh = acquire(&mut holder, "after-reinstall", "h", "")
        .expect("a grant after the reinstall")
        .expect("granted");
    checks.check(
        fresh > old,
        format!("after the reinstall: token {fresh} > 0.2.0's highest {old}"),
    );

    // Finding 3: the 0.2.0 dump restored into a new database, as a whole (exit on error).
    createdb(&s.cluster, "restored");
    pg_restore(&s.cluster, "restored", &dump, "");
    let mut r = s.cluster.connect_to("restored");
    let row: Option<i64> = r
        .query_one(
            "SELECT (SELECT epoch::bigint FROM lockext.token_epoch)",
            &[],
        )
        .expect("the epoch row")
        .get(0);
    checks.check(
        row.is_some(),
        format!("the 0.2.0 epoch row was restored (epoch {row:?})"),
    );
    let after: i64 = r
        .query_one(
            "SELECT fence_token FROM lockext.lock_acquire('after-restore', 'r', '1 minute')",
            &[],
        )
        .expect("a grant in the restored database")
        .get(0);
    checks.check(
        after > old && after > fresh,
        format!("in the restored database: token {after} > {old} and > {fresh}"),
    );
    let accepted: bool = r
        .query_one(
            "SELECT lockext.fenced_update('account', $1, '{\"v\": 2}')",
            &[&after],
        )
        .map(|row| row.get(0))
        .unwrap_or(false);
    checks.check(
        accepted,
        "the restored resource takes the new holder's write".to_string(),
    );
    checks.finish();
}
