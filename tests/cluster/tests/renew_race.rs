//! A renewal paused after it read the server clock, and a conflicting grant made while it
//! was paused. `lock_renew` reads the clock ($5) first, then extends the
//! caller's lease if `expires_at > $5`. If the lease expires in between and another kind's
//! grant (or another owner's permit in the same slot) sees it expired and is granted, the
//! renewal must not then revive it beside that grant: at most one of them may succeed, and
//! `lockext.holders` must never show conflicting live leases on one id.
//!
//! The interleaving is forced with gdb, not hoped for: the renewing backend stops at
//! `SPI_execute_plan` (what pgrx's `client.select` runs a prepared plan with), which it
//! reaches after `server_now()` and before its UPDATE. While it is stopped the lease
//! expires (on the server clock) and the conflicting acquire runs from another session;
//! then gdb detaches and the renewal finishes.
//!
//! Everything runs in database `race`, which no reaper serves (`lockext.database` is
//! `postgres`), so no reaper deletes the expired lease before the conflicting acquire.
//!
//! Run with `--test-threads=1 --nocapture` to see each interleaving.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use lockext_cluster_tests::gdb::Gdb;
use lockext_cluster_tests::race::{race_cluster, Holder, DB};
use lockext_cluster_tests::*;

const LOCK: &str = "race-lock";

/// The function the renewal's statements are executed with (`nm -D lockext.so`: the only
/// SPI_execute_* of a prepared plan it imports, besides SPI_execute_snapshot, which only
/// the acquire's looks use).
const BREAK_AT: &str = "SPI_execute_plan";

/// One forced interleaving: A's lease (`a_kind`, named lock_acquire arguments) is taken
/// with a short ttl; A's backend renews it and is stopped by gdb after reading the clock;
/// the lease expires; B acquires with `b_kind`; the renewal resumes. `conflict` says
/// whether a set of live holders breaks the lock's rules.
fn race(name: &str, a_kind: &str, b_kind: &str, conflict: fn(&[Holder]) -> Option<String>) {
    let cluster = race_cluster(name, &["lockext"]);
    // Short enough to keep the test short, long enough that the renewal surely reads the
    // clock before the lease runs out; a slow machine gets a second try with more room.
    for (attempt, ttl_ms) in [500u64, 2000].into_iter().enumerate() {
        if run_once(&cluster, attempt, ttl_ms, a_kind, b_kind, conflict) {
            return;
        }
        println!("{name}: the renewal did not reach the breakpoint within {ttl_ms} ms; again");
    }
    panic!("{name}: the renewal never stopped before the lease expired");
}

