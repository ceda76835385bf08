//! lockext behind PgBouncer (Debian's `pgbouncer`) in transaction pooling mode.
//!
//! 1. The fault suite's contention scenario (16 client processes, 4 locks, 200 ms leases, a
//!    quarter of the holders pausing past their lease, random SIGSTOPs of clients) through a
//!    pool of 6 server connections: every transaction of every client may run on any of
//!    them. The recorded history passes the fault suite's checker (`history::check`): no
//!    token handed out twice, no two live grants of a lock overlap, accepted writes never go
//!    back in token order, none is lost, nothing refused is stored.
//! 2. Why this matters: session-level advisory locks, the usual home-made lock, break behind
//!    the same pooler, where lockext does not.
//!
//! Each test starts its own scratch cluster (`lockext_cluster_tests::Cluster`) and PgBouncer
//! on free loopback ports, and stops both when done.

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use lockext_cluster_tests::history::{check, CheckOptions, History, SETUP_SQL};
use lockext_cluster_tests::{eventually, Client, Cluster, NoTls};

const CLIENT: &str = env!("CARGO_BIN_EXE_lockext-pooled-client");
const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// Server connections per pool: fewer than the 16 clients, so they must share.
const POOL_SIZE: usize = 6;

/// (uid, gid) of the `postgres` OS user: PgBouncer refuses to run as root.
fn postgres_ids() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let line = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .expect("a postgres OS user");
    let f: Vec<&str> = line.split(':').collect();
    (f[2].parse().unwrap(), f[3].parse().unwrap())
}

/// A PgBouncer in front of `cluster`, killed when dropped.
struct Bouncer {
    port: u16,
    child: Child,
    dir: PathBuf,
}

impl Bouncer {
    /// Database `postgres` (pool of POOL_SIZE) and `pool1` (the same database, a pool of
    /// one server connection), both in transaction pooling mode.
    fn start(cluster: &Cluster) -> Bouncer {
        assert!(
            Path::new(PGBOUNCER).exists(),
            "{PGBOUNCER} is missing: apt-get install pgbouncer"
        );
        let port = lockext_cluster_tests::free_port();
        let dir = cluster.dir.join("pgbouncer");
        std::fs::create_dir_all(&dir).unwrap();
        let ini = format!(
            "[databases]\n\
             postgres = host=127.0.0.1 port={pg} dbname=postgres pool_size={POOL_SIZE}\n\
             pool1 = host=127.0.0.1 port={pg} dbname=postgres pool_size=1\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/userlist.txt\n\
             pool_mode = transaction\n\
             max_client_conn = 200\n\
             reserve_pool_size = 0\n\
             logfile = {dir}/pgbouncer.log\n",
            pg = cluster.port,
            dir = dir.display()
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n").unwrap();
        let (uid, gid) = postgres_ids();
        Command::new("chown")
            .arg("-R")
            .arg("postgres:postgres")
            .arg(&dir)
            .status()
            .expect("chown");
        let child = Command::new(PGBOUNCER)
            .arg(dir.join("pgbouncer.ini"))
            .uid(uid)
            .gid(gid)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let b = Bouncer { port, child, dir };
        eventually(
            Duration::from_secs(20),
            "pgbouncer accepts connections",
            || b.try_connect("postgres").ok(),
        );
        b
    }

    fn url(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db} connect_timeout=10",
            self.port
        )
    }

    fn try_connect(&self, db: &str) -> Result<Client, postgres::Error> {
        Client::connect(&self.url(db), NoTls)
    }

    fn connect(&self, db: &str) -> Client {
        self.try_connect(db)
            .unwrap_or_else(|e| panic!("connect through pgbouncer to {db}: {e}"))
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "pgbouncer log: {}",
                self.dir.join("pgbouncer.log").display()
            );
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// A tiny PRNG for the test's own choices, as in the fault suite.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

