//! lockext on a Citus cluster (docs/citus.md): a coordinator and two workers, the lease
//! tables distributed by `lockext.citus_distribute()`, each call delegated to the node of
//! its lock id. PostgreSQL 16 or newer with Citus installed (`make citus`).
//!
//! - `citus_leases_through_the_coordinator_and_the_workers`: grant, renew, release through
//!   the coordinator and straight to either worker; what is refused (0A000); the reaper of
//!   each worker ends the expired leases of its own shards.
//! - `citus_fencing_and_a_leader_through_a_move`: a resource bound to the lock of its own
//!   id refuses a paused holder after its shard moved; a leader's observer holds up no move.
//! - `citus_tokens_rise_through_a_worker_failover`: a worker's synchronous standby promoted
//!   in its place while clients contend.
//! - `citus_waiting_in_order_and_through_a_move`: waiters in order, woken by releases, and
//!   one waiting through a move of its shard.
//! - `citus_extension_update_reaches_the_workers`: CREATE and ALTER EXTENSION on the
//!   coordinator reach every worker.
//! - `citus_tokens_rise_through_shard_moves_under_contention`: clients contend for lock ids
//!   through the coordinator while their shards move from the worker whose ledger is far
//!   ahead to the other and back, and a rebalance runs; from what the clients saw, no two
//!   holders at once and no token that goes back for a lock id. The checker is first shown a
//!   history it must reject, and the naive design (a token from each node's own counter,
//!   the article's sequence per node) run through the same move is shown to break it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use lockext_cluster_tests::checks::Checks;
use lockext_cluster_tests::citus::CitusCluster;
use lockext_cluster_tests::crash::{base_backup, wait_for_primary};
use lockext_cluster_tests::history::now_us;
use lockext_cluster_tests::{eventually, Client};

/// The SQLSTATE of an error, or "" for one without.
fn sqlstate(e: &postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_default()
}

fn distributed(shards: i32) -> CitusCluster {
    let cluster = CitusCluster::start("citus", 2, "");
    cluster
        .connect()
        .batch_execute(&format!("CALL lockext.citus_distribute({shards})"))
        .expect("lockext.citus_distribute");
    cluster
}

fn acquire(c: &mut Client, lock: &str, owner: &str) -> Result<Option<i64>, postgres::Error> {
    c.query_one(
        "SELECT fence_token FROM lockext.lock_acquire($1, $2, '30 seconds')",
        &[&lock, &owner],
    )
    .map(|row| row.get("fence_token"))
}

