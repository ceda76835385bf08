//! A refused acquire inside a transaction that stays open must not keep the holder's live,
//! just-renewed lease row locked (PostgreSQL keeps the lock of a row that fails the recheck
//! of `FOR UPDATE`).
//!
//! PostgreSQL keeps the lock of a row that fails the EvalPlanQual recheck of `SELECT ...
//! FOR UPDATE SKIP LOCKED`: in READ COMMITTED it locks the newest version of a row that its
//! snapshot showed, rechecks the query's condition on it, skips the row when that fails,
//! and keeps the lock until the transaction ends. The acquire statements that lock a lease
//! they saw dead do just that when the lease was renewed in between: `CLEAR_DEAD_EXCLUSIVE`
//! (a shared lease or a permit deleting a dead exclusive lease), `CLEAR_DEAD_SHARED` (an
//! exclusive lease deleting dead shared leases), `CLEAR_DEAD_SLOT` (a permit deleting dead
//! permits in its slot) and `TAKE_OVER` (an exclusive lease taking over an expired one). The
//! acquire is rightly refused, but if its transaction stays open, the holder's next
//! `lock_renew` finds its live row locked, retries for 100 ms and answers NULL: the holder
//! is told it lost a lease that it holds.
//!
//! The interleaving is forced with gdb, never hoped for:
//!
//! 1. H's lease is taken with a short ttl. H renews it; H's backend reads the server clock
//!    while the lease is live and stops at `SPI_execute_plan`, before its UPDATE (as in
//!    `renew_race.rs`).
//! 2. The lease expires on the server clock.
//! 3. R runs `BEGIN; SELECT ... lockext.lock_acquire(...)`, of a kind that conflicts with
//!    H's lease. R's clock and snapshot show H's lease dead; R's backend stops at
//!    `heap_lock_tuple` (exported by the postgres binary), about to lock H's row.
//! 4. H's renewal goes on and commits: it read the clock while the lease was live, and
//!    nobody had its row locked.
//! 5. R goes on: it locks the newest (renewed) version, the recheck fails, it is refused.
//!    R's transaction stays open.
//! 6. H renews again. It holds a live lease: the renewal must succeed, and
//!    `lockext.holders` must show H's lease only.
//!
//! Everything runs in database `race`, which no reaper serves, with `lockext.lock_delay =
//! 0`. Run with `--test-threads=1 --nocapture` to see each interleaving.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use lockext_cluster_tests::gdb::Gdb;
use lockext_cluster_tests::race::{race_cluster, Holder, DB};
use lockext_cluster_tests::*;

const LOCK: &str = "held-lock";

/// Where H's renewal stops: after it read the clock, before its UPDATE (see renew_race.rs).
const H_BREAK_AT: &str = "SPI_execute_plan";
/// Where R's acquire stops: about to lock the lease row it saw dead.
const R_BREAK_AT: &str = "heap_lock_tuple";

/// One variant: H's lease and R's conflicting acquire, as named lock_acquire arguments.
struct Variant {
    name: &'static str,
    h_kind: &'static str,
    /// The `mode` lockext.holders shows for H's lease.
    h_mode: &'static str,
    r_kind: &'static str,
    /// The statement R is expected to be in when it locks H's row, and lockext functions
    /// (lockext.so has symbols) of which R's stack must show one there: the one that runs
    /// the statement, or its caller, into which a release build may inline it.
    r_statement: &'static str,
    r_frames: &'static [&'static str],
    /// The table H's lease lives in.
    table: &'static str,
    /// R's acquire runs outside a transaction block, in a statement that goes on after it
    /// (it then waits for an advisory lock the test holds): the transaction is as open as
    /// after BEGIN, although `IsTransactionBlock()` says no.
    goes_on: bool,
}

/// The advisory lock a statement that goes on waits for.
const GATE: i64 = 4711;

fn extra(kind: &str) -> String {
    if kind.is_empty() {
        String::new()
    } else {
        format!(", {kind}")
    }
}

