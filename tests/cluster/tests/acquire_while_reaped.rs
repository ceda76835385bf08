//! An acquire that does not wait, of a lock whose lease is dead, while the reaper is
//! deleting that very lease: it must be granted once the reaper's batch commits, not
//! refused because the batch held the dead row locked at that moment.
//!
//! A reaper batch (`reaper::reap_batch`) is one short transaction: it ends expired
//! keep-alives (`end_keepalives.sql`, which locks the keep-alive's row) and deletes dead
//! leases (`reap_locks.sql`, `reap_shared_leases.sql`, `reap_attached_locks.sql`, which lock
//! each row they delete), then commits. An acquire's take-over (`exclusive/take_over.sql`),
//! its ending of an expired keep-alive (`keepalive/end.sql`) and its deletion of dead
//! leases of another kind (`grant/clear_dead_*.sql`) lock the same rows `SKIP LOCKED`: one
//! that came while the batch held them found nothing to take and was refused, although the
//! lease was dead and its row would be gone a moment later (a Python client's lapsed
//! keep-alive test saw its rival refused that way once, with the reaper due at the very
//! moment the keep-alive lapsed).
//!
//! The interleaving is forced, never hoped for: a session standing in for the reaper runs
//! the reaper's own statements (this repository's `sql/run/reaper/*.sql`, with the reaper's
//! parameters) in a transaction it keeps open, so the dead rows are held locked as a batch
//! holds them; the acquire runs with gdb attached, stopped at its first nap
//! (`pg_usleep`, which a no-wait acquire calls only to wait for such a row); the stand-in
//! commits; the acquire goes on. Before the fix the acquire answered NULL at once, without
//! a nap.
//!
//! The batch may also commit between the acquire's look and its take-over: the row is
//! then gone when the take-over comes, and the acquire was refused as well.
//!
//! And what must not change: a lease that is live when the acquire looks is refused at
//! once, without a nap, even while its holder's renewal holds its row; and a dead row that
//! a transaction keeps locked for long is refused after a bounded wait, not waited for.
//!
//! Everything runs in database `race`, which no reaper serves, with `lockext.lock_delay =
//! 0`. Run with `--test-threads=1 --nocapture` to see each case.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use lockext_cluster_tests::gdb::Gdb;
use lockext_cluster_tests::race::{race_cluster, DB};
use lockext_cluster_tests::*;

/// Where the acquire stops: PostgreSQL's `pg_usleep`, the nap of a no-wait acquire that
/// found a dead row locked (`lease::past_the_gate`). A symbol of the server itself, so the
/// test sets the same breakpoint whatever the library's build.
const NAP: &str = "pg_usleep";

/// The reaper's statements, exactly as a batch runs them.
const END_KEEPALIVES: &str = include_str!("../../../sql/run/reaper/end_keepalives.sql");
const REAP_ATTACHED_LOCKS: &str = include_str!("../../../sql/run/reaper/reap_attached_locks.sql");
const REAP_LOCKS: &str = include_str!("../../../sql/run/reaper/reap_locks.sql");
const REAP_SHARED_LEASES: &str = include_str!("../../../sql/run/reaper/reap_shared_leases.sql");

/// A dead lease, and what the stand-in for the reaper runs over it.
struct Dead {
    lock: &'static str,
    /// The lease's old token.
    token: i64,
    /// The reaper's statements for it, in a batch's order: (name, parameter types, text,
    /// arguments), each `(limit, ..., now)` as `reap_batch` passes them.
    reaper: Vec<(&'static str, &'static str, &'static str, &'static str)>,
}

/// A lease of `lock` made dead on the server: a lease attached to a keep-alive whose
/// expiry is moved into the past (as its renewer stopping would), a plain exclusive lease,
/// or a shared lease, each expired a second ago.
fn make_dead(c: &mut Client, lock: &'static str, kind: &str) -> Dead {
    match kind {
        "keepalive" => {
            let k: i64 = c
                .query_one(
                    "SELECT keepalive FROM lockext.lock_keepalive_grant('1 minute')",
                    &[],
                )
                .unwrap()
                .get(0);
            let token: i64 = c
                .query_one(
                    "SELECT fence_token FROM lockext.lock_acquire($1, 'holder', NULL, keepalive => $2)",
                    &[&lock, &k],
                )
                .unwrap()
                .get(0);
            c.execute(
                "UPDATE lockext.keepalives SET expires_at = clock_timestamp() - interval '1 second' \
                  WHERE keepalive = $1",
                &[&k],
            )
            .unwrap();
            Dead {
                lock,
                token,
                reaper: vec![
                    (
                        "end_keepalives",
                        "int4, timestamptz",
                        END_KEEPALIVES,
                        "100, clock_timestamp()",
                    ),
                    (
                        "reap_attached_locks",
                        "int4, bool, timestamptz",
                        REAP_ATTACHED_LOCKS,
                        "100, false, clock_timestamp()",
                    ),
                ],
            }
        }
        "exclusive" | "shared" => {
            let token: i64 = c
                .query_one(
                    "SELECT fence_token FROM lockext.lock_acquire($1, 'holder', '1 minute', mode => $2)",
                    &[&lock, &kind],
                )
                .unwrap()
                .get(0);
            let (table, name, sql) = if kind == "shared" {
                ("shared_leases", "reap_shared_leases", REAP_SHARED_LEASES)
            } else {
                ("locks", "reap_locks", REAP_LOCKS)
            };
            c.execute(
                &format!(
                    "UPDATE lockext.{table} SET expires_at = clock_timestamp() - interval '1 second' \
                      WHERE lock_id = $1"
                ),
                &[&lock],
            )
            .unwrap();
            Dead {
                lock,
                token,
                reaper: vec![(
                    name,
                    "int4, bool, timestamptz",
                    sql,
                    "100, false, clock_timestamp()",
                )],
            }
        }
        other => panic!("no such kind {other}"),
    }
}

