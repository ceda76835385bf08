//! The token counter in shared memory (`src/counter.rs`): one slot per database, 32 slots.
//! More databases than slots take turns granting, so slots are given up and started again
//! from their token sequence (the reservation on disk); then the server is killed with the
//! WAL writer stopped, and every database grants again. In each database, every token must
//! be above every token it handed out before.

use lockext_cluster_tests::checks::*;
use lockext_cluster_tests::crash::*;
use lockext_cluster_tests::*;

const DATABASES: usize = 36; // more than the 32 slots

#[test]
fn more_databases_than_counter_slots_keep_every_counter_rising() {
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
    let round = |label: &str, seen: &mut Vec<Vec<i64>>, checks: &mut Checks| {
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
        }
    };
    round("first", &mut seen, &mut checks);
    round("second", &mut seen, &mut checks);
    // Each database's second grant came after 35 others took a slot: its own slot was
    // given up and started again from the sequence, whose reservation is 1 024 ahead.
    let counter = |t: i64| t & ((1 << 41) - 1);
    let restarted = seen
        .iter()
        .filter(|t| counter(t[1]) - counter(t[0]) >= 1000)
        .count();
    println!("counter slots: {restarted} of {DATABASES} databases started a slot again");
    checks.check(
        restarted > 0,
        format!("slots were given up and started again ({restarted} databases): the scenario means something"),
    );

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
    round("after the crash", &mut seen, &mut checks);
    for (i, tokens) in seen.iter().enumerate() {
        let last = *tokens.last().expect("tokens");
        let before = &tokens[..tokens.len() - 1];
        checks.above(&format!("{}, after the crash", names[i]), &[last], before);
        checks.in_range(&names[i], tokens);
    }
    checks.finish();
}