#[test]
fn contention_through_transaction_pooling() {
    let cluster = Cluster::start("deploy-pgbouncer", "lockext.reap_interval = '50ms'");
    let mut direct = cluster.connect();
    direct
        .batch_execute(SETUP_SQL)
        .expect("create fence_history");
    let bouncer = Bouncer::start(&cluster);

    let seed = std::env::var("LOCKEXT_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros() as u64
        });
    let dir = PathBuf::from(format!(
        "/tmp/lockext-tests/history-pgbouncer-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let stop = dir.join("stop");
    println!(
        "contention through pgbouncer (pool of {POOL_SIZE}): seed {seed}, histories in {}",
        dir.display()
    );

    let started = Instant::now();
    let mut clients: Vec<(String, Child)> = (0..16)
        .map(|i| {
            let id = format!("p{i:02}");
            let child = Command::new(CLIENT)
                .arg(format!("url={}", bouncer.url("postgres")))
                .arg(format!("id={id}"))
                .arg("locks=lk0,lk1,lk2,lk3")
                .arg("ttl_ms=200")
                .arg("stale_pct=25")
                .arg("run_ms=60000")
                .arg(format!("seed={}", seed.wrapping_add(i * 7919)))
                .arg(format!("out={}", dir.join(format!("{id}.ops")).display()))
                .arg(format!("stop={}", stop.display()))
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {CLIENT}: {e}"));
            (id, child)
        })
        .collect();

    // Freeze random clients past their lease, at any point of their work, for 8 s.
    let mut rng = Rng(seed | 1);
    let until = Instant::now() + Duration::from_secs(8);
    let mut stops = 0;
    while Instant::now() < until {
        let pid = clients[rng.below(16) as usize].1.id();
        signal(pid, "STOP");
        stops += 1;
        sleep(Duration::from_millis(250 + rng.below(300)));
        signal(pid, "CONT");
        sleep(Duration::from_millis(100 + rng.below(200)));
    }
    std::fs::write(&stop, "").unwrap();

    // Every client finishes its current iteration and exits; collect the backends it used.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut all_backends = BTreeSet::new();
    let mut most = 0;
    for (id, child) in clients.iter_mut() {
        let status = loop {
            match child.try_wait().unwrap() {
                Some(s) => break s,
                None if Instant::now() > deadline => {
                    let _ = child.kill();
                    panic!("client {id} still running after 60 s");
                }
                None => sleep(Duration::from_millis(20)),
            }
        };
        assert!(status.success(), "client {id} failed: {status}");
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let line = out
            .lines()
            .find(|l| l.starts_with("backends "))
            .unwrap_or_else(|| panic!("{id} said {out:?}"));
        let pids: Vec<i32> = line
            .split(' ')
            .nth(2)
            .unwrap_or("")
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        most = most.max(pids.len());
        all_backends.extend(pids);
    }

    let mut history = History::default();
    for (id, _) in &clients {
        let path = dir.join(format!("{id}.ops"));
        if path.exists() {
            history.read_ops(&path);
        }
    }
    history.read_server(&mut direct);
    let report = check(&history, &CheckOptions::default());
    println!(
        "{} sigstops={stops} server-sessions={} most-sessions-one-client={most} secs={:.1}",
        report.summary("pgbouncer-contention"),
        all_backends.len(),
        started.elapsed().as_secs_f64()
    );
    let failures = report.failures(false);
    if !failures.is_empty() {
        let shown: Vec<String> = failures.iter().take(30).map(|v| v.to_string()).collect();
        panic!(
            "{} violations, first ones:\n{}\nhistories kept in {}",
            failures.len(),
            shown.join("\n"),
            dir.display()
        );
    }
    assert!(
        report.grants > 0 && report.writes_acked > 0,
        "nothing was exercised"
    );
    assert!(
        report.writes_rejected > 0,
        "no stale write was ever refused"
    );
    assert_eq!(report.failed_ops, 0, "calls failed through the pooler");
    // The pooling really happened: 16 clients over at most POOL_SIZE server sessions, and
    // a client's transactions ran on several of them.
    assert!(
        all_backends.len() <= POOL_SIZE,
        "{} server sessions for a pool of {POOL_SIZE}",
        all_backends.len()
    );
    assert!(
        most > 1,
        "no client was ever moved to another server session"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Session-level advisory locks belong to the server session, which the pooler hands from
/// client to client: two clients both "hold" the same lock, and it stays held after its
/// holder has gone. lockext's lease is a row, not session state: the second client is
/// refused, and the first one's release works from whatever server session it lands on.
#[test]
fn session_advisory_locks_break_behind_transaction_pooling_and_lockext_does_not() {
    let cluster = Cluster::start("deploy-pgbouncer-advisory", "");
    let bouncer = Bouncer::start(&cluster);
    let try_lock =
        |c: &mut Client| -> bool { c.simple_query_bool("SELECT pg_try_advisory_lock(4242)") };

    // Through the pooler (one server connection in pool1, as a busy pool often hands the
    // same one on): A takes the advisory lock, and so does B.
    let mut a = bouncer.connect("pool1");
    let mut b = bouncer.connect("pool1");
    let a_got = try_lock(&mut a);
    let b_got = try_lock(&mut b);
    // A leaves without unlocking (crash, or an unlock that ran on another server session).
    drop(a);
    sleep(Duration::from_millis(200));
    // Directly on the server, a newcomer finds the lock taken by nobody it knows of.
    let mut direct = cluster.connect();
    let direct_got = try_lock(&mut direct);
    println!(
        "advisory lock through transaction pooling: A got it {a_got}, B got it too {b_got}, \
         after A left a direct session gets it {direct_got}"
    );
    assert!(
        a_got && b_got,
        "both clients hold the session-level advisory lock at once"
    );
    assert!(
        !direct_got,
        "the advisory lock outlived its holder: it belongs to the pooled server session"
    );

    // The same through the same pooler with lockext.
    let mut a = bouncer.connect("pool1");
    let acquire = |c: &mut Client, owner: &str| -> Option<i64> {
        c.query_typed_one(
            "SELECT fence_token FROM lockext.lock_acquire('pooled', $1::text, '30 seconds')",
            &[(&owner, postgres::types::Type::TEXT)],
        )
        .expect("lock_acquire")
        .get(0)
    };
    let a_token = acquire(&mut a, "A");
    let b_token = acquire(&mut b, "B");
    let released: bool = a
        .query_typed_one(
            "SELECT lockext.lock_release('pooled', 'A', $1)",
            &[(&a_token.expect("A's grant"), postgres::types::Type::INT8)],
        )
        .unwrap()
        .get(0);
    let b_after = acquire(&mut b, "B");
    println!("lockext through the same pool: A {a_token:?}, B refused {b_token:?}, A released {released}, then B {b_after:?}");
    assert!(a_token.is_some() && b_token.is_none() && released && b_after > a_token);
}

trait SimpleBool {
    fn simple_query_bool(&mut self, sql: &str) -> bool;
}

impl SimpleBool for Client {
    /// One boolean through the simple query protocol (no prepared statement).
    fn simple_query_bool(&mut self, sql: &str) -> bool {
        let msgs = self.simple_query(sql).expect(sql);
        msgs.iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => r.get(0).map(|v| v == "t"),
                _ => None,
            })
            .expect("a row")
    }
}