/// Returns false (nothing asserted) when the renewal stopped only after the lease had
/// expired, so that it could not have renewed whatever the build.
fn run_once(
    cluster: &Cluster,
    attempt: usize,
    ttl_ms: u64,
    a_kind: &str,
    b_kind: &str,
    conflict: fn(&[Holder]) -> Option<String>,
) -> bool {
    let started = Instant::now();
    let a_owner = format!("A-{attempt}");
    let b_owner = format!("B-{attempt}");
    let mut setup = cluster.connect_to(DB);
    let mut b = cluster.connect_to(DB);
    let mut a = cluster.connect_to(DB);
    // Once gdb lets go, the renewal must not hang the test.
    a.batch_execute("SET statement_timeout = '20s'")
        .expect("statement_timeout");
    // Prepare and keep the renewal's plans now, so that the paused call only executes.
    let warm: Option<std::time::SystemTime> = a
        .query_one(
            "SELECT lockext.lock_renew('warm-up', $1, '1 minute')",
            &[&a_owner],
        )
        .expect("warm-up renewal")
        .get(0);
    assert!(warm.is_none());
    let a_pid: i32 = a
        .query_one("SELECT pg_backend_pid()", &[])
        .expect("pid")
        .get(0);
    setup
        .execute("DELETE FROM lockext.locks WHERE lock_id = $1", &[&LOCK])
        .expect("clean locks");
    setup
        .execute(
            "DELETE FROM lockext.shared_leases WHERE lock_id = $1",
            &[&LOCK],
        )
        .expect("clean shared_leases");

    let mut gdb = Gdb::attach_and_break(a_pid, BREAK_AT);
    println!(
        "gdb attached to A's backend {a_pid} with a breakpoint on {BREAK_AT} ({} ms)",
        started.elapsed().as_millis()
    );

    // A's lease, taken by another session in A's name (renewals go by owner and role).
    let extra = if a_kind.is_empty() {
        String::new()
    } else {
        format!(", {a_kind}")
    };
    let a_token: i64 = setup
        .query_one(
            &format!(
                "SELECT fence_token FROM lockext.lock_acquire($1, $2, $3::text::interval{extra})"
            ),
            &[&LOCK, &a_owner, &format!("{ttl_ms} milliseconds")],
        )
        .expect("A's acquire")
        .get::<_, Option<i64>>(0)
        .expect("A's lease is granted");

    // A renews, for a whole minute; its backend reads the clock and stops at the breakpoint.
    let (tx, renewed_rx) = mpsc::channel();
    let renew_owner = a_owner.clone();
    thread::spawn(move || {
        let r = a
            .query_one(
                "SELECT (extract(epoch FROM lockext.lock_renew($1, $2, '1 minute')) * 1000)::bigint",
                &[&LOCK, &renew_owner],
            )
            .map(|row| row.get::<_, Option<i64>>(0));
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    let stop = gdb.wait_for_breakpoint(Duration::from_secs(10));
    // Still live now, so live when the renewal read the clock before stopping.
    let live_at_stop: bool = setup
        .query_one(
            "SELECT bool_or(expires_at > clock_timestamp()) IS TRUE FROM \
               (SELECT expires_at FROM lockext.locks WHERE lock_id = $1 AND owner = $2 \
                UNION ALL \
                SELECT expires_at FROM lockext.shared_leases WHERE lock_id = $1 AND owner = $2) AS l",
            &[&LOCK, &a_owner],
        )
        .expect("A's lease at the stop")
        .get(0);
    let frames = gdb.backtrace();
    println!(
        "A's backend stopped in {BREAK_AT} ({} ms), lease live: {live_at_stop}; stack: {}",
        started.elapsed().as_millis(),
        frames
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join(" < ")
    );
    assert!(
        stop.contains(BREAK_AT) && frames.iter().any(|f| f.contains("lock_renew")),
        "stopped somewhere else than in lock_renew: {stop}; stack {frames:?}"
    );
    assert!(
        renewed_rx.try_recv().is_err(),
        "the renewal returned while its backend was stopped"
    );
    if !live_at_stop {
        gdb.release();
        let _ = renewed_rx.recv_timeout(Duration::from_secs(10));
        return false;
    }

    // The lease runs out, by the server's clock.
    eventually(
        Duration::from_secs(10),
        "A's lease has expired on the server clock",
        || {
            let expired: bool = setup
                .query_one(
                    "SELECT bool_and(expires_at < clock_timestamp()) IS TRUE FROM \
                       (SELECT expires_at FROM lockext.locks WHERE lock_id = $1 AND owner = $2 \
                        UNION ALL \
                        SELECT expires_at FROM lockext.shared_leases \
                         WHERE lock_id = $1 AND owner = $2) AS l",
                    &[&LOCK, &a_owner],
                )
                .expect("A's expiry")
                .get(0);
            expired.then_some(())
        },
    );
    assert!(
        holders_of(&mut setup).is_empty(),
        "the lock has live holders after A's lease expired"
    );

    // B's conflicting acquire, while A's renewal is stopped.
    let b_extra = if b_kind.is_empty() {
        String::new()
    } else {
        format!(", {b_kind}")
    };
    let b_token: Option<i64> = b
        .query_one(
            &format!("SELECT fence_token FROM lockext.lock_acquire($1, $2, '1 minute'{b_extra})"),
            &[&LOCK, &b_owner],
        )
        .expect("B's acquire")
        .get(0);
    println!(
        "B's acquire ({}) while A's renewal is stopped: {b_token:?} ({} ms)",
        if b_kind.is_empty() {
            "exclusive"
        } else {
            b_kind
        },
        started.elapsed().as_millis()
    );

    // The renewal goes on.
    gdb.release();
    let renewed = renewed_rx
        .recv_timeout(Duration::from_secs(15))
        .expect("the renewal returns once gdb detached")
        .unwrap_or_else(|e| panic!("A's renewal failed: {e}"));
    let live = holders_of(&mut setup);
    println!(
        "A's renewal (token {a_token}) returned {} ({} ms); live holders of {LOCK}:",
        match renewed {
            Some(_) => "a new expiry",
            None => "NULL",
        },
        started.elapsed().as_millis()
    );
    for h in &live {
        println!(
            "  {:<9} {:<4} token {} ({:.0} ms left)",
            h.mode, h.owner, h.fence_token, h.time_left_ms
        );
    }
    drop(gdb);

    if let Some(why) = conflict(&live) {
        panic!(
            "conflicting live leases on {LOCK}: {why}; renewal {renewed:?}, B's grant {b_token:?}; \
             holders {live:?}"
        );
    }
    assert!(
        renewed.is_some() != b_token.is_some(),
        "exactly one of A's renewal and B's acquire may succeed: renewal {renewed:?}, \
         B's grant {b_token:?}; holders {live:?}"
    );
    let winner = if renewed.is_some() {
        &a_owner
    } else {
        &b_owner
    };
    assert!(
        live.iter().any(|h| &h.owner == winner),
        "the winner {winner} holds no live lease: {live:?}"
    );
    assert!(
        live.iter().all(|h| &h.owner == winner),
        "the loser still holds a live lease: {live:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    true
}

fn exclusive_beside_shared(live: &[Holder]) -> Option<String> {
    let exclusive = live.iter().filter(|h| h.mode == "exclusive").count();
    let shared = live.iter().filter(|h| h.mode == "shared").count();
    (exclusive > 0 && shared > 0).then(|| format!("{exclusive} exclusive and {shared} shared"))
}

#[test]
fn a_paused_shared_renewal_cannot_revive_beside_an_exclusive_grant() {
    race(
        "race-shared",
        "mode => 'shared'",
        "",
        exclusive_beside_shared,
    );
}

#[test]
fn a_paused_permit_renewal_cannot_exceed_the_semaphore() {
    race("race-permit", "permits => 1", "permits => 1", |live| {
        let permits = live.iter().filter(|h| h.mode == "permit").count();
        (permits > 1).then(|| format!("{permits} live permits of a semaphore of 1"))
    });
}

#[test]
fn a_paused_exclusive_renewal_cannot_revive_beside_a_shared_grant() {
    race(
        "race-exclusive",
        "",
        "mode => 'shared'",
        exclusive_beside_shared,
    );
}

fn holders_of(c: &mut Client) -> Vec<Holder> {
    lockext_cluster_tests::race::holders(c, LOCK)
}