/// Runs the reaper's statements for `dead` in a transaction left open: the dead rows (and
/// the keep-alive's) are locked and deleted, not yet committed. Panics unless the lease
/// was deleted.
fn reap_and_hold(r: &mut Client, dead: &Dead) {
    r.batch_execute("BEGIN").unwrap();
    let mut deleted = 0;
    for (name, types, sql, args) in &dead.reaper {
        r.batch_execute(&format!("PREPARE {name}({types}) AS {sql}"))
            .unwrap_or_else(|e| panic!("prepare the reaper's {name}: {e}"));
        let rows = r
            .simple_query(&format!("EXECUTE {name}({args})"))
            .unwrap_or_else(|e| panic!("the reaper's {name}: {e}"));
        if name.starts_with("reap_") {
            deleted += rows
                .iter()
                .filter(|m| matches!(m, postgres::SimpleQueryMessage::Row(_)))
                .count();
        }
    }
    assert_eq!(
        deleted, 1,
        "the reaper's statements did not delete {}",
        dead.lock
    );
}

fn acquire(c: &mut Client, lock: &str, owner: &str) -> Option<i64> {
    c.query_one(
        "SELECT fence_token FROM lockext.lock_acquire($1, $2, '30 seconds')",
        &[&lock, &owner],
    )
    .expect("lock_acquire")
    .get(0)
}

/// The owner of the live exclusive lease of `lock`, if any.
fn holder(c: &mut Client, lock: &str) -> Option<(String, i64)> {
    c.query_opt(
        "SELECT owner, fence_token FROM lockext.holders WHERE lock_id = $1 AND mode = 'exclusive'",
        &[&lock],
    )
    .unwrap()
    .map(|r| (r.get(0), r.get(1)))
}

/// The rival's no-wait acquire of `lock`, in a thread, with gdb holding its backend at its
/// first nap: Ok(the stopped gdb, the answer to come) once it stopped there, or Err(the
/// answer) when the call ended without a nap.
#[allow(clippy::type_complexity)]
fn acquire_watched(
    cluster: &Cluster,
    lock: &'static str,
) -> Result<(Gdb, mpsc::Receiver<(Option<i64>, Client)>), Option<i64>> {
    let mut c = cluster.connect_to(DB);
    c.batch_execute("SET statement_timeout = '30s'").unwrap();
    // The acquire's plans are prepared and kept, so the watched call only executes.
    assert!(acquire(&mut c, "warm-up", "rival").is_some());
    let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let mut gdb = Gdb::attach_and_break(pid, NAP);
    let (tx, rx) = mpsc::channel();
    // The client comes back with the answer: its backend must outlive the watch.
    thread::spawn(move || {
        let answer = acquire(&mut c, lock, "rival");
        let _ = tx.send((answer, c));
    });
    loop {
        if gdb.stopped_within(Duration::from_millis(50)).is_some() {
            return Ok((gdb, rx));
        }
        match rx.try_recv() {
            Ok((answer, _client)) => {
                gdb.release();
                return Err(answer);
            }
            Err(mpsc::TryRecvError::Empty) => {}
            Err(mpsc::TryRecvError::Disconnected) => panic!("the rival's acquire failed"),
        }
    }
}

fn granted_once_the_reaper_commits(kind: &str, lock: &'static str) {
    let cluster = race_cluster(&format!("reaped-{kind}"), &["lockext"]);
    let mut admin = cluster.connect_to(DB);
    let mut r = cluster.connect_to(DB);
    let dead = make_dead(&mut admin, lock, kind);
    reap_and_hold(&mut r, &dead);
    let (mut gdb, answer) = match acquire_watched(&cluster, lock) {
        Ok(stopped) => stopped,
        Err(answer) => panic!(
            "{kind}: the no-wait acquire of {lock} answered {answer:?} at once while the \
             reaper's batch was deleting its dead lease: refused although the lease was dead"
        ),
    };
    // Stopped at its nap: the acquire found the dead row locked by the batch.
    r.batch_execute("COMMIT").unwrap();
    gdb.release();
    let token = answer
        .recv_timeout(Duration::from_secs(30))
        .expect("the rival's acquire never ended")
        .0
        .unwrap_or_else(|| panic!("{kind}: {lock} refused after the reaper's batch committed"));
    assert!(
        token > dead.token,
        "{kind}: token {token} not above {}",
        dead.token
    );
    assert_eq!(holder(&mut admin, lock), Some(("rival".to_string(), token)));
    println!("{kind}: the acquire napped while the reaper held {lock}, and got token {token} once it committed");
}