fn held_row(v: &Variant) {
    let cluster = race_cluster(v.name, &["lockext", "pgrowlocks"]);
    // Short enough to keep the test short, long enough that H's renewal surely reads the
    // clock before the lease runs out; a slow machine gets a second try with more room.
    for (attempt, ttl_ms) in [500u64, 2000].into_iter().enumerate() {
        if run_once(&cluster, attempt, ttl_ms, v) {
            return;
        }
        println!(
            "{}: H's renewal did not reach the breakpoint within {ttl_ms} ms; again",
            v.name
        );
    }
    panic!(
        "{}: H's renewal never stopped before its lease expired",
        v.name
    );
}

/// The pids of the backends that hold rows of `table` locked, with the lock modes.
fn row_lockers(c: &mut Client, table: &str) -> Vec<String> {
    c.query(
        &format!("SELECT pids::text, modes::text FROM pgrowlocks('{table}')"),
        &[],
    )
    .expect("pgrowlocks")
    .iter()
    .map(|r| {
        format!(
            "pids {} modes {}",
            r.get::<_, String>(0),
            r.get::<_, String>(1)
        )
    })
    .collect()
}

type Renewal = Result<Option<i64>, String>;

fn renew(c: &mut Client, owner: &str) -> Renewal {
    c.query_one(
        "SELECT (extract(epoch FROM lockext.lock_renew($1, $2, '1 minute')) * 1000)::bigint",
        &[&LOCK, &owner],
    )
    .map(|row| row.get::<_, Option<i64>>(0))
    .map_err(|e| e.to_string())
}

