//! The token counter (`src/ledger.rs`): one counter for every database of the cluster, in
//! shared memory, its reservation on disk. Many databases take turns granting, then the
//! server is killed with the WAL writer stopped, and every database grants again. Every
//! token must be above every token handed out before it, in any database (0.3.0 kept one
//! counter per database, in 32 slots: this test then checked slots given up and taken
//! again). Then the grant that writes the next reservation, stopped in that write: the
//! others go on meanwhile, and a crash there hands out no token again.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use lockext_cluster_tests::checks::*;
use lockext_cluster_tests::crash::*;
use lockext_cluster_tests::gdb::Gdb;
use lockext_cluster_tests::*;

const DATABASES: usize = 36; // more than 0.3.0's 32 slots

#[test]
fn many_databases_share_one_counter_that_rises_through_a_crash() {
    let mut checks = Checks::new("counter slots");
    let cluster = Cluster::start("counter-slots", CALM_CONF);
    let names: Vec<String> = (0..DATABASES).map(|i| format!("db{i:02}")).collect();
    {
        let mut c = cluster.connect();
        for name in &names {
            c.batch_execute(&format!("CREATE DATABASE {name}"))
                .expect("create database");
        }
    }
    for name in &names {
        cluster
            .connect_to(name)
            .batch_execute("CREATE EXTENSION lockext")
            .expect("create extension");
    }
    let mut seen: Vec<Vec<i64>> = vec![Vec::new(); DATABASES];
    // Every grant of the cluster in the order it was made: one counter for all.
    let mut all: Vec<(String, i64)> = Vec::new();
    let mut round = |label: &str, seen: &mut Vec<Vec<i64>>, checks: &mut Checks| {
        for (i, name) in names.iter().enumerate() {
            let mut c = cluster.connect_to(name);
            let token = grant(&mut c, &format!("{label}-{i}"), "o");
            if let Some(&last) = seen[i].last() {
                checks.check(
                    token > last,
                    format!("{name}, {label}: token {token} > its last {last}"),
                );
            }
            seen[i].push(token);
            all.push((format!("{name} {label}"), token));
        }
    };
    round("first", &mut seen, &mut checks);
    round("second", &mut seen, &mut checks);

    // A crash that loses every WAL record not flushed by lockext itself. (After a checkpoint:
    // else the end of recovery flushes every file of the 36 databases, which can outlast
    // the restart's wait on a busy disk.)
    cluster
        .connect()
        .batch_execute("CHECKPOINT")
        .expect("checkpoint");
    {
        let mut c = cluster.connect_to(&names[0]);
        c.batch_execute("SET lockext.durability = epoch; SET synchronous_commit = off")
            .expect("epoch durability");
        let _walwriter = stop_walwriter(&cluster);
        for k in 0..50 {
            seen[0].push(grant(&mut c, &format!("async-{k}"), "o"));
        }
        drop(c);
        let _ = kill_and_restart(&cluster);
    }
    let before_crash: Vec<i64> = seen.iter().flatten().copied().collect();
    round("after the crash", &mut seen, &mut checks);
    checks.increasing(
        "every grant of the cluster, in the order made",
        &all[..2 * DATABASES],
    );
    let after: Vec<i64> = seen.iter().map(|t| *t.last().expect("tokens")).collect();
    checks.above(
        "after the crash, against every database's tokens",
        &after,
        &before_crash,
    );
    for (i, tokens) in seen.iter().enumerate() {
        let last = *tokens.last().expect("tokens");
        let before = &tokens[..tokens.len() - 1];
        checks.above(&format!("{}, after the crash", names[i]), &[last], before);
        checks.in_range(&names[i], tokens);
    }
    checks.finish();
}

/// Fewer grants than the ledger leaves under the reservation on disk when one grant starts
/// writing the next (`ledger::REFILL_AT`, 512, less the grant that writes).
const WHILE_WRITTEN: usize = 400;

/// One grant writes the next reservation (a WAL record, flushed, and the ledger file) and
/// is stopped by gdb at that flush, forced: in epoch mode with `synchronous_commit = off` a
/// grant's own commit never flushes, so its first `XLogFlush` is the ledger's. Meanwhile
/// another session's grants must all be answered from the counters left under the
/// reservation already on disk: until 0.4.0's change a grant wrote the reservation holding
/// the ledger's lock, when the counter passed it, and every other grant of the cluster
/// waited behind that flush and two fsyncs (at 64 clients, 17% of the sampled backends were
/// waiting on `lockext_token_ledger`: docs/profile-2026-12-01.md). Then the server is
/// killed with the writer still stopped: the grants after the restart are above all of
/// them.
#[test]
fn the_grant_that_writes_the_next_reservation_holds_up_no_other_grant() {
    let mut checks = Checks::new("counter refill");
    let cluster = Cluster::start("counter-refill", CALM_CONF);
    let mut writer = cluster.connect();
    writer
        .batch_execute("SET lockext.durability = epoch; SET synchronous_commit = off")
        .expect("epoch durability");
    // The cluster's first grant writes the first reservation: before the breakpoint.
    let first = grant(&mut writer, "first", "writer");
    let pid: i32 = writer
        .query_one("SELECT pg_backend_pid()", &[])
        .expect("pid")
        .get(0);
    let mut gdb = Gdb::attach_and_break(pid, "XLogFlush");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for k in 0..2048 {
            let token = grant(&mut writer, &format!("w-{k}"), "writer");
            if tx.send(token).is_err() {
                return;
            }
        }
    });
    gdb.wait_for_breakpoint(Duration::from_secs(120));
    let frames = gdb.backtrace();
    checks.check(
        frames.iter().any(|f| f.contains("lockext::ledger")),
        format!("the writer stopped in the ledger's write: {frames:?}"),
    );
    let writer_tokens: Vec<i64> = std::iter::once(first).chain(rx.try_iter()).collect();
    println!(
        "writer stopped in the ledger's write after {} grants (last token {:?})",
        writer_tokens.len(),
        writer_tokens.last()
    );

    // Another session grants while the writer is held.
    let mut other = cluster.connect();
    let (done_tx, done_rx) = mpsc::channel();
    thread::spawn(move || {
        let tokens = grant_many(&mut other, "o", WHILE_WRITTEN);
        let _ = done_tx.send(tokens);
    });
    // An LWLock wait does not end with statement_timeout: a bound on how long to wait for
    // an answer that, once blocked, would never come while the writer is held.
    let others = done_rx.recv_timeout(Duration::from_secs(60));
    checks.check(
        others.is_ok(),
        format!("{WHILE_WRITTEN} grants of another session were answered while the writer was held in the ledger's write"),
    );
    let others = others.unwrap_or_default();
    let granted: Vec<(String, i64)> = others
        .iter()
        .enumerate()
        .map(|(i, &t)| (format!("o-{i}"), t))
        .collect();
    checks.increasing("the other session's grants", &granted);
    checks.above(
        "the other session's grants, against the writer's answered ones",
        &others,
        &writer_tokens,
    );

    // A crash with the writer still in its write: the new reservation may never reach the
    // disk, and the counter starts again at the one that did.
    kill_server(&cluster);
    drop(gdb);
    let mut c = restart_after_crash(&cluster);
    let after = grant_many(&mut c, "after", 3);
    let before: Vec<i64> = writer_tokens.iter().chain(&others).copied().collect();
    checks.above(
        "after the crash, against every token before it",
        &after,
        &before,
    );
    // The writer's own grant, stopped in the write, had its token too (never seen): one
    // counter above the last the writer saw, below every one the other session saw.
    checks.in_range("every token", &before);
    checks.finish();
}
