//! What the reaper costs with many databases (issue 34, item 1): an idle database gets no
//! round after its first, a lease that expires in one of many is still reaped, every
//! database has its row in reaper_status, and no free background worker slot makes the
//! reaper retry, not back off. Real server, real clients; counts and states, no timings
//! (the waits are generous time-outs).
//!
//! Run with `--test-threads=1`.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use lockext_cluster_tests::*;

const GENEROUS: Duration = Duration::from_secs(120);

/// `n` databases with lockext (copies of one template that has it), named `{prefix}{i}`.
fn databases(cluster: &Cluster, prefix: &str, n: usize) -> Vec<String> {
    let mut c = cluster.connect();
    c.batch_execute(&format!("CREATE DATABASE {prefix}tmpl"))
        .unwrap();
    cluster
        .connect_to(&format!("{prefix}tmpl"))
        .batch_execute("CREATE EXTENSION lockext")
        .unwrap();
    let mut names = vec![format!("{prefix}tmpl")];
    for i in 1..n {
        let name = format!("{prefix}{i}");
        c.batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {prefix}tmpl"))
            .unwrap();
        names.push(name);
    }
    names
}

/// reaper_status's rounds, by database.
fn rounds(c: &mut Client) -> HashMap<String, i64> {
    c.query(
        "SELECT database, rounds FROM lockext.reaper_status() WHERE database IS NOT NULL",
        &[],
    )
    .expect("reaper_status")
    .into_iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

fn expired_lease(c: &mut Client, lock: &str) {
    c.query_one(
        "SELECT lockext.lock_acquire($1, 'dead-client', '1 millisecond')",
        &[&lock],
    )
    .expect("lock_acquire");
}

fn lease_exists(c: &mut Client, lock: &str) -> bool {
    c.query_one(
        "SELECT count(*) = 1 FROM lockext.locks WHERE lock_id = $1",
        &[&lock],
    )
    .expect("lease row")
    .get(0)
}

fn stat(c: &mut Client, name: &str) -> i64 {
    c.query_one(
        "SELECT coalesce(sum(value), 0)::bigint FROM lockext.stats WHERE name = $1",
        &[&name],
    )
    .expect("lockext.stats")
    .get(0)
}

#[test]
fn idle_databases_get_no_round_after_their_first_and_a_lease_expired_in_one_is_reaped() {
    let cluster = Cluster::start("ridle-idle", "lockext.reap_interval = '100ms'");
    let dbs = databases(&cluster, "idle", 12);
    let mut c = cluster.connect();
    // Every database has had its first round (which always runs).
    let before = eventually(GENEROUS, "a first round in every database", || {
        let r = rounds(&mut c);
        let all = dbs
            .iter()
            .chain(["postgres".to_string()].iter())
            .all(|db| r.get(db).is_some_and(|n| *n >= 1));
        all.then_some(r)
    });
    // A window that the reaper's own work marks: two leases expired in one database, one
    // after the other, each reaped. With rounds every 100 ms, the idle databases would
    // have had rounds meanwhile.
    let busy = &dbs[3];
    let mut b = cluster.connect_to(busy);
    for lock in ["first", "second"] {
        expired_lease(&mut b, lock);
        eventually(GENEROUS, "the expired lease reaped", || {
            (!lease_exists(&mut b, lock)).then_some(())
        });
    }
    let after = rounds(&mut c);
    let mut moved: Vec<String> = Vec::new();
    // (Not the template: a round there that stepped aside for a CREATE DATABASE copying
    // it is tried again, whenever that falls.)
    for (db, n) in &before {
        if db != busy && db != "idletmpl" && after.get(db) != Some(n) {
            moved.push(format!("{db}: {n} -> {:?}", after.get(db)));
        }
    }
    assert!(
        moved.is_empty(),
        "idle databases had rounds while one database's leases were reaped: {moved:?}"
    );
    assert!(
        after[busy] > before[busy],
        "the busy database's rounds are counted"
    );
    let reaped: i64 = c
        .query_one(
            "SELECT reaped_total FROM lockext.reaper_status() WHERE database = $1",
            &[busy],
        )
        .unwrap()
        .get(0);
    assert_eq!(reaped, 2, "both expired leases reaped by the reaper");
}

#[test]
fn reaper_status_shows_every_database() {
    let cluster = Cluster::start("ridle-status", "lockext.reap_interval = '100ms'");
    let dbs = databases(&cluster, "st", 40);
    let mut c = cluster.connect();
    // postgres too: its extension was created after the launcher's first look, so its row
    // may come after the new databases' (a rescan), which are noticed as they are made.
    let seen = eventually(
        GENEROUS,
        "a reaper_status row for each of 41 databases, postgres among them",
        || {
            let r = rounds(&mut c);
            (r.contains_key("postgres") && dbs.iter().all(|db| r.contains_key(db))).then_some(r)
        },
    );
    assert_eq!(seen.len(), 41, "one row per database: {seen:?}");
    assert_eq!(stat(&mut c, "reaper_databases_unseen"), 0);
}

#[test]
fn databases_beyond_reaper_databases_are_reaped_every_interval_counted_and_warned_about() {
    let cluster = Cluster::start(
        "ridle-full",
        "lockext.reap_interval = '100ms'\nlockext.reaper_databases = 16",
    );
    let dbs = databases(&cluster, "full", 20);
    let mut c = cluster.connect();
    eventually(GENEROUS, "reaper_status full", || {
        (rounds(&mut c).len() == 16).then_some(())
    });
    // Whether it has a row or not, each database's expired lease is reaped.
    let mut clients: Vec<Client> = dbs.iter().map(|db| cluster.connect_to(db)).collect();
    for b in clients.iter_mut() {
        expired_lease(b, "gone");
    }
    for (db, b) in dbs.iter().zip(clients.iter_mut()) {
        eventually(GENEROUS, &format!("the lease in {db} reaped"), || {
            (!lease_exists(b, "gone")).then_some(())
        });
    }
    assert_eq!(
        rounds(&mut c).len(),
        16,
        "no more rows than lockext.reaper_databases"
    );
    assert!(
        stat(&mut c, "reaper_databases_unseen") > 0,
        "the unseen rounds are counted"
    );
    let warnings = cluster
        .log()
        .lines()
        .filter(|l| l.contains("WARNING") && l.contains("reaper_status has no room"))
        .count();
    assert_eq!(
        warnings,
        1,
        "one WARNING per server start:\n{}",
        cluster.log()
    );
}

/// A parallel query whose two workers take every background worker slot left
/// (`max_worker_processes = 3`: lockext's launcher and them), until cancelled. Returns the
/// leader's pid and the thread that runs it.
fn hold_worker_slots(cluster: &Cluster) -> (i32, thread::JoinHandle<()>) {
    let mut c = cluster.connect();
    for attempt in 0..10 {
        let mut q = cluster.connect();
        let pid: i32 = q.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        let runner = thread::spawn(move || {
            // Ends when cancelled (an error), which is how the test ends it.
            let _ = q.batch_execute(
                "SET max_parallel_workers_per_gather = 2; SET parallel_setup_cost = 0; \
                 SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0; \
                 SELECT count(*) FROM slow_rows WHERE slow(i)",
            );
        });
        let workers = |c: &mut Client| -> i64 {
            c.query_one(
                "SELECT count(*) FROM pg_stat_activity \
                  WHERE backend_type = 'parallel worker' AND leader_pid = $1",
                &[&pid],
            )
            .unwrap()
            .get(0)
        };
        eventually(
            Duration::from_secs(30),
            "the parallel query's workers",
            || (workers(&mut c) >= 1).then_some(()),
        );
        let start = Instant::now();
        while workers(&mut c) < 2 && start.elapsed() < Duration::from_secs(3) {
            thread::sleep(Duration::from_millis(50));
        }
        if workers(&mut c) == 2 {
            return (pid, runner);
        }
        // A round had a slot when the query started: try again.
        c.query_one("SELECT pg_cancel_backend($1)", &[&pid])
            .unwrap();
        runner.join().unwrap();
        eprintln!("attempt {attempt}: the parallel query got fewer than 2 workers");
    }
    panic!("the parallel query never got both workers");
}

#[test]
fn with_every_worker_slot_taken_the_reaper_retries_without_backing_off() {
    let cluster = Cluster::start(
        "ridle-slots",
        "lockext.reap_interval = '200ms'\nmax_worker_processes = 3\n\
         max_logical_replication_workers = 0\nmax_parallel_workers = 2",
    );
    let mut c = cluster.connect();
    c.batch_execute(
        "CREATE TABLE slow_rows AS SELECT i FROM generate_series(1, 100000) AS i; \
         ANALYZE slow_rows; \
         CREATE FUNCTION slow(int) RETURNS boolean LANGUAGE plpgsql PARALLEL SAFE \
             AS $$BEGIN PERFORM pg_sleep(0.01); RETURN true; END$$",
    )
    .unwrap();
    eventually(GENEROUS, "the first round", || {
        rounds(&mut c)
            .get("postgres")
            .is_some_and(|n| *n >= 1)
            .then_some(())
    });
    let (pid, runner) = hold_worker_slots(&cluster);
    expired_lease(&mut c, "dead");
    // The slots stay taken for 35 s: with a back-off that doubles from 1 s, the next try
    // would then come about 28 s after they are free.
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(35) {
        assert!(
            lease_exists(&mut c, "dead"),
            "no round can run while the slots are taken"
        );
        thread::sleep(Duration::from_millis(500));
    }
    c.query_one("SELECT pg_cancel_backend($1)", &[&pid])
        .unwrap();
    runner.join().unwrap();
    eventually(
        Duration::from_secs(20),
        "the lease reaped once a slot is free",
        || (!lease_exists(&mut c, "dead")).then_some(()),
    );
    assert!(
        stat(&mut c, "reaper_slot_waits") > 0,
        "the waits are counted"
    );
    let lines = cluster
        .log()
        .lines()
        .filter(|l| l.contains("no background worker slot is free"))
        .count();
    assert_eq!(lines, 1, "said once, not at every try:\n{}", cluster.log());
}