/// Returns false (nothing asserted) when H's renewal stopped only after its lease had
/// expired, so that it could not have renewed whatever the build.
fn run_once(cluster: &Cluster, attempt: usize, ttl_ms: u64, v: &Variant) -> bool {
    let started = Instant::now();
    let at = || format!("{} ms", started.elapsed().as_millis());
    let h_owner = format!("H-{attempt}");
    let r_owner = format!("R-{attempt}");
    let mut setup = cluster.connect_to(DB);
    let mut h = cluster.connect_to(DB);
    let mut r = cluster.connect_to(DB);
    for c in [&mut h, &mut r] {
        // Once gdb lets go, nothing may hang the test.
        c.batch_execute("SET statement_timeout = '20s'")
            .expect("statement_timeout");
    }
    // Prepare and keep the renewal's plans now, so that the paused call only executes.
    let warm: Option<std::time::SystemTime> = h
        .query_one(
            "SELECT lockext.lock_renew('warm-up', $1, '1 minute')",
            &[&h_owner],
        )
        .expect("H's warm-up renewal")
        .get(0);
    assert!(warm.is_none());
    // And R's first grant of this backend (its token's first use) on another id, released.
    let warm_lock = format!("warm-up-{attempt}");
    let warm: Option<i64> = r
        .query_one(
            &format!(
                "SELECT fence_token FROM lockext.lock_acquire($1, $2, '1 minute'{})",
                extra(v.r_kind)
            ),
            &[&warm_lock, &r_owner],
        )
        .expect("R's warm-up acquire")
        .get(0);
    assert!(warm.is_some(), "R's warm-up acquire was refused");
    assert!(r
        .query_one(
            "SELECT lockext.lock_release($1, $2)",
            &[&warm_lock, &r_owner]
        )
        .expect("R's warm-up release")
        .get::<_, bool>(0));
    let h_pid: i32 = h
        .query_one("SELECT pg_backend_pid()", &[])
        .expect("pid")
        .get(0);
    let r_pid: i32 = r
        .query_one("SELECT pg_backend_pid()", &[])
        .expect("pid")
        .get(0);
    for table in ["lockext.locks", "lockext.shared_leases"] {
        setup
            .execute(&format!("DELETE FROM {table} WHERE lock_id = $1"), &[&LOCK])
            .expect("clean the lease tables");
    }

    let mut h_gdb = Gdb::attach_and_break(h_pid, H_BREAK_AT);
    println!(
        "[{}] gdb attached to H's backend {h_pid}, breakpoint on {H_BREAK_AT} ({})",
        v.name,
        at()
    );

    // H's lease, taken by another session in H's name (renewals go by owner and role).
    let h_token: i64 = setup
        .query_one(
            &format!(
                "SELECT fence_token FROM lockext.lock_acquire($1, $2, $3::text::interval{})",
                extra(v.h_kind)
            ),
            &[&LOCK, &h_owner, &format!("{ttl_ms} milliseconds")],
        )
        .expect("H's acquire")
        .get::<_, Option<i64>>(0)
        .expect("H's lease is granted");

    // 1. H renews; its backend reads the clock and stops before its UPDATE.
    let (h_tx, h_rx) = mpsc::channel();
    let renew_owner = h_owner.clone();
    thread::spawn(move || {
        let first = renew(&mut h, &renew_owner);
        let _ = h_tx.send((h, first));
    });
    let stop = h_gdb.wait_for_breakpoint(Duration::from_secs(10));
    let live_at_stop: bool = setup
        .query_one(
            &format!(
                "SELECT bool_or(expires_at > clock_timestamp()) IS TRUE FROM {} \
                  WHERE lock_id = $1 AND owner = $2",
                v.table
            ),
            &[&LOCK, &h_owner],
        )
        .expect("H's lease at the stop")
        .get(0);
    let frames = h_gdb.backtrace();
    println!(
        "[{}] H's backend stopped in {H_BREAK_AT} ({}), lease live: {live_at_stop}; stack: {}",
        v.name,
        at(),
        frames
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join(" < ")
    );
    assert!(
        stop.contains(H_BREAK_AT) && frames.iter().any(|f| f.contains("lock_renew")),
        "H stopped somewhere else than in lock_renew: {stop}; stack {frames:?}"
    );
    assert!(
        h_rx.try_recv().is_err(),
        "H's renewal returned while its backend was stopped"
    );
    if !live_at_stop {
        h_gdb.release();
        let _ = h_rx.recv_timeout(Duration::from_secs(10));
        return false;
    }

    // 2. H's lease runs out, by the server's clock.
    eventually(
        Duration::from_secs(10),
        "H's lease has expired on the server clock",
        || {
            let expired: bool = setup
                .query_one(
                    &format!(
                        "SELECT bool_and(expires_at < clock_timestamp()) IS TRUE FROM {} \
                          WHERE lock_id = $1 AND owner = $2",
                        v.table
                    ),
                    &[&LOCK, &h_owner],
                )
                .expect("H's expiry")
                .get(0);
            expired.then_some(())
        },
    );
    assert!(
        holders_of(&mut setup).is_empty(),
        "the lock has live holders after H's lease expired"
    );

    // 3. R's acquire, in a transaction that stays open; it sees H's lease dead and stops
    //    about to lock its row.
    if v.goes_on {
        setup
            .execute("SELECT pg_advisory_lock($1)", &[&GATE])
            .expect("close the gate");
    } else {
        r.batch_execute("BEGIN").expect("R's BEGIN");
    }
    let mut r_gdb = Gdb::attach_and_break(r_pid, R_BREAK_AT);
    println!(
        "[{}] gdb attached to R's backend {r_pid}, breakpoint on {R_BREAK_AT} ({})",
        v.name,
        at()
    );
    let (r_tx, r_rx) = mpsc::channel();
    let (acquire_owner, r_kind, goes_on) = (r_owner.clone(), v.r_kind, v.goes_on);
    thread::spawn(move || {
        // The select list runs for the acquire's row, after the acquire.
        let then = if goes_on {
            ", pg_advisory_xact_lock(4711)::text"
        } else {
            ""
        };
        let got = r
            .query_one(
                &format!(
                    "SELECT fence_token{then} FROM lockext.lock_acquire($1, $2, '1 minute'{})",
                    extra(r_kind)
                ),
                &[&LOCK, &acquire_owner],
            )
            .map(|row| row.get::<_, Option<i64>>(0))
            .map_err(|e| e.to_string());
        let _ = r_tx.send((r, got));
    });
    let stop = r_gdb.wait_for_breakpoint(Duration::from_secs(10));
    let frames = r_gdb.backtrace();
    println!(
        "[{}] R's backend stopped in {R_BREAK_AT} ({}); stack: {}",
        v.name,
        at(),
        frames
            .iter()
            .take(14)
            .cloned()
            .collect::<Vec<_>>()
            .join(" < ")
    );
    assert!(
        stop.contains(R_BREAK_AT)
            && frames.iter().any(|f| f.contains("lock_acquire"))
            && frames
                .iter()
                .any(|f| v.r_frames.iter().any(|want| f.contains(want)))
            && !frames.iter().any(|f| f.contains("lockext::token::")),
        "R stopped somewhere else than in {} of lock_acquire: {stop}; stack {frames:?}",
        v.r_statement
    );
    assert!(
        r_rx.try_recv().is_err(),
        "R's acquire returned while its backend was stopped"
    );

    // 4. H's renewal goes on and commits, before R locks the row.
    h_gdb.release();
    let (mut h, first) = h_rx
        .recv_timeout(Duration::from_secs(15))
        .expect("H's renewal returns once gdb detached");
    let first = first.unwrap_or_else(|e| panic!("H's first renewal failed: {e}"));
    println!(
        "[{}] H's first renewal (token {h_token}, while R is stopped): {} ({})",
        v.name,
        if first.is_some() { "renewed" } else { "NULL" },
        at()
    );
    assert!(
        first.is_some(),
        "H's first renewal, which read the clock while its lease was live and met no lock, \
         returned NULL"
    );

    // 5. R goes on: it meets the renewed row, is refused; its transaction stays open (after
    //    BEGIN; or in its statement, which waits for the gate).
    r_gdb.release();
    drop(r_gdb);
    let mut returned = None;
    if v.goes_on {
        eventually(
            Duration::from_secs(15),
            "R's statement waits for the gate, after its acquire",
            || {
                let waits: bool = setup
                    .query_one(
                        "SELECT count(*) = 1 FROM pg_stat_activity \
                          WHERE pid = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
                        &[&r_pid],
                    )
                    .expect("R's wait")
                    .get(0);
                waits.then_some(())
            },
        );
    } else {
        returned = Some(
            r_rx.recv_timeout(Duration::from_secs(15))
                .expect("R's acquire returns once gdb detached"),
        );
    }
    let mut got = returned.as_ref().map(|(_, got)| {
        got.clone()
            .unwrap_or_else(|e| panic!("R's acquire failed: {e}"))
    });
    println!(
        "[{}] R's acquire ({}): {} ({}); R's transaction stays open",
        v.name,
        v.r_statement,
        match got {
            Some(Some(t)) => format!("granted, token {t}"),
            Some(None) => "refused (NULL)".to_string(),
            None => "done, its statement waits for the gate".to_string(),
        },
        at()
    );
    assert!(
        got.flatten().is_none(),
        "R's acquire was granted (token {got:?}) beside H's renewed lease; holders {:?}",
        holders_of(&mut setup)
    );

    // 6. H renews again, while R's transaction is open.
    let lockers = row_lockers(&mut setup, v.table);
    let t = Instant::now();
    let second =
        renew(&mut h, &h_owner).unwrap_or_else(|e| panic!("H's second renewal failed: {e}"));
    let second_ms = t.elapsed().as_millis();
    let live = holders_of(&mut setup);
    println!(
        "[{}] H's second renewal, R's transaction open: {} (in {second_ms} ms); row locks on \
         {}: {lockers:?} (R's backend is {r_pid}); live holders of {LOCK}:",
        v.name,
        if second.is_some() { "renewed" } else { "NULL" },
        v.table
    );
    for l in &live {
        println!(
            "  {:<9} {:<4} token {} ({:.0} ms left)",
            l.mode, l.owner, l.fence_token, l.time_left_ms
        );
    }

    // For the message only: the same renewal once R's transaction has ended.
    if v.goes_on {
        setup
            .execute("SELECT pg_advisory_unlock($1)", &[&GATE])
            .expect("open the gate");
        let (_, after_gate) = r_rx
            .recv_timeout(Duration::from_secs(15))
            .expect("R's statement returns once the gate opens");
        got = Some(after_gate.unwrap_or_else(|e| panic!("R's statement failed: {e}")));
        assert!(
            got.flatten().is_none(),
            "R's acquire was granted (token {got:?}) beside H's renewed lease"
        );
    } else if let Some((mut r, _)) = returned {
        r.batch_execute("ROLLBACK").expect("R's ROLLBACK");
    }
    let after = renew(&mut h, &h_owner);
    println!(
        "[{}] H's renewal after R's ROLLBACK: {}",
        v.name,
        match &after {
            Ok(Some(_)) => "renewed".to_string(),
            Ok(None) => "NULL".to_string(),
            Err(e) => e.clone(),
        }
    );
    drop(h_gdb);

    assert!(
        second.is_some(),
        "H's renewal of its live lease returned NULL while R's refused acquire's transaction \
         was open: R ({}) locked the newest version of H's row, whose recheck failed, and \
         keeps it locked (row locks on {}: {lockers:?}; R's backend is {r_pid}); after R's \
         ROLLBACK the renewal returns {after:?}; holders {live:?}",
        v.r_statement,
        v.table
    );
    assert!(
        live.len() == 1 && live[0].owner == h_owner && live[0].mode == v.h_mode,
        "lockext.holders should show H's {} lease only: {live:?}",
        v.h_mode
    );
    true
}