#[test]
fn citus_leases_through_the_coordinator_and_the_workers() {
    let cluster = CitusCluster::start("citus", 2, "");
    let mut checks = Checks::new("citus leases");
    let mut c = cluster.connect();
    // Before the tables are distributed, the coordinator is a lock service of its own: its
    // tokens are history every grant after citus_distribute must start above.
    let mut before = 0;
    for _ in 0..30 {
        before = acquire(&mut c, "pre", "me")
            .expect("acquire pre")
            .expect("granted");
        c.batch_execute("SELECT lockext.lock_release('pre', 'me')")
            .expect("release pre");
    }
    c.batch_execute("CALL lockext.citus_distribute(8)")
        .expect("lockext.citus_distribute");
    // Run again: nothing changes (each step is skipped once done).
    c.batch_execute("CALL lockext.citus_distribute(8)")
        .expect("lockext.citus_distribute again");
    let after = acquire(&mut c, "pre", "me")
        .expect("acquire pre")
        .expect("granted");
    checks.check(
        after > before,
        format!("the first grant after citus_distribute is above the last before it ({after} > {before})"),
    );

    let t1 = acquire(&mut c, "a", "me")
        .expect("acquire a")
        .expect("granted");
    let rival = acquire(&mut c, "a", "you").expect("acquire a by another");
    checks.check(
        rival.is_none(),
        format!("a held: another owner is refused ({rival:?})"),
    );
    let renewed: Option<std::time::SystemTime> = c
        .query_one(
            "SELECT lockext.lock_renew('a', 'me', '30 seconds') AS r",
            &[],
        )
        .expect("renew")
        .get("r");
    checks.check(renewed.is_some(), "renewed through the coordinator".into());
    let released: bool = c
        .query_one("SELECT lockext.lock_release('a', 'me') AS r", &[])
        .expect("release")
        .get("r");
    checks.check(released, "released through the coordinator".into());
    let t2 = acquire(&mut c, "a", "you")
        .expect("acquire a again")
        .expect("granted");
    checks.check(
        t2 > t1,
        format!("the next grant of a is above the last ({t2} > {t1})"),
    );

    // A leader's value goes with its release, on the worker of its shard (the release's
    // second statement, on the shard of the values).
    c.batch_execute("SELECT lockext.lock_campaign('chair', 'me', '30 seconds', '{\"at\": 1}')")
        .expect("campaign");
    let values = |c: &mut Client| -> i64 {
        c.query_one(
            "SELECT count(*) FROM lockext.lease_values WHERE lock_id = 'chair'",
            &[],
        )
        .expect("values of chair")
        .get(0)
    };
    let before = values(&mut c);
    c.batch_execute("SELECT lockext.lock_release('chair', 'me')")
        .expect("release");
    let after = values(&mut c);
    checks.check(
        (before, after) == (1, 0),
        format!("the released leader's value is gone (values before, after: {before}, {after})"),
    );

    // Shared leases side by side, and a semaphore's permits, through the coordinator.
    let shared: Vec<Option<i64>> = ["r1", "r2"]
        .iter()
        .map(|owner| {
            c.query_one(
                "SELECT fence_token FROM lockext.lock_acquire('s', $1, '30 seconds', mode => 'shared')",
                &[owner],
            )
            .expect("shared acquire")
            .get("fence_token")
        })
        .collect();
    let writer = acquire(&mut c, "s", "w").expect("exclusive acquire of s");
    checks.check(
        shared.iter().all(Option::is_some) && shared[0] < shared[1] && writer.is_none(),
        format!("two shared leases of s ({shared:?}), an exclusive one refused ({writer:?})"),
    );
    let permits: Vec<Option<i64>> = ["p1", "p2", "p3"]
        .iter()
        .map(|owner| {
            c.query_one(
                "SELECT fence_token FROM lockext.lock_acquire('sem', $1, '30 seconds', permits => 2)",
                &[owner],
            )
            .expect("permit acquire")
            .get("fence_token")
        })
        .collect();
    checks.check(
        permits[0].is_some() && permits[1].is_some() && permits[2].is_none(),
        format!("a semaphore of 2 permits: two granted, the third refused ({permits:?})"),
    );

    // Straight to each worker: the one that holds the shard runs it, the other forwards it.
    let shard = cluster.shard_of("lockext.locks", "b");
    let home = cluster.node_port_of_shard(shard);
    let mut tokens = Vec::new();
    for worker in &cluster.workers {
        let mut w = worker.connect();
        tokens.push(acquire(&mut w, "b", "me").expect("acquire b on a worker"));
    }
    checks.check(
        tokens[0].is_some() && tokens[0] == tokens[1],
        format!("b from either worker (home port {home}): one grant, its retry answered with it ({tokens:?})"),
    );
    let high: i64 = c
        .query_one(
            "SELECT high FROM lockext.lock_tokens WHERE lock_id = 'b'",
            &[],
        )
        .expect("lock_tokens of b")
        .get("high");
    checks.check(
        Some(high) == tokens[0],
        format!("b's highest is recorded ({high})"),
    );
    // lockext.holders on the coordinator: a query of every worker's shards.
    let shown: Vec<(String, i64)> = c
        .query(
            "SELECT owner, fence_token FROM lockext.holders WHERE lock_id = 'b'",
            &[],
        )
        .expect("lockext.holders through the coordinator")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    checks.check(
        tokens[0].is_some_and(|t| shown == [("me".to_string(), t)]),
        format!("lockext.holders on the coordinator shows b's grant ({shown:?})"),
    );

    // Refused on a distributed installation, with 0A000, changing nothing.
    let refused = |c: &mut Client, sql: &str| match c.batch_execute(sql) {
        Ok(()) => "no error".to_string(),
        Err(e) => sqlstate(&e),
    };
    for sql in [
        "BEGIN; SELECT lockext.lock_acquire('c', 'me', '30 seconds'); COMMIT",
        "SELECT lockext.lock_acquire('c', 'me', '30 seconds', session_bound => true)",
        "SELECT lockext.lock_acquire_all(ARRAY['c', 'd'], 'me', '30 seconds')",
        // A resource not bound to the lock of its own id.
        "SELECT lockext.fenced_update('r', 1, '{}')",
        "SELECT lockext.fence('r', 1)",
        "SELECT lockext.check_token(1)",
        "SELECT lockext.lock_release_all(ARRAY['c', 'd'], 'me')",
        "SELECT lockext.lock_keepalive_grant('30 seconds')",
        "BEGIN; SELECT * FROM lockext.lock_holders('c'); COMMIT",
        "BEGIN; SELECT lockext.lock_renew('a', 'you', '30 seconds'); COMMIT",
        "SELECT lockext.declare_token(1)",
        // Not delegated (a CTE): run on the coordinator, which holds no shard.
        "WITH g AS (SELECT * FROM lockext.lock_acquire('c', 'me', '30 seconds')) SELECT * FROM g",
    ] {
        let code = refused(&mut c, sql);
        let _ = c.batch_execute("ROLLBACK");
        checks.check(
            code == "0A000",
            format!("refused with 0A000: {sql} ({code})"),
        );
    }
    // Not delegated on a worker that does not hold c: 0A000 too, not a 40001 that a
    // client would retry for ever.
    let c_home = cluster.node_port_of_shard(cluster.shard_of("lockext.locks", "c"));
    let other = cluster
        .workers
        .iter()
        .find(|w| w.port != c_home)
        .expect("the other worker");
    let mut o = other.connect();
    let code = refused(
        &mut o,
        "WITH g AS (SELECT * FROM lockext.lock_acquire('c', 'me', '30 seconds')) SELECT * FROM g",
    );
    checks.check(
        code == "0A000",
        format!("a CTE on the worker that does not hold c: refused with 0A000 ({code})"),
    );
    let c_rows: i64 = c
        .query_one(
            "SELECT count(*) AS n FROM lockext.locks WHERE lock_id = 'c'",
            &[],
        )
        .expect("count c")
        .get("n");
    checks.check(c_rows == 0, "the refused calls granted nothing".into());

    // The reaper of the worker that holds e's shard ends its expired lease.
    c.query_one("SELECT lockext.lock_acquire('e', 'me', '1 second')", &[])
        .expect("acquire e");
    eventually(Duration::from_secs(30), "the reaper ends e's lease", || {
        let n: i64 = c
            .query_one(
                "SELECT count(*) AS n FROM lockext.locks WHERE lock_id = 'e'",
                &[],
            )
            .ok()?
            .get("n");
        (n == 0).then_some(())
    });
    checks.check(true, "a worker's reaper ended e's expired lease".into());
    for node in cluster.nodes() {
        let log = node.log();
        let failed = log
            .lines()
            .filter(|l| l.contains("reaper") && l.contains("failed"))
            .count();
        checks.check(
            failed == 0,
            format!("{}: no failed reaper round ({failed})", node.name),
        );
    }
    checks.finish();
}

/// One exclusive grant as a client saw it: when it sent the acquire and heard the token,
/// and when it sent the release that succeeded (microseconds of the clients' clock).
#[derive(Clone, Debug)]
struct Grant {
    lock: String,
    token: i64,
    sent: i64,
    acked: i64,
    release_sent: i64,
}

