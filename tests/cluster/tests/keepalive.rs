//! Keep-alives with real sessions, processes and the reaper: one renewal keeps many leases,
//! and when the keep-alive ends every attached lease ends with it.
//!
//! - `ten_thousand_attached_locks_free_at_once_when_the_killed_workers_keepalive_expires`:
//!   a worker process attaches 10 000 locks to a keep-alive of 2 s and renews it past its
//!   first expiry while another role is refused every lock it tries; the worker is killed
//!   with SIGKILL, and once the keep-alive's expiry passes every one of the 10 000 locks is
//!   granted to another owner at the first try, each with a higher token, in a database no
//!   reaper serves (so no reaper round helped); the grants ended the keep-alive; the old
//!   holder's fenced writes on a resource bound to one of the locks are refused.
//! - `reaper_expires_every_attached_lease_then_deletes_the_keepalive`: the reaper ends an
//!   expired keep-alive with 10 000 leases, sends one 'expired' event per lease with its
//!   token, deletes the leases, and only then the keep-alive's row.
//! - `revoke_releases_every_attached_lease_with_events_and_wakes_waiters`: revoking a
//!   keep-alive with 1 000 leases returns 1 000, sends 1 000 'released' events with their
//!   tokens, and the sessions waiting in lock_acquire(wait => ...) for four of the locks
//!   are woken and granted at once (well under the waiters' 500 ms safety-net nap).
//! - `two_workers_keepalives_are_independent`: two workers of one role, each with a
//!   keep-alive and locks of its own: one's renewals never move the other's expiry,
//!   lockext.holders shows each lease with its own keep-alive's expiry, and the one that
//!   stops renewing loses its locks while the other keeps its.
//! - Both orders of a renewal and a conflicting grant, forced (no sleep decides them), in a
//!   database no reaper serves:
//!   `renewal_held_open_across_the_expiry_refuses_a_conflicting_grant`: a renewal held
//!   open in a transaction across the keep-alive's previous expiry makes a conflicting
//!   grant refused at once, and the lock stays the holder's once it commits;
//!   `takeover_held_open_refuses_the_renewal_and_ends_the_keepalive`: a take-over held open
//!   makes the renewal answer NULL at once, and NULL after the commit (the take-over ended
//!   the keep-alive), and the holder's other leases stay dead;
//!   `renewal_paused_before_the_expiry_and_resumed_after_a_takeover_renews_nothing`: a
//!   renewal stopped by gdb after it read the clock (before the expiry), resumed after a
//!   take-over committed, answers NULL and revives none of the holder's other leases.
//!
//! Run with `--test-threads=1 --nocapture` to see the measured numbers.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;

use lockext_cluster_tests::gdb::Gdb;
use lockext_cluster_tests::leases::{expect_sqlstate, ms};
use lockext_cluster_tests::race::{race_cluster, DB};
use lockext_cluster_tests::*;

/// At most this many leases are taken in one transaction: under `max_locks_per_transaction
/// / 2` (32 by default), the claims budget of one transaction.
const CHUNK: usize = 30;

/// The worker role, whose keep-alives these are, and the role of the other owners.
const ROLES: &str = "CREATE ROLE app LOGIN IN ROLE lockext_user;
                     CREATE ROLE other LOGIN IN ROLE lockext_user;";

/// `lock_keepalive_grant(ttl)`: (id, expiry in µs since the epoch).
fn grant(c: &mut Client, ttl: &str) -> (i64, i64) {
    let row = c
        .query_one(
            "SELECT keepalive, (extract(epoch FROM expires_at) * 1000000)::bigint \
               FROM lockext.lock_keepalive_grant($1::text::interval)",
            &[&ttl],
        )
        .expect("lock_keepalive_grant");
    (row.get(0), row.get(1))
}

/// `lock_keepalive_renew(k, ttl)`: the new expiry (µs), or None when refused.
fn renew(c: &mut Client, k: i64, ttl: Option<&str>) -> Option<i64> {
    c.query_one(
        "SELECT (extract(epoch FROM lockext.lock_keepalive_renew($1, $2::text::interval)) * 1000000)::bigint",
        &[&k, &ttl],
    )
    .expect("lock_keepalive_renew")
    .get(0)
}

/// The lock ids `prefix-1` .. `prefix-n`.
fn ids(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}-{i}")).collect()
}

