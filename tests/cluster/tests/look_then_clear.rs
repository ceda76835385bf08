//! A renewal that commits between a conflicting acquire's look and its deletion of the
//! dead leases it saw (`grant::clear_dead`) must make that acquire refuse.
//!
//! A shared lease, an exclusive lease over shared ones, and a permit in a slot each look
//! first (under the newest snapshot) and then delete the leases of the other kind, or of
//! the slot, that the look showed dead (`CLEAR_DEAD_EXCLUSIVE`, `CLEAR_DEAD_SHARED`,
//! `CLEAR_DEAD_SLOT`). Their answer is whether every *dead* lease that the statement sees
//! is gone; a lease renewed in between is not dead any more, so it is neither deleted nor
//! counted, and the acquire goes on to grant beside it. A lease attached to a keep-alive
//! is renewed by its keep-alive (`lock_keepalive_renew`), whose row is not the lease's, so
//! nothing of the acquire's ever meets the renewal's row lock.
//!
//! The interleaving is forced, never hoped for:
//!
//! 1. H's lease (attached to a keep-alive, or with a ttl of its own) is taken with a short
//!    time to live. H runs `BEGIN` and renews (the keep-alive, or the lease) while it is
//!    live: renewed, not yet committed.
//! 2. The lease's committed expiry passes on the server clock.
//! 3. R asks for a conflicting lease; its look sees H's lease dead (H has not committed);
//!    gdb stops R's backend at `lockext::grant::clear_dead`.
//! 4. H commits: H holds a live lease, by a renewal that succeeded.
//! 5. R goes on. It must be refused; `lockext.holders` must show H's lease only.
//!
//! Everything runs in database `race`, which no reaper serves, with `lockext.lock_delay =
//! 0`. Run with `--test-threads=1 --nocapture` to see each interleaving.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use lockext_cluster_tests::gdb::Gdb;
use lockext_cluster_tests::race::{race_cluster, Holder, DB};
use lockext_cluster_tests::*;

const LOCK: &str = "look-lock";
/// Where R stops: `grant::clear_dead` (never inlined), which runs after the look.
const R_BREAK_AT: &str = "lockext::grant::clear_dead";

/// The linker's name of `R_BREAK_AT` in the server's lockext.so: gdb knows a Rust function
/// of a library without debug information only by its mangled name (with its hash).
fn break_symbol() -> String {
    let lib = format!("{PG_BIN}/../lib/lockext.so");
    // Rust's legacy mangling: each path segment as its length and name, then the hash.
    let prefix: String = R_BREAK_AT
        .split("::")
        .map(|seg| format!("{}{seg}", seg.len()))
        .collect();
    let out = std::process::Command::new("nm")
        .args(["--defined-only", &lib])
        .output()
        .expect("nm (binutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .find(|sym| sym.starts_with(&format!("_ZN{prefix}17h")))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no {R_BREAK_AT} in {lib}"))
}

struct Variant {
    name: &'static str,
    /// H's lease attached to a keep-alive (renewed by it), or with a ttl of its own.
    attached: bool,
    h_kind: &'static str,
    h_mode: &'static str,
    r_kind: &'static str,
}

fn extra(kind: &str) -> String {
    if kind.is_empty() {
        String::new()
    } else {
        format!(", {kind}")
    }
}

fn look_then_clear(v: &Variant) {
    let cluster = race_cluster(v.name, &["lockext"]);
    // Short, to keep the test short; long enough that H's renewal lands while the lease is
    // live; a slow machine gets a second try with more room.
    for (attempt, ttl_ms) in [800u64, 3000].into_iter().enumerate() {
        if run_once(&cluster, attempt, ttl_ms, v) {
            return;
        }
        println!(
            "{}: H's renewal came after its lease expired; again",
            v.name
        );
    }
    panic!("{}: H never renewed before its lease expired", v.name);
}

