//! An operator's bulk load (more leases in one transaction than the claims budget) inserts
//! its leases past gates it only tests; an acquire of one of its ids that comes between
//! that test and the bulk transaction's end must be refused, never wait for it.
//!
//! Every acquire tests the bulk claim once it holds its gate, and only while a flag in
//! shared memory says a bulk load may be running (`claims.rs`). The bulk load raises the
//! flag while it holds the gate of the id it is past the budget on; so the acquire that
//! takes that gate next sees the flag. Were the flag read before the gate was taken, the
//! acquire could read it unraised, the bulk load pass the gate and insert, and the acquire
//! then take the gate and insert the same id: it would wait for the bulk transaction.
//!
//! Forced with gdb: T's backend stops in `LockAcquire` of its gate (the advisory tag
//! lockext's gates use, 0x4C4B), before it has taken it; the bulk load runs in B and stays
//! open; T goes on. T must be refused at once.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use lockext_cluster_tests::gdb::Gdb;
use lockext_cluster_tests::race::{race_cluster, DB};

/// `LockAcquire(const LOCKTAG *locktag, ...)`, stopped only for a lock id's gate:
/// `locktag_field4` (at byte 12 of the LOCKTAG, the first argument) is lockext's gate tag.
const T_BREAK_AT: &str = "-c \"*(unsigned short *)($rdi + 12) == 19531\" LockAcquire";

#[test]
fn an_acquire_that_meets_a_bulk_load_past_its_gate_is_refused_without_waiting() {
    let cluster = race_cluster("bulk-gate", &["lockext"]);
    let mut t = cluster.connect_to(DB);
    let mut b = cluster.connect_to(DB);
    t.batch_execute("SET statement_timeout = '20s'")
        .expect("statement_timeout");
    // Warm T up: its statements are prepared, its token era known.
    let warm: Option<i64> = t
        .query_one(
            "SELECT fence_token FROM lockext.lock_acquire('warm-up', 't', '1 minute')",
            &[],
        )
        .expect("warm-up")
        .get(0);
    assert!(warm.is_some());
    t.batch_execute("SELECT lockext.lock_release('warm-up', 't')")
        .expect("warm-up release");
    let budget: i32 = b
        .query_one(
            "SELECT current_setting('max_locks_per_transaction')::int / 2",
            &[],
        )
        .expect("budget")
        .get(0);
    let n = budget + 8; // the last 8 of the bulk load are past the budget
    let contested = format!("bulk-{n}");
    let t_pid: i32 = t
        .query_one("SELECT pg_backend_pid()", &[])
        .expect("pid")
        .get(0);

    let mut gdb = Gdb::attach_and_break(t_pid, T_BREAK_AT);
    let (tx, rx) = mpsc::channel();
    let id = contested.clone();
    thread::spawn(move || {
        let got = t
            .query_one(
                "SELECT fence_token FROM lockext.lock_acquire($1, 't', '1 minute')",
                &[&id],
            )
            .map(|row| row.get::<_, Option<i64>>(0))
            .map_err(|e| e.to_string());
        let _ = tx.send((t, got));
    });
    gdb.wait_for_breakpoint(Duration::from_secs(10));
    println!("T's backend {t_pid} stopped before it takes the gate of {contested}");

    // B's bulk load: its last leases, the contested id's among them, are inserted past gates
    // it only tests (T does not hold the contested id's gate yet), and stay uncommitted.
    b.batch_execute("BEGIN").expect("begin");
    let granted: i64 = b
        .query_one(
            "SELECT count(*) FROM generate_series(1, $1) AS g, \
                    lockext.lock_acquire('bulk-' || g, 'b', '1 minute') AS x \
              WHERE x.fence_token IS NOT NULL",
            &[&n],
        )
        .expect("bulk load")
        .get(0);
    assert_eq!(
        granted,
        i64::from(n),
        "the bulk load was not granted in full"
    );
    println!("B's bulk load holds {granted} leases, uncommitted; T goes on");

    gdb.release();
    let outcome = rx.recv_timeout(Duration::from_secs(5));
    let waited_on = if outcome.is_err() {
        let mut look = cluster.connect_to(DB);
        let wait: Option<String> = look
            .query_one(
                "SELECT wait_event_type || ':' || wait_event FROM pg_stat_activity WHERE pid = $1",
                &[&t_pid],
            )
            .expect("pg_stat_activity")
            .get(0);
        Some(wait.unwrap_or_default())
    } else {
        None
    };
    b.batch_execute("COMMIT").expect("commit the bulk load");
    if let Some(wait) = waited_on {
        let late = rx.recv_timeout(Duration::from_secs(20));
        panic!(
            "T's acquire of {contested} did not answer within 5 s of B's bulk load: it waited \
             ({wait}) for B's transaction, and answered {:?} once B committed",
            late.map(|(_, got)| got)
        );
    }
    let (mut t, got) = outcome.expect("T's answer");
    assert_eq!(
        got,
        Ok(None),
        "T's acquire of {contested} during the bulk load"
    );
    // Once the bulk load committed, its leases hold and other ids are free again.
    let again: Option<i64> = t
        .query_one(
            "SELECT fence_token FROM lockext.lock_acquire($1, 't', '1 minute')",
            &[&contested],
        )
        .expect("T again")
        .get(0);
    assert_eq!(again, None, "B's committed lease of {contested}");
    let other: Option<i64> = t
        .query_one(
            "SELECT fence_token FROM lockext.lock_acquire('another-id', 't', '1 minute')",
            &[],
        )
        .expect("T on another id")
        .get(0);
    assert!(other.is_some(), "another id after the bulk load committed");
}
