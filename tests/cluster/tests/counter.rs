//! The token counter (`src/ledger.rs`): one counter for every database of the cluster, in
//! shared memory, its reservation on disk. Many databases take turns granting, then the
//! server is killed with the WAL writer stopped, and every database grants again. Every
//! token must be above every token handed out before it, in any database (0.3.0 kept one
//! counter per database, in 32 slots: this test then checked slots given up and taken
//! again).

use lockext_cluster_tests::checks::*;
use lockext_cluster_tests::crash::*;
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