/// Every violation of the two promises in `grants`: a grant asked for after another of the
/// same lock id was answered, with a token not above it; two grants of one lock id held at
/// once (each surely held from its answer to its release's sending; one whose release
/// never succeeded, `i64::MIN`, is left out of this check).
fn violations(grants: &[Grant]) -> Vec<String> {
    let mut out = Vec::new();
    let mut locks: Vec<&str> = grants.iter().map(|g| g.lock.as_str()).collect();
    locks.sort_unstable();
    locks.dedup();
    for lock in locks {
        let mut of: Vec<&Grant> = grants.iter().filter(|g| g.lock == lock).collect();
        of.sort_by_key(|g| g.acked);
        // Tokens: the highest token answered before each grant was asked for.
        let mut highest = Vec::with_capacity(of.len());
        let mut max = i64::MIN;
        for g in &of {
            max = max.max(g.token);
            highest.push(max);
        }
        for g in &of {
            // The same token again is the same grant, answered again to its owner's retry,
            // when its release never succeeded (its lease was still live).
            if of
                .iter()
                .any(|a| a.token == g.token && a.release_sent == i64::MIN && a.acked < g.acked)
            {
                continue;
            }
            let before = of.partition_point(|a| a.acked < g.sent);
            if before > 0 && highest[before - 1] >= g.token {
                out.push(format!(
                    "{lock}: token {} asked for after {} was answered",
                    g.token,
                    highest[before - 1]
                ));
            }
        }
        // Holders: answers in order, none before the release of an earlier one was sent.
        let mut held_until = (i64::MIN, 0i64);
        for g in of.iter().filter(|g| g.release_sent != i64::MIN) {
            if g.acked < held_until.0 {
                out.push(format!(
                    "{lock}: token {} answered while token {} was held",
                    g.token, held_until.1
                ));
            }
            if g.release_sent > held_until.0 {
                held_until = (g.release_sent, g.token);
            }
        }
    }
    out
}

/// Clients that acquire and release `locks` through `coordinator` until `stop`; each grant
/// as its client saw it. A call refused with 40001 (its shard moved under it) is called
/// again, as a client would; any other error fails the test.
fn contend(
    port: u16,
    locks: Vec<String>,
    clients: usize,
    stop: Arc<AtomicBool>,
    acquire_sql: &'static str,
) -> Vec<thread::JoinHandle<(Vec<Grant>, u64)>> {
    contend_through(port, locks, clients, stop, acquire_sql, false)
}

/// As `contend`; with `outages`, an error other than 40001 (a worker down: the coordinator
/// cannot reach it) is not a failure either: the call is given up, and the client connects
/// again if its connection is gone. A grant whose release never succeeded is left out of
/// the holders' check (it was held until its lease expired, which no client saw) but not of
/// the tokens' check.
fn contend_through(
    port: u16,
    locks: Vec<String>,
    clients: usize,
    stop: Arc<AtomicBool>,
    acquire_sql: &'static str,
    outages: bool,
) -> Vec<thread::JoinHandle<(Vec<Grant>, u64)>> {
    (0..clients)
        .map(|n| {
            let locks = locks.clone();
            let stop = stop.clone();
            thread::spawn(move || {
                let url = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");
                let mut c = Client::connect(&url, postgres::NoTls).expect("connect");
                let owner = format!("client-{n}");
                let (mut grants, mut retries) = (Vec::new(), 0u64);
                let mut i = n;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let lock = &locks[i % locks.len()];
                    let sent = now_us();
                    let token: Option<i64> = match c.query_one(acquire_sql, &[lock, &owner]) {
                        Ok(row) => row.get(0),
                        Err(e) if sqlstate(&e) == "40001" => {
                            retries += 1;
                            continue;
                        }
                        Err(_) if outages => {
                            retries += 1;
                            if c.is_closed() {
                                c = reconnect(&url);
                            }
                            thread::sleep(Duration::from_millis(20));
                            continue;
                        }
                        Err(e) => panic!("{owner}: acquire {lock}: {e}"),
                    };
                    let acked = now_us();
                    let Some(token) = token else { continue };
                    let release_sent = loop {
                        let at = now_us();
                        match c.query_one("SELECT lockext.lock_release($1, $2)", &[lock, &owner]) {
                            Ok(_) => break at,
                            Err(e) if sqlstate(&e) == "40001" => retries += 1,
                            Err(_) if outages => {
                                // Held until it expires: no client saw when.
                                if c.is_closed() {
                                    c = reconnect(&url);
                                }
                                break i64::MIN;
                            }
                            Err(e) => panic!("{owner}: release {lock}: {e}"),
                        }
                    };
                    grants.push(Grant {
                        lock: lock.clone(),
                        token,
                        sent,
                        acked,
                        release_sent,
                    });
                }
                (grants, retries)
            })
        })
        .collect()
}

/// Stops the clients of `contend` and gathers what they saw: every grant, and how many calls
/// were refused (or failed, with outages) and given up.
fn stop_clients(
    stop: &AtomicBool,
    clients: Vec<thread::JoinHandle<(Vec<Grant>, u64)>>,
) -> (Vec<Grant>, u64) {
    stop.store(true, Ordering::Relaxed);
    let (mut grants, mut refused) = (Vec::new(), 0);
    for client in clients {
        let (g, r) = client.join().expect("a client");
        grants.extend(g);
        refused += r;
    }
    (grants, refused)
}