#[test]
fn a_refused_shared_acquire_keeps_no_lock_on_a_renewed_exclusive_lease() {
    held_row(&Variant {
        name: "held-shared",
        h_kind: "",
        h_mode: "exclusive",
        r_kind: "mode => 'shared'",
        r_statement: "CLEAR_DEAD_EXCLUSIVE",
        r_frames: &[
            "lockext::grant::clear_dead",
            "lockext::lease::look_decide_store",
        ],
        table: "lockext.locks",
        goes_on: false,
    });
}

#[test]
fn a_refused_exclusive_acquire_keeps_no_lock_on_a_renewed_shared_lease() {
    held_row(&Variant {
        name: "held-exclusive",
        h_kind: "mode => 'shared'",
        h_mode: "shared",
        r_kind: "",
        r_statement: "CLEAR_DEAD_SHARED",
        r_frames: &[
            "lockext::grant::clear_dead",
            "lockext::lease::look_decide_store", // or inlined into its callers
        ],
        table: "lockext.shared_leases",
        goes_on: false,
    });
}

#[test]
fn a_refused_take_over_keeps_no_lock_on_a_renewed_exclusive_lease() {
    held_row(&Variant {
        name: "held-take-over",
        h_kind: "",
        h_mode: "exclusive",
        r_kind: "",
        r_statement: "TAKE_OVER",
        // `take` ends in a tail call of `grant_by` (which runs only an extension or a
        // take-over, and R, another owner, has nothing to extend): whether `take`'s frame
        // is still on the stack depends on what the compiler inlined.
        r_frames: &["lockext::grant::take", "lockext::grant::grant_by"],
        table: "lockext.locks",
        goes_on: false,
    });
}

#[test]
fn a_refused_permit_keeps_no_lock_on_a_renewed_permit_in_its_slot() {
    held_row(&Variant {
        name: "held-permit",
        h_kind: "permits => 1",
        h_mode: "permit",
        r_kind: "permits => 1",
        r_statement: "CLEAR_DEAD_SLOT",
        r_frames: &[
            "lockext::grant::clear_dead",
            "lockext::lease::look_decide_store",
        ],
        table: "lockext.shared_leases",
        goes_on: false,
    });
}

/// As the take-over above, with R's acquire outside a transaction block, in a statement
/// that goes on after it (as a DO block, a function, or `SELECT lock_acquire(...), f()`).
#[test]
fn a_refused_take_over_in_a_statement_that_goes_on_keeps_no_lock() {
    held_row(&Variant {
        name: "held-goes-on",
        h_kind: "",
        h_mode: "exclusive",
        r_kind: "",
        r_statement: "TAKE_OVER",
        r_frames: &["lockext::grant::take", "lockext::grant::grant_by"],
        table: "lockext.locks",
        goes_on: true,
    });
}

fn holders_of(c: &mut Client) -> Vec<Holder> {
    lockext_cluster_tests::race::holders(c, LOCK)
}