/// `lock_acquire_all(ids, owner, ttl, keepalive => k)` in chunks of CHUNK ids, one
/// autocommit statement each; the token of every grant. Panics if any chunk is refused.
fn acquire_chunks(
    c: &mut Client,
    ids: &[String],
    owner: &str,
    ttl: Option<&str>,
    keepalive: Option<i64>,
) -> HashMap<String, i64> {
    let mut tokens = HashMap::new();
    for chunk in ids.chunks(CHUNK) {
        let rows = c
            .query(
                "SELECT lock_id, fence_token FROM lockext.lock_acquire_all($1, $2, \
                   $3::text::interval, keepalive => $4)",
                &[&chunk, &owner, &ttl, &keepalive],
            )
            .expect("lock_acquire_all");
        assert_eq!(
            rows.len(),
            chunk.len(),
            "{owner}: a chunk from {} was refused",
            chunk[0]
        );
        for r in rows {
            tokens.insert(r.get(0), r.get(1));
        }
    }
    tokens
}

/// `lock_acquire(lock, owner, ttl)`: the token, or None when refused.
fn acquire(c: &mut Client, lock: &str, owner: &str, ttl: &str) -> Option<i64> {
    c.query_one(
        "SELECT fence_token FROM lockext.lock_acquire($1, $2, $3::text::interval)",
        &[&lock, &owner, &ttl],
    )
    .expect("lock_acquire")
    .get(0)
}

fn lock_check(c: &mut Client, lock: &str, token: i64) -> bool {
    c.query_one("SELECT lockext.lock_check($1, $2)", &[&lock, &token])
        .expect("lock_check")
        .get(0)
}

/// (expiry µs, ended, renewals, leases) of a keep-alive, from lockext.keepalive_holders;
/// None once its row is gone.
fn keepalive_row(c: &mut Client, k: i64) -> Option<(i64, bool, i64, i64)> {
    c.query_opt(
        "SELECT (extract(epoch FROM expires_at) * 1000000)::bigint, ended, renewals, leases \
           FROM lockext.keepalive_holders WHERE keepalive = $1",
        &[&k],
    )
    .expect("lockext.keepalive_holders")
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
}

/// The committed expiry (µs) of a keep-alive.
fn expiry(c: &mut Client, k: i64) -> i64 {
    keepalive_row(c, k).expect("the keep-alive's row").0
}

/// Waits (polling the server's clock every 5 ms) until the server's clock is past `at` (µs).
fn until_server_clock_passes(c: &mut Client, at: i64) {
    eventually(Duration::from_secs(30), "the server's clock passes", || {
        let past: bool = c
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint > $1",
                &[&at],
            )
            .expect("clock_timestamp")
            .get(0);
        if !past {
            thread::sleep(ms(5));
        }
        past.then_some(())
    });
}

/// The server's clock (µs).
fn server_clock(c: &mut Client) -> i64 {
    c.query_one(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
        &[],
    )
    .expect("clock_timestamp")
    .get(0)
}