#[test]
fn a_lapsed_keepalives_lock_is_granted_while_the_reaper_ends_it() {
    granted_once_the_reaper_commits("keepalive", "lapse-2");
}

#[test]
fn an_expired_lock_is_granted_while_the_reaper_deletes_it() {
    granted_once_the_reaper_commits("exclusive", "expired-lock");
}

#[test]
fn a_lock_over_an_expired_shared_lease_is_granted_while_the_reaper_deletes_it() {
    granted_once_the_reaper_commits("shared", "expired-reader");
}

/// The other order: the batch deletes the dead lease and commits after the acquire looked
/// and before its take-over locks the row (gdb holds the acquire in `heap_lock_tuple`,
/// the take-over's lock of the row, while the stand-in runs the reaper's statement and
/// commits). The take-over then finds the row gone: the lock is free, and granted.
#[test]
fn an_expired_lock_deleted_by_the_reaper_after_the_look_is_granted() {
    let cluster = race_cluster("reaped-after-look", &["lockext"]);
    let mut admin = cluster.connect_to(DB);
    let mut r = cluster.connect_to(DB);
    let dead = make_dead(&mut admin, "gone-lock", "exclusive");
    let mut c = cluster.connect_to(DB);
    c.batch_execute("SET statement_timeout = '30s'").unwrap();
    assert!(acquire(&mut c, "warm-up", "rival").is_some());
    let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let mut gdb = Gdb::attach_and_break(pid, "heap_lock_tuple");
    let (tx, rx) = mpsc::channel();
    let lock = dead.lock;
    thread::spawn(move || {
        let answer = acquire(&mut c, lock, "rival");
        let _ = tx.send((answer, c));
    });
    gdb.wait_for_breakpoint(Duration::from_secs(30));
    let frames = gdb.backtrace();
    assert!(
        frames
            .iter()
            .any(|f| f.contains("lockext::grant::grant_by")),
        "stopped elsewhere than the take-over's row lock: {frames:?}"
    );
    reap_and_hold(&mut r, &dead);
    r.batch_execute("COMMIT").unwrap();
    gdb.release();
    let (answer, _c) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the rival's acquire never ended");
    let token = answer.expect("refused after the reaper deleted the dead lease: the lock was free");
    assert!(token > dead.token);
    assert_eq!(holder(&mut admin, lock), Some(("rival".to_string(), token)));
}

/// A live lease is refused at once, without a nap, while its holder's renewal keeps its row
/// locked in an open transaction: no acquire waits behind a live holder.
#[test]
fn a_live_lease_is_refused_without_a_nap_while_its_renewal_holds_the_row() {
    let cluster = race_cluster("reaped-live", &["lockext"]);
    let mut h = cluster.connect_to(DB);
    let lock = "live-lock";
    assert!(acquire(&mut h, lock, "holder").is_some());
    h.batch_execute("BEGIN").unwrap();
    let renewed: Option<String> = h
        .query_one(
            "SELECT lockext.lock_renew($1, 'holder', '1 minute')::text",
            &[&lock],
        )
        .unwrap()
        .get(0);
    assert!(renewed.is_some(), "the holder's renewal");
    match acquire_watched(&cluster, lock) {
        Err(None) => {}
        Err(Some(token)) => panic!("granted {token} beside a live lease"),
        Ok(_) => panic!("the acquire napped behind a live holder's renewal"),
    }
    h.batch_execute("COMMIT").unwrap();
    assert_eq!(
        holder(&mut h, lock).map(|(o, _)| o).as_deref(),
        Some("holder")
    );
}

/// A dead row that a transaction keeps locked (a batch that does not commit) is not waited
/// for: the acquire is refused after its brief wait, and granted once that transaction ends.
#[test]
fn a_dead_row_kept_locked_is_refused_after_a_brief_wait() {
    let cluster = race_cluster("reaped-kept", &["lockext"]);
    let mut admin = cluster.connect_to(DB);
    let mut r = cluster.connect_to(DB);
    let dead = make_dead(&mut admin, "kept-lock", "exclusive");
    reap_and_hold(&mut r, &dead);
    let mut c = cluster.connect_to(DB);
    c.batch_execute("SET statement_timeout = '30s'").unwrap();
    assert_eq!(acquire(&mut c, dead.lock, "rival"), None);
    r.batch_execute("COMMIT").unwrap();
    let token = acquire(&mut c, dead.lock, "rival").expect("granted once the batch committed");
    assert!(token > dead.token);
}