fn run_once(cluster: &Cluster, attempt: usize, ttl_ms: u64, v: &Variant) -> bool {
    let started = Instant::now();
    let at = || format!("{} ms", started.elapsed().as_millis());
    let h_owner = format!("H-{attempt}");
    let r_owner = format!("R-{attempt}");
    let mut setup = cluster.connect_to(DB);
    let mut h = cluster.connect_to(DB);
    let mut r = cluster.connect_to(DB);
    r.batch_execute("SET statement_timeout = '20s'")
        .expect("statement_timeout");
    for table in ["lockext.locks", "lockext.shared_leases"] {
        setup
            .execute(&format!("DELETE FROM {table} WHERE lock_id = $1"), &[&LOCK])
            .expect("clean the lease tables");
    }
    // R's plans are prepared and its first token used on another id, so that the stopped
    // call only executes.
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
    let r_pid: i32 = r
        .query_one("SELECT pg_backend_pid()", &[])
        .expect("pid")
        .get(0);

    // 1. H's lease, and H's renewal in a transaction left open.
    let ttl = format!("{ttl_ms} milliseconds");
    let (keepalive, expiry_sql): (Option<i64>, String) = if v.attached {
        let k: i64 = h
            .query_one(
                "SELECT keepalive FROM lockext.lock_keepalive_grant($1::text::interval)",
                &[&ttl],
            )
            .expect("H's keep-alive")
            .get(0);
        (
            Some(k),
            format!("SELECT expires_at < clock_timestamp() FROM lockext.keepalives WHERE keepalive = {k}"),
        )
    } else {
        (
            None,
            "SELECT bool_and(expires_at < clock_timestamp()) IS TRUE FROM lockext.locks \
              WHERE lock_id = 'look-lock'"
                .to_string(),
        )
    };
    let granted: Option<i64> = if let Some(k) = keepalive {
        h.query_one(
            &format!(
                "SELECT fence_token FROM lockext.lock_acquire($1, $2, NULL{}, keepalive => $3)",
                extra(v.h_kind)
            ),
            &[&LOCK, &h_owner, &k],
        )
    } else {
        h.query_one(
            &format!(
                "SELECT fence_token FROM lockext.lock_acquire($1, $2, $3::text::interval{})",
                extra(v.h_kind)
            ),
            &[&LOCK, &h_owner, &ttl],
        )
    }
    .expect("H's acquire")
    .get(0);
    let h_token = granted.expect("H's lease is granted");
    h.batch_execute("BEGIN").expect("H's BEGIN");
    let renewed: Option<std::time::SystemTime> = if let Some(k) = keepalive {
        h.query_one("SELECT lockext.lock_keepalive_renew($1, '1 minute')", &[&k])
    } else {
        h.query_one(
            "SELECT lockext.lock_renew($1, $2, '1 minute')",
            &[&LOCK, &h_owner],
        )
    }
    .expect("H's renewal")
    .get(0);
    if renewed.is_none() {
        h.batch_execute("ROLLBACK").expect("H's ROLLBACK");
        return false;
    }
    println!(
        "[{}] H's lease (token {h_token}) renewed in H's open transaction ({})",
        v.name,
        at()
    );

    // 2. The committed expiry passes.
    eventually(
        Duration::from_secs(15),
        "H's committed expiry has passed on the server clock",
        || {
            let expired: bool = setup
                .query_one(expiry_sql.as_str(), &[])
                .expect("H's expiry")
                .get(0);
            expired.then_some(())
        },
    );

    // 3. R's acquire stops after its look, before it deletes what it saw dead.
    let mut r_gdb = Gdb::attach_and_break(r_pid, &break_symbol());
    let (r_tx, r_rx) = mpsc::channel();
    let (acquire_owner, r_kind) = (r_owner.clone(), v.r_kind);
    thread::spawn(move || {
        let got = r
            .query_one(
                &format!(
                    "SELECT fence_token FROM lockext.lock_acquire($1, $2, '1 minute'{})",
                    extra(r_kind)
                ),
                &[&LOCK, &acquire_owner],
            )
            .map(|row| row.get::<_, Option<i64>>(0))
            .map_err(|e| e.to_string());
        let _ = r_tx.send(got);
    });
    let stop = r_gdb.wait_for_breakpoint(Duration::from_secs(10));
    let frames = r_gdb.backtrace();
    println!(
        "[{}] R's backend stopped ({}); stack: {}",
        v.name,
        at(),
        frames
            .iter()
            .take(6)
            .cloned()
            .collect::<Vec<_>>()
            .join(" < ")
    );
    assert!(
        stop.contains("clear_dead") && frames.iter().any(|f| f.contains("lock_acquire")),
        "R stopped somewhere else than in lock_acquire's clear_dead: {stop}; {frames:?}"
    );

    // 4. H commits its renewal.
    h.batch_execute("COMMIT").expect("H's COMMIT");
    let live = lockext_cluster_tests::race::holders(&mut setup, LOCK);
    assert!(
        live.iter().any(|l| l.owner == h_owner),
        "H's renewed lease is not live after its commit: {live:?}"
    );

    // 5. R goes on.
    r_gdb.release();
    drop(r_gdb);
    let got = r_rx
        .recv_timeout(Duration::from_secs(15))
        .expect("R's acquire returns once gdb detached")
        .unwrap_or_else(|e| panic!("R's acquire failed: {e}"));
    let live: Vec<Holder> = lockext_cluster_tests::race::holders(&mut setup, LOCK);
    println!(
        "[{}] R's acquire: {:?}; live holders: {live:?} ({})",
        v.name,
        got,
        at()
    );
    assert!(
        got.is_none(),
        "R was granted (token {got:?}) beside H's {} lease, renewed and committed before R \
         deleted what its look saw dead; live holders {live:?}",
        v.h_mode
    );
    assert!(
        live.len() == 1 && live[0].owner == h_owner && live[0].mode == v.h_mode,
        "lockext.holders should show H's {} lease only: {live:?}",
        v.h_mode
    );
    true
}

#[test]
fn a_shared_acquire_is_refused_once_the_attached_writer_is_renewed() {
    look_then_clear(&Variant {
        name: "look-ka-shared",
        attached: true,
        h_kind: "",
        h_mode: "exclusive",
        r_kind: "mode => 'shared'",
    });
}

#[test]
fn an_exclusive_acquire_is_refused_once_the_attached_reader_is_renewed() {
    look_then_clear(&Variant {
        name: "look-ka-exclusive",
        attached: true,
        h_kind: "mode => 'shared'",
        h_mode: "shared",
        r_kind: "",
    });
}

#[test]
fn a_permit_is_refused_once_the_attached_permit_in_its_slot_is_renewed() {
    look_then_clear(&Variant {
        name: "look-ka-permit",
        attached: true,
        h_kind: "permits => 1",
        h_mode: "permit",
        r_kind: "permits => 1",
    });
}

#[test]
fn a_shared_acquire_is_refused_once_the_writer_renews_its_own_lease() {
    look_then_clear(&Variant {
        name: "look-own-shared",
        attached: false,
        h_kind: "",
        h_mode: "exclusive",
        r_kind: "mode => 'shared'",
    });
}