fn reconnect(url: &str) -> Client {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Client::connect(url, postgres::NoTls) {
            Ok(c) => return c,
            Err(e) if Instant::now() > deadline => panic!("reconnect: {e}"),
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Lock ids whose shards are on `port`, `n` of them, each in a shard of its own.
fn locks_on(cluster: &CitusCluster, port: u16, prefix: &str, n: usize) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = Vec::new();
    for i in 0.. {
        let lock = format!("{prefix}{i}");
        let shard = cluster.shard_of("lockext.locks", &lock);
        if cluster.node_port_of_shard(shard) == port && !out.iter().any(|(_, s)| *s == shard) {
            out.push((lock, shard));
            if out.len() == n {
                break;
            }
        }
    }
    out
}

#[test]
fn citus_tokens_rise_through_shard_moves_under_contention() {
    let mut checks = Checks::new("citus moves");
    // The checker rejects a history that breaks each promise.
    let bad = |token, sent, acked, release_sent| Grant {
        lock: "x".into(),
        token,
        sent,
        acked,
        release_sent,
    };
    let backwards = violations(&[bad(10, 0, 1, 2), bad(5, 3, 4, 5)]);
    let overlap = violations(&[bad(10, 0, 1, 5), bad(11, 2, 3, 6)]);
    let fine = violations(&[bad(10, 0, 1, 2), bad(11, 3, 4, 5)]);
    checks.check(
        backwards.len() == 1 && overlap.len() == 1 && fine.is_empty(),
        format!("the checker: {backwards:?} {overlap:?} {fine:?}"),
    );

    let cluster = distributed(8);
    let (w1, w2) = (cluster.workers[0].port, cluster.workers[1].port);
    // Worker 1's ledger far ahead of worker 2's: 1 500 grants of one lock id on it.
    let warm = &locks_on(&cluster, w1, "warm-", 1)[0].0;
    let mut w = cluster.worker(w1).connect();
    for _ in 0..1500 {
        acquire(&mut w, warm, "warm")
            .expect("warm")
            .expect("granted");
        w.query_one("SELECT lockext.lock_release($1, 'warm')", &[warm])
            .expect("release warm");
    }
    let mut c = cluster.connect();
    let hot = locks_on(&cluster, w1, "hot-", 2);
    let cold = locks_on(&cluster, w2, "cold-", 2);
    let locks: Vec<String> = hot.iter().chain(&cold).map(|(l, _)| l.clone()).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let clients = contend(
        cluster.coordinator.port,
        locks.clone(),
        4,
        stop.clone(),
        "SELECT fence_token FROM lockext.lock_acquire($1, $2, '30 seconds')",
    );
    thread::sleep(Duration::from_secs(2));
    // The hot ids' shards to the worker whose ledger is behind, the cold ones' the other
    // way, then back, then a rebalance: each while the clients contend.
    for (_, shard) in &hot {
        cluster.move_shard(*shard, w1, w2);
    }
    for (_, shard) in &cold {
        cluster.move_shard(*shard, w2, w1);
    }
    thread::sleep(Duration::from_secs(1));
    for (_, shard) in &hot {
        cluster.move_shard(*shard, w2, w1);
    }
    cluster.rebalance();
    thread::sleep(Duration::from_secs(1));
    let (grants, retries) = stop_clients(&stop, clients);
    println!(
        "citus moves: {} grants of {} lock ids in {:?}, {retries} calls refused with 40001 and called again",
        grants.len(),
        locks.len(),
        started.elapsed()
    );
    for lock in &locks {
        let n = grants.iter().filter(|g| &g.lock == lock).count();
        checks.check(n >= 20, format!("{lock}: {n} grants"));
    }
    let found = violations(&grants);
    checks.check(
        found.is_empty(),
        format!(
            "no token back, no two holders: {:?}",
            &found[..found.len().min(5)]
        ),
    );
    // Every grant acknowledged is the lock id's highest or below it, wherever its shard is.
    for lock in &locks {
        let high: i64 = c
            .query_one(
                "SELECT high FROM lockext.lock_tokens WHERE lock_id = $1",
                &[lock],
            )
            .expect("high")
            .get("high");
        let seen = grants
            .iter()
            .filter(|g| &g.lock == lock)
            .map(|g| g.token)
            .max();
        checks.check(
            seen <= Some(high),
            format!("{lock}: highest {high} >= every token seen {seen:?}"),
        );
    }

    // The naive design through the same move: a token from each node's own counter.
    c.batch_execute(NAIVE).expect("the naive stand-in");
    for worker in &cluster.workers {
        worker
            .connect()
            .batch_execute("SET citus.enable_ddl_propagation = off; CREATE SEQUENCE naive.counter")
            .expect("a counter on each worker");
    }
    let (naive_lock, naive_shard) = locks_on(&cluster, w1, "naive-", 1).remove(0);
    let mut naive = Vec::new();
    let mut grant_naive = |c: &mut Client| {
        let sent = now_us();
        let token: i64 = c
            .query_one("SELECT naive.acquire($1, 'me')", &[&naive_lock])
            .expect("naive acquire")
            .get(0);
        let acked = now_us();
        naive.push(Grant {
            lock: naive_lock.clone(),
            token,
            sent,
            acked,
            release_sent: acked,
        });
    };
    for _ in 0..50 {
        grant_naive(&mut c);
    }
    grant_naive(&mut c);
    cluster.move_shard(naive_shard, w1, w2);
    grant_naive(&mut c);
    let naive_found = violations(&naive);
    checks.check(
        !naive_found.is_empty(),
        format!("the naive design gives a token back after the move: {naive_found:?}"),
    );
    checks.finish();
}

/// The article's design on Citus: a lease table distributed by lock id, and a token from a
/// sequence of the node the call runs on (`naive.counter`, made on each worker by hand:
/// Citus does not create a standalone sequence on the workers).
const NAIVE: &str = "
CREATE SCHEMA naive;
CREATE TABLE naive.leases (lock_id text PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL);
SELECT create_distributed_table('naive.leases', 'lock_id', colocate_with => 'lockext.locks');
CREATE FUNCTION naive.acquire(lock text, who text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE t bigint;
BEGIN
  t := nextval('naive.counter');
  INSERT INTO naive.leases VALUES (lock, who, t)
    ON CONFLICT (lock_id) DO UPDATE SET owner = excluded.owner, token = excluded.token;
  RETURN t;
END $$;
SELECT create_distributed_function('naive.acquire(text,text)', '$1', colocate_with => 'naive.leases');
";

/// A holder that stops (a pause, as the article's) past its lease while its lock id's shard
/// moves to the worker whose ledger is behind: the next holder's token is above its, and
/// the resource, checking tokens as the article does (`UPDATE ... WHERE token < $1`, on a
/// table distributed by lock id), refuses the paused holder's write when it resumes.
#[test]
fn citus_a_paused_holder_is_fenced_after_a_move() {
    let mut checks = Checks::new("citus pause");
    let cluster = distributed(8);
    let (w1, w2) = (cluster.workers[0].port, cluster.workers[1].port);
    let mut c = cluster.connect();
    c.batch_execute(
        "CREATE TABLE resource (lock_id text PRIMARY KEY, token bigint NOT NULL, data text);
         SELECT create_distributed_table('resource', 'lock_id', colocate_with => 'lockext.locks')",
    )
    .expect("the resource");
    let (lock, shard) = locks_on(&cluster, w1, "job-", 1).remove(0);
    // Worker 1's ledger ahead of worker 2's.
    let mut w = cluster.worker(w1).connect();
    for _ in 0..300 {
        acquire(&mut w, &lock, "warm")
            .expect("warm")
            .expect("granted");
        w.query_one("SELECT lockext.lock_release($1, 'warm')", &[&lock])
            .expect("release");
    }
    let write = |c: &mut Client, token: i64, who: &str| -> u64 {
        c.execute(
            "INSERT INTO resource VALUES ($1, $2, $3) ON CONFLICT (lock_id) DO UPDATE \
             SET token = excluded.token, data = excluded.data WHERE resource.token < excluded.token",
            &[&lock, &token, &who],
        )
        .expect("write to the resource")
    };
    let a: i64 = c
        .query_one(
            "SELECT fence_token FROM lockext.lock_acquire($1, 'a', '1 second')",
            &[&lock],
        )
        .expect("a acquires")
        .get::<_, Option<i64>>(0)
        .expect("a is granted");
    checks.check(write(&mut c, a, "a") == 1, format!("a writes with {a}"));
    // a stops here; its lease runs out while the shard moves.
    cluster.move_shard(shard, w1, w2);
    thread::sleep(Duration::from_millis(1200));
    let b: i64 = c
        .query_one(
            "SELECT fence_token FROM lockext.lock_acquire($1, 'b', '30 seconds')",
            &[&lock],
        )
        .expect("b acquires")
        .get::<_, Option<i64>>(0)
        .expect("b is granted once a's lease ran out");
    checks.check(
        b > a,
        format!("b's token, minted on the other worker, is above a's ({b} > {a})"),
    );
    checks.check(write(&mut c, b, "b") == 1, format!("b writes with {b}"));
    checks.check(
        write(&mut c, a, "a again") == 0,
        "a resumes: its write is refused".into(),
    );
    let data: String = c
        .query_one("SELECT data FROM resource WHERE lock_id = $1", &[&lock])
        .expect("read")
        .get(0);
    checks.check(
        data == "b",
        format!("the resource holds b's write ({data})"),
    );
    checks.finish();
}

/// lockext's own fencing and leader election on the cluster, through a move of their
/// shards: a resource bound to the lock of its own id refuses a paused holder after the move
/// (and a member presenting another role's grant, and an unbound resource with 0A000); a
/// leader's observer does not hold up the move (its shard's metadata lock is released after
/// each look), hears 40001 once the shard has gone, and on calling again sees the leader's
/// new value.
#[test]
fn citus_fencing_and_a_leader_through_a_move() {
    let mut checks = Checks::new("citus fencing and election");
    let cluster = distributed(8);
    let (w1, w2) = (cluster.workers[0].port, cluster.workers[1].port);
    let mut c = cluster.connect();
    c.batch_execute("CREATE ROLE mallory LOGIN; GRANT lockext_user TO mallory")
        .expect("mallory");
    let mut found = locks_on(&cluster, w1, "acct-", 2);
    let (leader_lock, leader_shard) = found.remove(1);
    let (lock, shard) = found.remove(0);
    let code = |r: Result<postgres::Row, postgres::Error>| match r {
        Ok(_) => "no error".to_string(),
        Err(e) => sqlstate(&e),
    };

    // What cannot be kept is refused: a resource bound to another lock, or to none.
    let other = code(c.query_one("SELECT lockext.bind_resource($1, 'elsewhere')", &[&lock]));
    let unbound = code(c.query_one("SELECT lockext.fenced_update($1, 1, '{}')", &[&lock]));
    checks.check(
        other == "0A000" && unbound == "0A000",
        format!("bound to another lock, or unbound: refused with 0A000 ({other}, {unbound})"),
    );
    c.query_one("SELECT lockext.bind_resource($1, $1)", &[&lock])
        .expect("bind the resource to its own lock");

    let fenced = |c: &mut Client, token: i64, by: &str| -> bool {
        c.query_one(
            "SELECT lockext.fenced_update($1, $2, jsonb_build_object('by', $3::text))",
            &[&lock, &token, &by],
        )
        .expect("fenced_update")
        .get(0)
    };
    // The document fenced_read returns, as text (a lone call, which Citus delegates; the
    // lock ids here need no quoting).
    let read = |c: &mut Client, token: i64| -> Result<String, String> {
        let messages = c
            .simple_query(&format!("SELECT lockext.fenced_read('{lock}', {token})"))
            .map_err(|e| sqlstate(&e))?;
        Ok(messages
            .iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                _ => None,
            })
            .unwrap_or_default())
    };
    let a: i64 = c
        .query_one(
            "SELECT fence_token FROM lockext.lock_acquire($1, 'a', '1 second')",
            &[&lock],
        )
        .expect("a acquires")
        .get::<_, Option<i64>>(0)
        .expect("a is granted");
    checks.check(fenced(&mut c, a, "a"), format!("a writes with {a}"));
    checks.check(
        read(&mut c, a) == Ok(r#"{"by": "a"}"#.into()),
        "a reads its write".into(),
    );

    // A leader, and an observer through the coordinator waiting for its value to change.
    let leader: i64 = c
        .query_one(
            "SELECT fence_token FROM lockext.lock_campaign($1, 'n1', '300 seconds', '{\"addr\": 1}')",
            &[&leader_lock],
        )
        .expect("campaign")
        .get::<_, Option<i64>>(0)
        .expect("n1 leads");
    let coordinator = cluster.coordinator.port;
    let watched = leader_lock.clone();
    let observer = thread::spawn(move || {
        let mut o = Client::connect(
            &format!("host=127.0.0.1 port={coordinator} user=postgres dbname=postgres"),
            postgres::NoTls,
        )
        .expect("observer connects");
        // Each outcome: an error's SQLSTATE, or whether it changed and the version.
        let mut outcomes: Vec<Result<(bool, i64), String>> = Vec::new();
        loop {
            let r = o.query_one(
                "SELECT changed, version FROM lockext.lock_observe($1, $2, 1, '60 seconds')",
                &[&watched, &leader],
            );
            let outcome = r
                .map(|row| {
                    (
                        row.get::<_, bool>(0),
                        row.get::<_, Option<i64>>(1).unwrap_or(0),
                    )
                })
                .map_err(|e| sqlstate(&e));
            let done = !matches!(&outcome, Err(code) if code == "40001");
            outcomes.push(outcome);
            if done || outcomes.len() > 20 {
                return outcomes;
            }
        }
    });
    // Both shards move to worker 2 (whose ledger is behind) while a is paused and the
    // observer waits (seen waiting on the worker, in its delegated call).
    let mut w = cluster.worker(w1).connect();
    eventually(
        Duration::from_secs(30),
        "the observer waits on worker 1",
        || {
            let n: i64 = w
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                  WHERE state = 'active' AND query LIKE '%lock_observe%' \
                    AND pid <> pg_backend_pid()",
                    &[],
                )
                .ok()?
                .get(0);
            (n > 0).then_some(())
        },
    );
    cluster.move_shard(shard, w1, w2);
    if leader_shard != shard {
        cluster.move_shard(leader_shard, w1, w2);
    }
    thread::sleep(Duration::from_millis(1200));

    // a's lease has run out: refused at once, before anyone else writes.
    checks.check(
        !fenced(&mut c, a, "a, expired"),
        "a's write once its lease ran out: refused".into(),
    );
    let b: i64 = c
        .query_one(
            "SELECT fence_token FROM lockext.lock_acquire($1, 'b', '30 seconds')",
            &[&lock],
        )
        .expect("b acquires")
        .get::<_, Option<i64>>(0)
        .expect("b is granted once a's lease ran out");
    checks.check(
        b > a,
        format!("b's token, minted on the other worker, is above a's ({b} > {a})"),
    );
    checks.check(fenced(&mut c, b, "b"), format!("b writes with {b}"));
    checks.check(!fenced(&mut c, a, "a again"), "a resumes: refused".into());
    let stale = read(&mut c, a);
    checks.check(
        stale == Err("55L01".into()),
        format!("a's read: 55L01 ({stale:?})"),
    );
    let mut m = cluster.coordinator.connect_as("mallory", "postgres");
    let forged: bool = m
        .query_one(
            "SELECT lockext.fenced_update($1, $2, '{\"by\": \"mallory\"}')",
            &[&lock, &b],
        )
        .expect("mallory's write")
        .get(0);
    checks.check(!forged, "mallory, with b's token: refused".into());
    let checked: Vec<bool> = [a, b]
        .iter()
        .map(|t| {
            m.query_one("SELECT lockext.lock_check($1, $2)", &[&lock, t])
                .expect("lock_check by a member")
                .get(0)
        })
        .collect();
    checks.check(
        checked == [false, true],
        format!("lock_check by a member (mallory): a's grant ended, b's live ({checked:?})"),
    );
    checks.check(
        read(&mut c, b) == Ok(r#"{"by": "b"}"#.into()),
        "the resource holds b's write".into(),
    );
    let live: Vec<bool> = [a, b]
        .iter()
        .map(|t| {
            c.query_one("SELECT lockext.lock_check($1, $2)", &[&lock, t])
                .expect("lock_check")
                .get(0)
        })
        .collect();
    checks.check(
        live == [false, true],
        format!("lock_check: a's grant ended, b's live ({live:?})"),
    );

    // The leader proclaims a new value; the observer, called again after the move, sees it.
    let version: i64 = c
        .query_one(
            "SELECT lockext.lock_set_value($1, 'n1', $2, '{\"addr\": 2}')",
            &[&leader_lock, &leader],
        )
        .expect("set value")
        .get(0);
    let outcomes = observer.join().expect("observer");
    println!("citus fencing: observer outcomes {outcomes:?}");
    // Had the observer held its shard's metadata lock while it waited, the move would have
    // waited for its 60 seconds to end, and its first answer would be "no change"; a 40001
    // is the sign of a move ended while it waited.
    checks.check(
        outcomes.first() == Some(&Err("40001".into())),
        "the observer held up no move: its first answer is 40001, the shard gone".into(),
    );
    checks.check(
        outcomes.last() == Some(&Ok((true, version)))
            && outcomes[..outcomes.len() - 1]
                .iter()
                .all(|o| o == &Err("40001".into())),
        format!("the observer: 40001 after the move, then the new value, version {version}"),
    );
    let holders: Vec<(String, i64, String)> = c
        .query(
            "SELECT owner, version, value ->> 'addr' FROM lockext.lock_holders($1)",
            &[&leader_lock],
        )
        .expect("holders")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    checks.check(
        holders == [("n1".to_string(), 2, "2".to_string())],
        format!("lock_holders on the new worker: {holders:?}"),
    );
    checks.finish();
}

/// `CREATE EXTENSION` and `ALTER EXTENSION ... UPDATE` on the coordinator reach every
/// worker (Citus propagates them): lockext 0.3.0 created on the coordinator is on every node,
/// the update to this version is too, and the grants after `citus_distribute` are above those
/// the coordinator gave before it.
#[test]
fn citus_extension_update_reaches_the_workers() {
    let mut checks = Checks::new("citus update");
    let cluster = CitusCluster::start("citus-update", 2, "");
    let mut c = cluster.connect();
    c.batch_execute("DROP EXTENSION lockext; CREATE EXTENSION lockext VERSION '0.3.0'")
        .expect("lockext 0.3.0 on the coordinator");
    let versions = |cluster: &CitusCluster| -> Vec<Option<String>> {
        cluster
            .nodes()
            .map(|node| cluster.lockext_version(node))
            .collect()
    };
    let before = versions(&cluster);
    checks.check(
        before.iter().all(|v| v.as_deref() == Some("0.3.0")),
        format!("0.3.0 on every node ({before:?})"),
    );
    let old = acquire(&mut c, "old", "me")
        .expect("a 0.3.0 grant")
        .expect("granted");
    c.batch_execute("ALTER EXTENSION lockext UPDATE")
        .expect("update on the coordinator");
    let want: String = c
        .query_one(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'lockext'",
            &[],
        )
        .expect("default version")
        .get(0);
    let after = versions(&cluster);
    checks.check(
        after.iter().all(|v| v.as_deref() == Some(want.as_str())),
        format!("{want} on every node after the update ({after:?})"),
    );
    c.batch_execute("CALL lockext.citus_distribute(8)")
        .expect("distribute after the update");
    let new = acquire(&mut c, "new", "me")
        .expect("a grant on the cluster")
        .expect("granted");
    checks.check(
        new > old,
        format!("the first grant on the cluster is above the 0.3.0 one ({new} > {old})"),
    );
    checks.finish();
}

/// Waiting on the cluster (`wait`): the waiters of a lock id queue on its node, first come
/// first served, and a release wakes the head; a waiter holds up no move of its shard (it
/// lets go of the shard's metadata lock between its tries), hears 40001 once the shard has
/// gone, and called again waits on the new node, where the release wakes it.
#[test]
fn citus_waiting_in_order_and_through_a_move() {
    let mut checks = Checks::new("citus waiting");
    let cluster = distributed(8);
    let (w1, w2) = (cluster.workers[0].port, cluster.workers[1].port);
    let mut found = locks_on(&cluster, w1, "queue-", 2);
    let (moving, moving_shard) = found.remove(1);
    let (lock, _) = found.remove(0);
    let coordinator = cluster.coordinator.port;
    let mut c = cluster.connect();
    // A waiter through the node at `port` (the coordinator, or straight to a worker): every
    // answer (a token, or an error's SQLSTATE) until it is granted or refused with something
    // else than 40001.
    let waiter_at = |port: u16, lock: String, owner: &'static str| {
        thread::spawn(move || {
            let mut w = Client::connect(
                &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"),
                postgres::NoTls,
            )
            .expect("waiter connects");
            let mut answers: Vec<Result<Option<i64>, String>> = Vec::new();
            loop {
                let answer = w
                    .query_one(
                        "SELECT fence_token FROM lockext.lock_acquire($1, $2, '30 seconds', \
                         wait => '120 seconds')",
                        &[&lock, &owner],
                    )
                    .map(|row| row.get::<_, Option<i64>>(0))
                    .map_err(|e| sqlstate(&e));
                let again = answer == Err("40001".into()) && answers.len() < 5;
                answers.push(answer);
                if !again {
                    return answers;
                }
            }
        })
    };
    let waiter = |lock: String, owner: &'static str| waiter_at(coordinator, lock, owner);
    // How many wait for `lock` on the node at `port` (lockext.waiters is each node's own).
    let waiting = |port: u16, lock: &str, n: i64| {
        let mut w = cluster.worker(port).connect();
        eventually(
            Duration::from_secs(30),
            &format!("{n} waiting for {lock}"),
            || {
                let got: i64 = w
                    .query_one(
                        "SELECT count(*) FROM lockext.waiters WHERE lock_id = $1",
                        &[&lock],
                    )
                    .ok()?
                    .get(0);
                (got == n).then_some(())
            },
        );
    };

    // In order: a holds; b, then c, wait; each release wakes the next.
    let a = acquire(&mut c, &lock, "a")
        .expect("a")
        .expect("a is granted");
    let b = waiter(lock.clone(), "b");
    waiting(w1, &lock, 1);
    let cw = waiter(lock.clone(), "c");
    waiting(w1, &lock, 2);
    c.query_one("SELECT lockext.lock_release($1, 'a')", &[&lock])
        .expect("a releases");
    let b = b.join().expect("b");
    let b_token = match b.as_slice() {
        [Ok(Some(t))] => *t,
        other => panic!("b's answers: {other:?}"),
    };
    checks.check(
        b_token > a,
        format!("b, first in line, granted ({b_token} > {a})"),
    );
    c.query_one("SELECT lockext.lock_release($1, 'b')", &[&lock])
        .expect("b releases");
    let cw = cw.join().expect("c");
    checks.check(
        matches!(cw.as_slice(), [Ok(Some(t))] if *t > b_token),
        format!("c, second in line, granted after b ({cw:?})"),
    );

    // Through a move: d holds; e (through the coordinator) and f (connected straight to
    // worker 1) wait on worker 1 while the shard moves to worker 2.
    let d = acquire(&mut c, &moving, "d")
        .expect("d")
        .expect("d is granted");
    let e = waiter(moving.clone(), "e");
    let f = waiter_at(w1, moving.clone(), "f");
    waiting(w1, &moving, 2);
    cluster.move_shard(moving_shard, w1, w2);
    waiting(w2, &moving, 2);
    c.query_one("SELECT lockext.lock_release($1, 'd')", &[&moving])
        .expect("d releases, on worker 2");
    // One of them is granted at d's release; its release grants the other.
    let first: String = eventually(Duration::from_secs(30), "e or f granted", || {
        c.query_opt(
            "SELECT owner FROM lockext.locks WHERE lock_id = $1",
            &[&moving],
        )
        .ok()?
        .map(|row| row.get(0))
    });
    c.query_one("SELECT lockext.lock_release($1, $2)", &[&moving, &first])
        .expect("the first of e and f releases");
    for (name, answers) in [("e", e.join().expect("e")), ("f", f.join().expect("f"))] {
        println!("citus waiting: {name}'s answers {answers:?}");
        // Had a waiter held the shard's metadata lock while it waited, the move would have
        // waited for its 120 seconds, and d's release after it: its 40001 is the move ending
        // under it (a waiter connected straight to the worker too: it was served there).
        checks.check(
            answers.len() == 2 && answers[0] == Err("40001".into()),
            format!("{name} held up no move: 40001 once the shard had gone ({answers:?})"),
        );
        checks.check(
            matches!(answers.last(), Some(Ok(Some(t))) if *t > d),
            format!("{name}, waiting again on worker 2, granted there, above d's {d}"),
        );
    }
    checks.finish();
}