/// Live leases attached to `k` that lockext.holders shows: (lock id, owner, token, expiry µs).
fn holders_of(c: &mut Client, k: i64) -> Vec<(String, String, i64, i64)> {
    c.query(
        "SELECT lock_id, owner, fence_token, (extract(epoch FROM expires_at) * 1000000)::bigint \
           FROM lockext.holders WHERE keepalive = $1 ORDER BY lock_id",
        &[&k],
    )
    .expect("lockext.holders")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

/// One lockext event: (event, lock id, token).
type Event = (String, String, i64);

/// The value of `"key" : value` in a lockext event's JSON (json_build_object's spacing).
fn json_field(payload: &str, key: &str) -> Option<String> {
    let start = payload.find(&format!("\"{key}\" : "))? + key.len() + 5;
    let rest = &payload[start..];
    let end = rest.find([',', '}'])?;
    Some(rest[..end].trim().trim_matches('"').to_string())
}

/// Reads events from `listener` until `done` says enough arrived, or `within` passed.
fn collect_events(
    listener: &mut Client,
    within: Duration,
    done: impl Fn(&[Event]) -> bool,
) -> Vec<Event> {
    let deadline = Instant::now() + within;
    let mut events = Vec::new();
    while !done(&events) && Instant::now() < deadline {
        let mut notes = listener.notifications();
        let mut it = notes.timeout_iter(ms(200));
        while let Ok(Some(n)) = it.next() {
            assert_eq!(n.channel(), "lockext");
            let p = n.payload();
            let parsed = (
                json_field(p, "event"),
                json_field(p, "lock_id"),
                json_field(p, "fence_token").and_then(|t| t.parse().ok()),
            );
            match parsed {
                (Some(e), Some(l), Some(t)) => events.push((e, l, t)),
                _ => panic!("an event without event, lock_id or fence_token: {p}"),
            }
        }
    }
    events
}

/// Asserts that `got` (lock id to token, from events) is `want`, naming a few of the
/// differences rather than printing thousands of entries.
fn assert_same_tokens(what: &str, got: &HashMap<String, i64>, want: &HashMap<String, i64>) {
    let missing: Vec<&String> = want.keys().filter(|l| !got.contains_key(*l)).collect();
    let wrong: Vec<(&String, i64, Option<&i64>)> = got
        .iter()
        .filter(|(l, t)| want.get(*l) != Some(*t))
        .map(|(l, t)| (l, *t, want.get(l)))
        .collect();
    assert!(
        missing.is_empty() && wrong.is_empty(),
        "{what}: {} of {} leases without one (e.g. {:?}); {} with another token or lock \
         (e.g. {:?})",
        missing.len(),
        want.len(),
        &missing[..missing.len().min(5)],
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
}

/// A psql client process as role `app`, fed `script` on its stdin, which is kept open so
/// that it stays connected (and takes more commands) until killed.
fn psql(cluster: &Cluster, db: &str, script: &str) -> (Child, ChildStdin) {
    let mut child = Command::new(format!("{PG_BIN}/psql"))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", cluster.port.to_string())
        .env("PGUSER", "app")
        .env("PGDATABASE", db)
        .env("PGAPPNAME", "keepalive-worker")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn psql");
    let mut stdin = child.stdin.take().expect("psql stdin");
    stdin.write_all(script.as_bytes()).expect("write to psql");
    stdin.flush().expect("flush psql stdin");
    (child, stdin)
}

// ---------------------------------------------------------------------------------------
// 1. Expiry of a keep-alive with many locks, its worker killed
// ---------------------------------------------------------------------------------------

#[test]
fn ten_thousand_attached_locks_free_at_once_when_the_killed_workers_keepalive_expires() {
    const N: usize = 10_000;
    // Database `race`: no reaper serves it, so whatever is free after the expiry was freed
    // by the grants themselves, not by a reaper round.
    let cluster = race_cluster("ka-expiry", &["lockext"]);
    let mut admin = cluster.connect_to(DB);
    admin.batch_execute(ROLES).expect("roles");
    let all = ids("ka", N);

    // The worker: a keep-alive of 2 s, 10 000 locks in chunks of 30, renewing as it goes.
    let mut script = String::from(
        "SELECT keepalive AS k FROM lockext.lock_keepalive_grant('2 seconds') \\gset\n",
    );
    for (i, chunk) in all.chunks(CHUNK).enumerate() {
        script.push_str(&format!(
            "SELECT count(*) FROM lockext.lock_acquire_all(ARRAY(SELECT 'ka-' || g FROM \
               generate_series({}, {}) g), 'worker', NULL, keepalive => :k);\n",
            i * CHUNK + 1,
            i * CHUNK + chunk.len()
        ));
        if i % 10 == 9 {
            script.push_str("SELECT lockext.lock_keepalive_renew(:k);\n");
        }
    }
    let started = Instant::now();
    let (mut worker, mut worker_in) = psql(&cluster, DB, &script);
    let k: i64 = eventually(
        Duration::from_secs(60),
        "the worker attached 10 000 locks",
        || {
            let row = admin
                .query_opt(
                    "SELECT keepalive, leases FROM lockext.keepalive_holders WHERE role = 'app'::regrole",
                    &[],
                )
                .expect("keepalive_holders")?;
            (row.get::<_, i64>(1) == N as i64).then(|| row.get(0))
        },
    );
    println!(
        "worker attached {N} locks to keep-alive {k} in {:?}",
        started.elapsed()
    );
    let old: HashMap<String, i64> = admin
        .query(
            "SELECT lock_id, fence_token FROM lockext.locks WHERE keepalive = $1",
            &[&k],
        )
        .expect("the attached leases")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(old.len(), N);
    let first_expiry = expiry(&mut admin, k);
    admin
        .batch_execute("SELECT lockext.bind_resource('ka-res', 'ka-1')")
        .expect("bind a resource to ka-1");
    // The old holder's fenced writes come from this session of its role (a twin that
    // outlives the killed worker: a paused process that wakes up after the expiry).
    let mut zombie = cluster.connect_as("app", DB);
    let fenced = |c: &mut Client, token: i64, by: &str| -> bool {
        c.query_one(
            "SELECT lockext.fenced_update('ka-res', $1, jsonb_build_object('by', $2::text))",
            &[&token, &by],
        )
        .expect("fenced_update")
        .get(0)
    };
    assert!(
        fenced(&mut zombie, old["ka-1"], "worker"),
        "a live holder writes"
    );

    // The worker renews a few times, past the keep-alive's first expiry; meanwhile another
    // role is refused every lock it tries, and every lease is shown live.
    let mut other = cluster.connect_as("other", DB);
    let mut renewals = 0;
    let mut step = 0usize;
    loop {
        let before = keepalive_row(&mut admin, k).expect("keep-alive").2;
        worker_in
            .write_all(b"SELECT lockext.lock_keepalive_renew(:k);\n")
            .expect("ask the worker to renew");
        worker_in.flush().unwrap();
        eventually(Duration::from_secs(5), "the worker's renewal", || {
            (keepalive_row(&mut admin, k).expect("keep-alive").2 > before).then_some(())
        });
        renewals += 1;
        for j in 0..50 {
            let lock = &all[(step * 50 + j) * 97 % N];
            assert_eq!(
                acquire(&mut other, lock, "other", "1 minute"),
                None,
                "{lock} granted to another owner while the worker renews"
            );
        }
        step += 1;
        let live: i64 = admin
            .query_one(
                "SELECT count(*) FROM lockext.holders WHERE keepalive = $1 AND owner = 'worker'",
                &[&k],
            )
            .unwrap()
            .get(0);
        assert_eq!(live, N as i64, "every attached lease is live");
        if renewals >= 3 && server_clock(&mut admin) > first_expiry + 500_000 {
            break;
        }
        thread::sleep(ms(400));
    }
    println!("{renewals} renewals carried all {N} leases 0.5 s past the keep-alive's first expiry");

    // The worker dies; nobody renews any more.
    worker.kill().expect("kill -9 the worker");
    worker.wait().unwrap();
    let last_expiry = expiry(&mut admin, k);
    assert!(last_expiry > first_expiry);
    assert!(
        server_clock(&mut admin) < last_expiry,
        "the keep-alive is still live when its worker dies"
    );
    for lock in ["ka-1", "ka-5000", "ka-10000"] {
        assert_eq!(acquire(&mut other, lock, "other", "1 minute"), None);
    }

    until_server_clock_passes(&mut admin, last_expiry);
    let expired_at = Instant::now();
    let first = acquire(&mut other, "ka-5000", "other", "1 minute")
        .expect("the first lock is free once the keep-alive expired");
    let first_after = expired_at.elapsed();
    assert!(first > old["ka-5000"]);
    // Free, but not taken yet: the old holder's write is already refused.
    assert!(
        !fenced(&mut zombie, old["ka-1"], "worker"),
        "a write of the expired holder passed"
    );
    // A sample, one by one, then all of them, each at the first try.
    let mut new = HashMap::new();
    new.insert("ka-5000".to_string(), first);
    for j in 0..100 {
        let lock = &all[(j * 7919 + 13) % N];
        if let Some(t) = acquire(&mut other, lock, "other", "1 minute") {
            new.insert(lock.clone(), t);
        } else {
            panic!("{lock} refused after the keep-alive expired");
        }
    }
    let sampled_after = expired_at.elapsed();
    new.extend(acquire_chunks(
        &mut other,
        &all,
        "other",
        Some("1 minute"),
        None,
    ));
    let all_after = expired_at.elapsed();
    assert_eq!(new.len(), N);
    for (lock, t) in &new {
        assert!(
            *t > old[lock],
            "{lock}: new token {t} not above the old {}",
            old[lock]
        );
    }
    println!(
        "after the expiry: first lock granted in {first_after:?}, 100 more by {sampled_after:?}, \
         all {N} by {all_after:?}, none refused, no reaper"
    );
    assert_eq!(reaper_pid(&mut admin, DB), None, "no reaper served {DB}");
    // The first take-over ended the keep-alive: never renewed again, no lease left on it.
    let (_, ended, _, leases) = keepalive_row(&mut admin, k).expect("the keep-alive's row");
    assert!(ended, "the take-overs did not end the keep-alive");
    assert_eq!(leases, 0);
    assert_eq!(renew(&mut zombie, k, Some("1 minute")), None);
    assert!(holders_of(&mut admin, k).is_empty());

    // The new holder writes; the old holder's write stays refused.
    assert!(fenced(&mut other, new["ka-1"], "other"));
    assert!(!fenced(&mut zombie, old["ka-1"], "worker"));
    let by: String = admin
        .query_one(
            "SELECT data->>'by' FROM lockext.resources WHERE resource_id = 'ka-res'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(by, "other");
    assert!(!lock_check(&mut zombie, "ka-1", old["ka-1"]));
}

// ---------------------------------------------------------------------------------------
// 2. The reaper clears an expired keep-alive with many leases
// ---------------------------------------------------------------------------------------

#[test]
fn reaper_expires_every_attached_lease_then_deletes_the_keepalive() {
    const N: usize = 10_000;
    let cluster = Cluster::start(
        "ka-reap",
        "lockext.notify = on\nlockext.reap_interval = '200ms'\nlockext.reap_batch_size = 1000",
    );
    let mut admin = cluster.connect();
    admin.batch_execute(ROLES).expect("roles");
    let mut worker = cluster.connect_as("app", "postgres");
    let (k, _) = grant(&mut worker, "1 minute");
    let tokens = acquire_chunks(&mut worker, &ids("rp", N), "worker", None, Some(k));
    let mut listener = cluster.connect();
    listener.batch_execute("LISTEN lockext").unwrap();
    let reaped_before: i64 = admin
        .query_one(
            "SELECT coalesce((SELECT reaped_total FROM lockext.reaper_status() \
                                  WHERE database = 'postgres'), 0)",
            &[],
        )
        .unwrap()
        .get(0);

    // The worker shortens its keep-alive to 300 ms and stops renewing.
    let short = renew(&mut worker, k, Some("300 milliseconds")).expect("renewal");
    let t0 = Instant::now();
    let events = collect_events(&mut listener, Duration::from_secs(30), |e| e.len() >= N);
    println!(
        "{} events within {:?} of the keep-alive's last renewal",
        events.len(),
        t0.elapsed()
    );
    let mut seen: HashMap<String, i64> = HashMap::new();
    for (event, lock, token) in &events {
        assert_eq!(event, "expired", "{lock}: {event}");
        assert!(
            seen.insert(lock.clone(), *token).is_none(),
            "two events for {lock}"
        );
    }
    assert_same_tokens("one 'expired' event per attached lease", &seen, &tokens);

    // The leases are deleted, then the keep-alive's row, never the other way round.
    let gone = eventually(
        Duration::from_secs(30),
        "the keep-alive's row is deleted",
        || {
            let row = admin
                .query_one(
                    "SELECT (SELECT count(*) FROM lockext.keepalive_holders WHERE keepalive = $1), \
                            (SELECT count(*) FROM lockext.locks WHERE keepalive = $1)",
                    &[&k],
                )
                .unwrap();
            let (rows, leases): (i64, i64) = (row.get(0), row.get(1));
            assert!(
                rows == 1 || leases == 0,
                "the keep-alive's row is gone with {leases} leases still attached"
            );
            (rows == 0).then(|| t0.elapsed())
        },
    );
    assert!(server_clock(&mut admin) > short);
    println!("keep-alive row gone {gone:?} after its last renewal");
    let leases: i64 = admin
        .query_one("SELECT count(*) FROM lockext.locks", &[])
        .unwrap()
        .get(0);
    assert_eq!(leases, 0);
    let reaped: i64 = admin
        .query_one(
            "SELECT coalesce((SELECT reaped_total FROM lockext.reaper_status() \
                                  WHERE database = 'postgres'), 0)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(reaped - reaped_before, N as i64);
    assert_eq!(renew(&mut worker, k, None), None);
    // Its id cannot be attached to any more.
    expect_sqlstate(
        worker.query(
            "SELECT lockext.lock_acquire('rp-1', 'worker', NULL, keepalive => $1)",
            &[&k],
        ),
        "55000",
        "attaching to a reaped keep-alive",
    );
}

// ---------------------------------------------------------------------------------------
// 3. Revoke: every attached lease released, with events, waiters woken
// ---------------------------------------------------------------------------------------

#[test]
fn revoke_releases_every_attached_lease_with_events_and_wakes_waiters() {
    const N: usize = 1_000;
    let cluster = Cluster::start(
        "ka-revoke",
        "lockext.notify = on\nlockext.reap_interval = '1h'",
    );
    let mut admin = cluster.connect();
    admin.batch_execute(ROLES).expect("roles");
    let mut worker = cluster.connect_as("app", "postgres");
    let (k, _) = grant(&mut worker, "1 minute");
    let tokens = acquire_chunks(&mut worker, &ids("rv", N), "worker", None, Some(k));

    // Waiters of four of the locks, each in lock_acquire(wait => 10 s), queued 125 ms
    // apart: a waiter not woken naps 500 ms between looks, so without a wake-up the four
    // would be granted over a span of about 375 ms, not all at once.
    let waited = ["rv-1", "rv-250", "rv-500", "rv-1000"];
    let (tx, rx) = mpsc::channel();
    for (i, lock) in waited.into_iter().enumerate() {
        let mut c = cluster.connect_as("other", "postgres");
        let tx = tx.clone();
        thread::spawn(move || {
            let t: Option<i64> = c
                .query_one(
                    "SELECT fence_token FROM lockext.lock_acquire($1, 'waiter', '1 minute', wait => '10 seconds')",
                    &[&lock],
                )
                .expect("the waiter's acquire")
                .get(0);
            let _ = tx.send((lock, t, Instant::now()));
        });
        eventually(Duration::from_secs(10), "the waiter queues", || {
            let n: i64 = admin
                .query_one("SELECT count(*) FROM lockext.waiters", &[])
                .unwrap()
                .get(0);
            (n == i as i64 + 1).then_some(())
        });
        thread::sleep(ms(125));
    }
    assert!(
        rx.try_recv().is_err(),
        "a waiter returned before the revoke"
    );
    let mut listener = cluster.connect();
    listener.batch_execute("LISTEN lockext").unwrap();

    let ended: Option<i64> = worker
        .query_one("SELECT lockext.lock_keepalive_revoke($1)", &[&k])
        .expect("lock_keepalive_revoke")
        .get(0);
    let revoked_at = Instant::now();
    assert_eq!(ended, Some(N as i64));
    let mut woken = Vec::new();
    for _ in waited {
        let (lock, t, at) = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("a waiter returned after the revoke");
        let t = t.unwrap_or_else(|| panic!("the waiter of {lock} was refused"));
        assert!(
            t > tokens[lock],
            "{lock}: token {t} not above {}",
            tokens[lock]
        );
        woken.push((lock, at.saturating_duration_since(revoked_at)));
    }
    println!("waiters granted after the revoke returned: {woken:?}");
    for (lock, after) in &woken {
        assert!(
            *after < ms(150),
            "the waiter of {lock} was granted {after:?} after the revoke: not woken by it"
        );
    }

    let events = collect_events(&mut listener, Duration::from_secs(10), |e| {
        e.iter().filter(|(ev, ..)| ev == "released").count() >= N
    });
    let released: HashMap<String, i64> = events
        .iter()
        .filter(|(ev, ..)| ev == "released")
        .map(|(_, l, t)| (l.clone(), *t))
        .collect();
    let others: Vec<&Event> = events.iter().filter(|(ev, ..)| ev != "released").collect();
    assert_eq!(
        events.len() - others.len(),
        N,
        "one 'released' event per lease"
    );
    assert_same_tokens("one 'released' event per lease", &released, &tokens);
    assert!(
        others.iter().all(|(_, l, _)| waited.contains(&l.as_str())),
        "events other than the releases, for other locks than the waiters': {others:?}"
    );
    // Nothing attached is left; the keep-alive is ended.
    let (_, ended, _, leases) = keepalive_row(&mut admin, k).expect("the keep-alive's row");
    assert!(ended);
    assert_eq!(leases, 0);
    assert_eq!(renew(&mut worker, k, None), None);
    assert_eq!(
        acquire(&mut admin, "rv-2", "next", "1 minute").map(|t| t > tokens["rv-2"]),
        Some(true)
    );
}

// ---------------------------------------------------------------------------------------
// 4. Two workers, two keep-alives
// ---------------------------------------------------------------------------------------

#[test]
fn two_workers_keepalives_are_independent() {
    const N: usize = 100;
    let cluster = Cluster::start("ka-two", "lockext.reap_interval = '1h'");
    let mut admin = cluster.connect();
    admin.batch_execute(ROLES).expect("roles");
    // Two workers of one role (two processes of one application).
    let mut a = cluster.connect_as("app", "postgres");
    let mut b = cluster.connect_as("app", "postgres");
    let (ka, _) = grant(&mut a, "2 seconds");
    let (kb, b_expiry) = grant(&mut b, "2 seconds");
    let a_tokens = acquire_chunks(&mut a, &ids("wa", N), "worker-a", None, Some(ka));
    let b_tokens = acquire_chunks(&mut b, &ids("wb", N), "worker-b", None, Some(kb));

    // Each lease is shown with its own keep-alive's expiry.
    let shows = |c: &mut Client, k: i64, owner: &str, tokens: &HashMap<String, i64>| {
        let exp = expiry(c, k);
        let h = holders_of(c, k);
        assert_eq!(h.len(), tokens.len(), "{owner}'s leases in lockext.holders");
        for (lock, o, t, e) in h {
            assert_eq!((o.as_str(), t), (owner, tokens[&lock]), "{lock}");
            assert_eq!(
                e, exp,
                "{lock} is shown with another expiry than its keep-alive's"
            );
        }
    };
    shows(&mut admin, ka, "worker-a", &a_tokens);
    shows(&mut admin, kb, "worker-b", &b_tokens);

    // A renews past B's expiry; B's keep-alive never moves.
    let mut a_renewals = 0;
    while server_clock(&mut admin) < b_expiry + 300_000 {
        renew(&mut a, ka, None).expect("A's renewal");
        a_renewals += 1;
        let (b_exp, _, b_renewals, _) = keepalive_row(&mut admin, kb).expect("B's keep-alive");
        assert_eq!(
            (b_exp, b_renewals),
            (b_expiry, 0),
            "A's renewal moved B's keep-alive"
        );
        shows(&mut admin, ka, "worker-a", &a_tokens);
        thread::sleep(ms(250));
    }
    println!("{a_renewals} renewals of A's keep-alive; B's never moved");
    // B's leases are dead and free to others; A's are live and refused.
    assert!(holders_of(&mut admin, kb).is_empty());
    shows(&mut admin, ka, "worker-a", &a_tokens);
    assert_eq!(
        renew(&mut b, kb, None),
        None,
        "B's expired keep-alive renewed"
    );
    let mut other = cluster.connect_as("other", "postgres");
    for i in [1, 50, 100] {
        let (la, lb) = (format!("wa-{i}"), format!("wb-{i}"));
        assert!(lock_check(&mut a, &la, a_tokens[&la]));
        assert!(!lock_check(&mut b, &lb, b_tokens[&lb]));
        assert_eq!(acquire(&mut other, &la, "other", "1 minute"), None);
        let t = acquire(&mut other, &lb, "other", "1 minute").expect("B's lock is free");
        assert!(t > b_tokens[&lb]);
    }
    renew(&mut a, ka, None).expect("A's keep-alive lives on");
    shows(&mut admin, ka, "worker-a", &a_tokens);
}

// ---------------------------------------------------------------------------------------
// 5. A renewal and a conflicting grant, both orders, forced
// ---------------------------------------------------------------------------------------

/// The function the renewal's statements are executed with (as in renew_race.rs): the
/// renewal reaches it after it read the server clock, before its UPDATE.
const BREAK_AT: &str = "SPI_execute_plan";

/// A cluster whose database `race` no reaper serves, the roles, and R (the holder's role)
/// and G (another role's grabber) connected to it, neither of which may wait on a row
/// lock for long: a wait fails with 55P03 instead.
fn race_sessions(name: &str) -> (Cluster, Client, Client, Client) {
    let cluster = race_cluster(name, &["lockext"]);
    let mut admin = cluster.connect_to(DB);
    admin.batch_execute(ROLES).expect("roles");
    let mut r = cluster.connect_as("app", DB);
    let mut g = cluster.connect_as("other", DB);
    r.batch_execute("SET lock_timeout = '2s'").unwrap();
    g.batch_execute("SET lock_timeout = '2s'").unwrap();
    (cluster, admin, r, g)
}

/// A renewal held open in a transaction across the keep-alive's previous expiry holds the
/// keep-alive's row: a conflicting grant is refused at once, and once the renewal commits
/// the lock is still the holder's.
#[test]
fn renewal_held_open_across_the_expiry_refuses_a_conflicting_grant() {
    let (_cluster, mut admin, mut r, mut g) = race_sessions("ka-race-a");
    let (k, _) = grant(&mut r, "1 second");
    let tokens = acquire_chunks(&mut r, &ids("ra", 3), "worker", None, Some(k));
    let previous = expiry(&mut admin, k);
    r.batch_execute("BEGIN").unwrap();
    let renewed = renew(&mut r, k, Some("1 minute")).expect("the renewal");
    until_server_clock_passes(&mut admin, previous);
    let t = Instant::now();
    assert_eq!(
        acquire(&mut g, "ra-1", "grabber", "1 minute"),
        None,
        "granted while the keep-alive's renewal was in flight"
    );
    let took = t.elapsed();
    assert!(took < ms(1000), "the refused grant took {took:?}");
    let set: Vec<String> = vec!["ra-2".into(), "ra-3".into()];
    let rows = g
        .query(
            "SELECT lock_id FROM lockext.lock_acquire_all($1, 'grabber', '1 minute')",
            &[&set],
        )
        .unwrap();
    assert!(rows.is_empty(), "a set granted during the renewal");
    r.batch_execute("COMMIT").unwrap();
    let h = holders_of(&mut admin, k);
    assert_eq!(h.len(), 3);
    for (lock, owner, token, exp) in h {
        assert_eq!(
            (owner.as_str(), token, exp),
            ("worker", tokens[&lock], renewed)
        );
    }
    assert_eq!(acquire(&mut g, "ra-1", "grabber", "1 minute"), None);
    println!("renewal held open past the previous expiry: grant refused in {took:?}, lease kept");
}

/// A take-over of an expired keep-alive's lock, held open in a transaction, holds the
/// keep-alive's row: the holder's renewal answers NULL at once, and NULL after the
/// take-over commits (it ended the keep-alive); the holder's other leases stay dead.
#[test]
fn takeover_held_open_refuses_the_renewal_and_ends_the_keepalive() {
    let (_cluster, mut admin, mut r, mut g) = race_sessions("ka-race-b");
    let (k2, _) = grant(&mut r, "1 second");
    let tokens = acquire_chunks(&mut r, &ids("rb", 4), "worker", None, Some(k2));
    let k2_expiry = expiry(&mut admin, k2);
    until_server_clock_passes(&mut admin, k2_expiry);
    g.batch_execute("BEGIN").unwrap();
    let taken = acquire(&mut g, "rb-1", "grabber", "1 minute").expect("the take-over");
    assert!(taken > tokens["rb-1"]);
    let t = Instant::now();
    assert_eq!(
        renew(&mut r, k2, Some("1 minute")),
        None,
        "renewed during the take-over"
    );
    let took = t.elapsed();
    assert!(took < ms(1000), "the refused renewal took {took:?}");
    g.batch_execute("COMMIT").unwrap();
    assert_eq!(
        renew(&mut r, k2, Some("1 minute")),
        None,
        "renewed after the take-over"
    );
    let (_, ended, _, leases) = keepalive_row(&mut admin, k2).expect("k2's row");
    assert!(ended, "the take-over did not end the keep-alive");
    assert_eq!(leases, 3);
    assert!(
        holders_of(&mut admin, k2).is_empty(),
        "the holder's other leases live"
    );
    assert!(!lock_check(&mut r, "rb-2", tokens["rb-2"]));
    expect_sqlstate(
        r.query(
            "SELECT lockext.lock_acquire('rb-2', 'worker', NULL, keepalive => $1)",
            &[&k2],
        ),
        "55000",
        "attaching to the ended keep-alive",
    );
    let t2 = acquire(&mut g, "rb-2", "grabber", "1 minute").expect("rb-2 is free");
    assert!(t2 > tokens["rb-2"]);
    println!("take-over held open: renewal refused in {took:?}, and after the commit");
}

/// A renewal stopped by gdb after it read the server clock, before the keep-alive's
/// expiry; the expiry passes and a take-over of one attached lock commits; then the
/// renewal goes on: it answers NULL (the take-over ended the keep-alive), and none of the
/// holder's other leases is revived.
#[test]
fn renewal_paused_before_the_expiry_and_resumed_after_a_takeover_renews_nothing() {
    let (cluster, mut admin, mut r, mut g) = race_sessions("ka-race-c");
    let mut setup = cluster.connect_as("app", DB);
    r.batch_execute("SET statement_timeout = '20s'").unwrap();
    // The renewal's plans are prepared and kept, so the paused call only executes.
    assert_eq!(renew(&mut r, 999_999_999, None), None);
    let r_pid: i32 = r.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let mut gdb = Gdb::attach_and_break(r_pid, BREAK_AT);
    // Granted by another session of the role (a keep-alive is the role's), once gdb holds
    // R: long enough for R to reach the breakpoint first.
    let (k3, _) = grant(&mut setup, "1500 milliseconds");
    let tokens = acquire_chunks(&mut setup, &ids("rc", 4), "worker", None, Some(k3));
    let k3_expiry = expiry(&mut admin, k3);
    let (tx, renewed_rx) = mpsc::channel();
    thread::spawn(move || {
        let got = r
            .query_one(
                "SELECT lockext.lock_keepalive_renew($1, '1 minute') IS NOT NULL",
                &[&k3],
            )
            .map(|row| row.get::<_, bool>(0));
        let _ = tx.send(got.map_err(|e| e.to_string()));
    });
    let stop = gdb.wait_for_breakpoint(Duration::from_secs(10));
    let stopped_at = server_clock(&mut admin);
    let frames = gdb.backtrace();
    assert!(
        frames.iter().any(|f| f.contains("lock_keepalive_renew")),
        "stopped somewhere else than in the renewal: {stop}; {frames:?}"
    );
    assert!(
        stopped_at < k3_expiry,
        "the renewal stopped only after the expiry: it read a clock past it"
    );
    assert!(renewed_rx.try_recv().is_err());
    until_server_clock_passes(&mut admin, k3_expiry);
    let taken = acquire(&mut g, "rc-1", "grabber", "1 minute").expect("the take-over");
    assert!(taken > tokens["rc-1"]);
    gdb.release();
    let renewed = renewed_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the renewal returned")
        .expect("the renewal ran");
    assert!(
        !renewed,
        "a renewal that read its clock before the expiry renewed the keep-alive after a take-over"
    );
    let (exp, ended, renewals, _) = keepalive_row(&mut admin, k3).expect("k3's row");
    assert_eq!((exp, ended, renewals), (k3_expiry, true, 0));
    assert!(
        holders_of(&mut admin, k3).is_empty(),
        "the holder's other leases revived"
    );
    for lock in ["rc-2", "rc-3", "rc-4"] {
        assert!(!lock_check(&mut setup, lock, tokens[lock]));
        let t = acquire(&mut g, lock, "grabber", "1 minute").expect("free");
        assert!(t > tokens[lock]);
    }
    println!("renewal stopped before the expiry, resumed after a take-over: NULL, nothing revived");
}
