//! The reaper's rounds end whatever the statistics say, and a shutdown or
//! `pg_terminate_backend` ends a round in the middle of a statement.
//!
//! - Statistics that say `lockext.locks` is empty (`relpages` 94, `reltuples` 0, as after
//!   the table was emptied and vacuumed) over 100 000 expired leases made the batch's
//!   DELETE a nested loop that ran its `LIMIT ... FOR UPDATE SKIP LOCKED` subquery again
//!   for every lease: a round ran for minutes and reaped nothing.
//! - SIGTERM set a flag of the worker's own, read between batches: a statement that ran
//!   for minutes kept `pg_ctl stop` waiting. A round now leaves as a backend does
//!   (PostgreSQL's `die`): the statement it is in ends, its batch rolls back.

use lockext_cluster_tests::*;
use std::time::{Duration, Instant};

const CONF: &str = "lockext.database = ''\nlockext.reap_interval = '200ms'\n\
                    lockext.reap_batch_size = 1000\nautovacuum = off";

fn set_and_reload(c: &mut Client, alter_system: &str) {
    c.batch_execute(alter_system).unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
}

#[test]
fn a_round_on_statistics_that_say_empty_reaps_100_000_leases_and_the_server_stops() {
    // autovacuum off: nothing corrects the statistics while the test runs.
    let cluster = Cluster::start("reap-stats", CONF);
    let mut c = cluster.connect();
    c.batch_execute(
        "SELECT count(lockext.lock_acquire('stats-' || g, 'dead-client', '1 millisecond')) \
           FROM generate_series(1, 100000) g",
    )
    .unwrap();
    // What the statistics of an emptied table say: pages, and no rows.
    c.batch_execute(
        "UPDATE pg_class SET relpages = 94, reltuples = 0 WHERE oid = 'lockext.locks'::regclass",
    )
    .unwrap();
    let started = Instant::now();
    set_and_reload(&mut c, "ALTER SYSTEM SET lockext.database = 'postgres'");
    eventually(
        Duration::from_secs(120),
        "all 100 000 expired leases are reaped, on statistics that say the table is empty",
        || (count_leases(&mut c) == 0).then_some(()),
    );
    println!(
        "100 000 expired leases reaped {:?} after the reaper was let in",
        started.elapsed()
    );
    let stats: (i32, f32) = {
        let row = c
            .query_one(
                "SELECT relpages, reltuples FROM pg_class WHERE oid = 'lockext.locks'::regclass",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(stats, (94, 0.0), "the statistics changed during the test");
    drop(c);
    let stop = Instant::now();
    cluster.pg_ctl("stop -m fast -w -t 60");
    println!("pg_ctl stop -m fast returned after {:?}", stop.elapsed());
}

#[test]
fn pg_terminate_backend_ends_a_round_inside_its_statement() {
    let cluster = Cluster::start("reap-die", CONF);
    let mut c = cluster.connect();
    // A round's batch waits for this lock (its lock_timeout is 1 s): a round is then
    // inside a statement, in a lock wait, for as long as the test needs to find it.
    let mut locker = cluster.connect();
    locker
        .batch_execute("BEGIN; LOCK TABLE lockext.locks IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    set_and_reload(&mut c, "ALTER SYSTEM SET lockext.database = 'postgres'");
    let pid: i32 = eventually(
        Duration::from_secs(30),
        "a round waits for lockext.locks inside its batch",
        || {
            c.query_opt(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'lockext reaper' \
                   AND wait_event_type = 'Lock' AND wait_event = 'relation'",
                &[],
            )
            .unwrap()
            .map(|row| row.get(0))
        },
    );
    let terminated: bool = c
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap()
        .get(0);
    assert!(terminated);
    eventually(Duration::from_secs(30), "the round has exited", || {
        let alive: bool = c
            .query_one(
                "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .unwrap()
            .get(0);
        (!alive).then_some(())
    });
    locker.batch_execute("ROLLBACK").unwrap();
    let log = cluster.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&format!("[{pid}]")))
        .collect();
    println!("the round's log lines:\n{}", lines.join("\n"));
    assert!(
        lines.iter().any(|l| l.contains(
            "terminating background worker \"lockext reaper\" due to administrator command"
        )),
        "the round did not leave at once, inside its statement: {lines:?}"
    );
    assert!(
        !log.contains("lock timeout"),
        "the round went on waiting for its lock after SIGTERM, until its lock_timeout: {lines:?}"
    );
}

#[test]
fn a_round_runs_at_most_reap_round_batches_batches() {
    let cluster = Cluster::start(
        "reap-round-bound",
        "lockext.database = ''\nlockext.reap_interval = '100ms'\n\
         lockext.reap_batch_size = 100\nlockext.reap_round_batches = 1",
    );
    let mut c = cluster.connect();
    c.batch_execute(
        "SELECT count(lockext.lock_acquire('round-' || g, 'dead-client', '1 millisecond')) \
           FROM generate_series(1, 1000) g",
    )
    .unwrap();
    set_and_reload(&mut c, "ALTER SYSTEM SET lockext.database = 'postgres'");
    eventually(
        Duration::from_secs(60),
        "all 1 000 expired leases are reaped",
        || (count_leases(&mut c) == 0).then_some(()),
    );
    // A round counts its leases as each batch commits, and itself once it has worked out
    // when the database is next due: the last round may still be between the two when the
    // table is empty. So wait for the rounds, not read them once: 1 000 leases at 100 a
    // round take 10 of them, and a round that ran more than its one batch leaves fewer
    // for good (the test then fails on the wait).
    let (reaped, rounds): (i64, i64) = eventually(
        Duration::from_secs(30),
        "the 1 000 leases counted in 10 rounds or more (a round ran more than one batch of 100?)",
        || {
            let row = c
                .query_one(
                    "SELECT reaped_total, rounds FROM lockext.reaper_status() WHERE database = 'postgres'",
                    &[],
                )
                .unwrap();
            let (reaped, rounds): (i64, i64) = (row.get(0), row.get(1));
            (rounds >= 10).then_some((reaped, rounds))
        },
    );
    println!("1 000 leases reaped in {rounds} rounds of one batch of 100");
    assert_eq!(reaped, 1000);
}