/// A worker killed (`pg_ctl stop -m immediate`) while clients contend through the
/// coordinator, then started again: the grants after it are above every grant before it
/// (WAL replay restores the highest and the ledger), and no two holders at once.
#[test]
fn citus_tokens_rise_through_a_worker_crash() {
    let mut checks = Checks::new("citus crash");
    let cluster = distributed(8);
    let w1 = cluster.workers[0].port;
    through_an_outage(&cluster, w1, "crash", &mut checks, || {
        let worker = cluster.worker(w1);
        worker.pg_ctl("stop -m immediate -w");
        thread::sleep(Duration::from_secs(1));
        worker.pg_ctl("start -w -t 60");
    });
    checks.finish();
}

/// Three clients contend for three of the lock ids of the worker at `port` through the
/// coordinator (a call that fails while a node is down is given up) for 3 s; then `outage`
/// runs, and returns once the cluster serves again; then 5 s more. Checked over the grants
/// answered before the outage and those asked for after it: some on both sides, no token
/// back, no two holders.
fn through_an_outage(
    cluster: &CitusCluster,
    port: u16,
    name: &str,
    checks: &mut Checks,
    outage: impl FnOnce(),
) {
    let locks: Vec<String> = locks_on(cluster, port, &format!("{name}-"), 3)
        .into_iter()
        .map(|(l, _)| l)
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let clients = contend_through(
        cluster.coordinator.port,
        locks,
        3,
        stop.clone(),
        "SELECT fence_token FROM lockext.lock_acquire($1, $2, '2 seconds')",
        true,
    );
    thread::sleep(Duration::from_secs(3));
    let outage_at = now_us();
    outage();
    let back_at = now_us();
    thread::sleep(Duration::from_secs(5));
    let (grants, failed) = stop_clients(&stop, clients);
    let before = grants.iter().filter(|g| g.acked < outage_at).count();
    let after = grants.iter().filter(|g| g.sent > back_at).count();
    println!(
        "citus {name}: {before} grants before the outage, {after} after it, \
         {failed} calls failed or refused"
    );
    checks.check(
        before >= 20 && after >= 20,
        format!("grants on both sides ({before}, {after})"),
    );
    let found = violations(&grants);
    checks.check(
        found.is_empty(),
        format!(
            "no token back, no two holders: {:?}",
            &found[..found.len().min(5)]
        ),
    );
}

/// A worker's failover while clients contend through the coordinator: worker 1 has a
/// synchronous standby (every commit it acknowledges is on the standby's disk); it is
/// stopped (`-m immediate`), its standby promoted and put in its place
/// (`citus_update_node`, Citus's failover step), and the contention goes on: no token back
/// and no two holders for any lock id, over the grants before and after (the promoted
/// standby's era is higher, and each lock id's highest came with the WAL).
#[test]
fn citus_tokens_rise_through_a_worker_failover() {
    let mut checks = Checks::new("citus failover");
    let cluster = distributed(8);
    let w1 = cluster.workers[0].port;
    let worker = cluster.worker(w1);
    let standby = base_backup(worker, "citus-w1-standby", "-R", "hot_standby = on");
    standby.pg_ctl("start -w -t 60");
    let mut p = worker.connect();
    for sql in [
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
        "SELECT pg_reload_conf()",
    ] {
        p.batch_execute(sql).expect("a synchronous standby");
    }
    eventually(
        Duration::from_secs(30),
        "the standby is synchronous",
        || {
            let state: String = p
                .query_one(
                    "SELECT coalesce(max(sync_state), 'none') FROM pg_stat_replication",
                    &[],
                )
                .ok()?
                .get(0);
            (state == "sync").then_some(())
        },
    );
    through_an_outage(&cluster, w1, "failover", &mut checks, || {
        worker.pg_ctl("stop -m immediate -w");
        standby.pg_ctl("promote -w -t 60");
        wait_for_primary(&standby, Duration::from_secs(60));
        cluster
            .connect()
            .query_one(
                "SELECT citus_update_node(nodeid, '127.0.0.1', $1) FROM pg_dist_node WHERE nodeport = $2",
                &[&i32::from(standby.port), &i32::from(w1)],
            )
            .expect("the standby in worker 1's place");
    });
    standby.pg_ctl("stop -m fast -w -t 60");
    checks.finish();
}

/// A worker added, shards rebalanced onto it, then drained and removed, while clients
/// contend: every lock id's tokens keep rising, wherever it goes.
#[test]
fn citus_tokens_rise_through_a_worker_added_and_removed() {
    let mut checks = Checks::new("citus add-remove");
    let mut cluster = distributed(8);
    let locks: Vec<String> = (0..8).map(|i| format!("roam-{i}")).collect();
    // Ledgers apart: 600 grants on each existing worker before the new one comes.
    let ports: Vec<u16> = cluster.workers.iter().map(|w| w.port).collect();
    for port in ports {
        let mut w = cluster.worker(port).connect();
        let (lock, _) = locks_on(&cluster, port, "warm-", 1).remove(0);
        for _ in 0..600 {
            acquire(&mut w, &lock, "warm")
                .expect("warm")
                .expect("granted");
            w.query_one("SELECT lockext.lock_release($1, 'warm')", &[&lock])
                .expect("release");
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let clients = contend(
        cluster.coordinator.port,
        locks.clone(),
        3,
        stop.clone(),
        "SELECT fence_token FROM lockext.lock_acquire($1, $2, '30 seconds')",
    );
    thread::sleep(Duration::from_secs(2));
    let added = cluster.add_worker();
    cluster.rebalance();
    let on_new: i64 = cluster
        .connect()
        .query_one(
            "SELECT count(*) FROM pg_dist_shard_placement WHERE nodeport = $1",
            &[&i32::from(added)],
        )
        .expect("placements")
        .get(0);
    thread::sleep(Duration::from_secs(2));
    let mut c = cluster.connect();
    for sql in [
        format!(
            "SELECT citus_drain_node('127.0.0.1', {added}, shard_transfer_mode => 'force_logical')"
        ),
        "CALL citus_cleanup_orphaned_resources()".to_string(),
        format!("SELECT citus_remove_node('127.0.0.1', {added})"),
    ] {
        c.batch_execute(&sql)
            .unwrap_or_else(|e| panic!("drain and remove the new worker: {sql}: {e}"));
    }
    thread::sleep(Duration::from_secs(2));
    let (grants, retries) = stop_clients(&stop, clients);
    println!(
        "citus add-remove: {} grants, {on_new} shards on the new worker, \
         {retries} calls refused with 40001",
        grants.len()
    );
    checks.check(
        on_new > 0,
        format!("the rebalance moved shards to the new worker ({on_new})"),
    );
    let found = violations(&grants);
    checks.check(
        found.is_empty(),
        format!(
            "no token back, no two holders: {:?}",
            &found[..found.len().min(5)]
        ),
    );
    checks.finish();
}
