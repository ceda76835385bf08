//! lockext in a Patroni cluster (Debian's `patroni` and `etcd-server`) through a failover.
//!
//! Two Patroni nodes on loopback with a one-member etcd as their store, lockext in
//! `shared_preload_libraries`. Clients (tests/deploy/rust's client: the fault suite's worker
//! loop and its pause-a/pause-b pair) connect with a libpq multi-host URL and
//! `target_session_attrs=read-write`, reconnecting every 100 ms, so they follow the leader.
//! While they run, the leader's WAL sender is frozen for 1.5 s (replication lag) and then
//! the leader node dies: its Patroni and every process of its PostgreSQL are killed with
//! SIGKILL, as in a machine crash. Patroni promotes the standby once the leader key expires.
//!
//! Checked on the whole history with the fault suite's checker (`history::check`):
//! - every token granted after the failover is above every token acknowledged before it
//!   (lockext starts a new era on the promoted server's new timeline);
//! - no token is handed out twice; accepted writes never go back in token order on any
//!   resource; nothing refused is stored;
//! - holder A, granted before the failover and paused through it, writes after B took the
//!   lock on the new leader: refused; its renewal and release fail;
//! - with asynchronous replication, acknowledged writes of the frozen-sender window are
//!   lost (that is what asynchronous means) and only counted; with `synchronous_mode`, no
//!   acknowledged write is lost, and no acknowledged grant either.
//!
//! Each scenario prints a `SUMMARY` line and a `TOKENS` line (highest acknowledged before,
//! lowest granted after, as era/counter). Run with tests/deploy/patroni/run.sh.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use lockext_cluster_tests::history::{
    check, now_us, CheckOptions, History, Invariant, Kind, Outcome, Restart, SETUP_SQL,
};
use lockext_cluster_tests::{children, eventually, proc_stat, sigstop, Client, NoTls, PG_BIN};

const CLIENT: &str = env!("CARGO_BIN_EXE_lockext-pooled-client");
const PATRONI: &str = "/usr/bin/patroni";
const ETCD: &str = "/usr/bin/etcd";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .unwrap()
        .port()
}

fn kill(pid: i32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

fn postgres_ids() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let line = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .expect("a postgres OS user");
    let f: Vec<&str> = line.split(':').collect();
    (f[2].parse().unwrap(), f[3].parse().unwrap())
}

fn try_connect(port: u16) -> Option<Client> {
    Client::connect(
        &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=2"),
        NoTls,
    )
    .ok()
}

/// The postmaster of a data directory, if its pid file names a live process.
fn postmaster(data: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let pid: i32 = text.lines().next()?.trim().parse().ok()?;
    proc_stat(pid).is_some_and(|(s, _)| s != 'Z').then_some(pid)
}

struct Node {
    name: String,
    pg_port: u16,
    dir: PathBuf,
    patroni: Option<Child>,
}

impl Node {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn start(&mut self) {
        let (uid, gid) = postgres_ids();
        let log = std::fs::File::create(self.dir.join("patroni.log")).unwrap();
        let child = Command::new(PATRONI)
            .arg(self.dir.join("patroni.yml"))
            .uid(uid)
            .gid(gid)
            .env("HOME", &self.dir)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start patroni");
        self.patroni = Some(child);
    }

    /// Is this node's PostgreSQL a primary accepting connections?
    fn is_primary(&self) -> bool {
        try_connect(self.pg_port).is_some_and(|mut c| {
            c.query_one("SELECT NOT pg_is_in_recovery()", &[])
                .map(|r| r.get::<_, bool>(0))
                .unwrap_or(false)
        })
    }

    /// The node crashes: SIGKILL to Patroni, the postmaster and every server process at once.
    fn crash(&mut self) {
        let pm = postmaster(&self.data());
        let kids = pm.map(children).unwrap_or_default();
        if let Some(p) = self.patroni.as_mut() {
            let _ = p.kill();
        }
        if let Some(pm) = pm {
            kill(pm, "KILL");
        }
        for k in kids {
            kill(k, "KILL");
        }
        if let Some(mut p) = self.patroni.take() {
            let _ = p.wait();
        }
    }
}

/// etcd and two Patroni nodes; everything is killed when dropped.
struct Ha {
    dir: PathBuf,
    etcd: Child,
    nodes: Vec<Node>,
}

impl Ha {
    fn start(name: &str, synchronous: bool) -> Ha {
        for bin in [PATRONI, ETCD] {
            assert!(
                Path::new(bin).exists(),
                "{bin} is missing: apt-get install patroni etcd-server"
            );
        }
        let dir = PathBuf::from(format!(
            "/tmp/lockext-patroni/{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (client_port, peer_port) = (free_port(), free_port());
        let etcd_log = std::fs::File::create(dir.join("etcd.log")).unwrap();
        let etcd = Command::new(ETCD)
            .args(["--name", "lockext", "--data-dir"])
            .arg(dir.join("etcd"))
            .arg(format!(
                "--listen-client-urls=http://127.0.0.1:{client_port}"
            ))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{client_port}"
            ))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"
            ))
            .arg(format!(
                "--initial-cluster=lockext=http://127.0.0.1:{peer_port}"
            ))
            .stdout(etcd_log.try_clone().unwrap())
            .stderr(etcd_log)
            .spawn()
            .expect("start etcd");
        let template = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../patroni/patroni.yml.in"
        ))
        .expect("read tests/deploy/patroni/patroni.yml.in");
        let nodes: Vec<Node> = (1..=2)
            .map(|i| {
                let node = Node {
                    name: format!("node{i}"),
                    pg_port: free_port(),
                    dir: dir.join(format!("node{i}")),
                    patroni: None,
                };
                std::fs::create_dir_all(&node.dir).unwrap();
                let yml = template
                    .replace("@SCOPE@", &format!("lockext-{name}"))
                    .replace("@NAME@", &node.name)
                    .replace("@REST_PORT@", &free_port().to_string())
                    .replace("@ETCD@", &format!("127.0.0.1:{client_port}"))
                    .replace(
                        "@SYNCHRONOUS_MODE@",
                        if synchronous { "true" } else { "false" },
                    )
                    .replace("@PG_PORT@", &node.pg_port.to_string())
                    .replace("@DIR@", &node.dir.display().to_string())
                    .replace("@PG_BIN@", PG_BIN.path());
                std::fs::write(node.dir.join("patroni.yml"), yml).unwrap();
                node
            })
            .collect();
        let status = Command::new("chown")
            .arg("-R")
            .arg("postgres:postgres")
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success());
        let mut ha = Ha { dir, etcd, nodes };

        // node1 bootstraps the cluster (initdb) and becomes the leader.
        ha.nodes[0].start();
        eventually(Duration::from_secs(90), "node1 is the leader", || {
            ha.nodes[0].is_primary().then_some(())
        });
        let mut c = try_connect(ha.nodes[0].pg_port).unwrap();
        c.batch_execute("CREATE EXTENSION lockext")
            .expect("create extension");
        c.batch_execute(SETUP_SQL).expect("create fence_history");
        // node2 clones it (pg_basebackup) and streams from it.
        ha.nodes[1].start();
        let want = if synchronous { "sync" } else { "async" };
        eventually(
            Duration::from_secs(90),
            &format!("node2 streams ({want})"),
            || {
                let row = c
                    .query_opt(
                        "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'",
                        &[],
                    )
                    .ok()??;
                (row.get::<_, String>(0) == want).then_some(())
            },
        );
        let preload: String = c
            .query_one("SHOW shared_preload_libraries", &[])
            .unwrap()
            .get(0);
        assert_eq!(preload, "lockext");
        ha
    }

    /// A libpq URL that finds the primary among both nodes.
    fn url(&self) -> String {
        format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres connect_timeout=2 \
             target_session_attrs=read-write",
            self.nodes[0].pg_port, self.nodes[1].pg_port
        )
    }
}

impl Drop for Ha {
    fn drop(&mut self) {
        for n in self.nodes.iter_mut() {
            n.crash();
        }
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
        if std::thread::panicking() {
            eprintln!("patroni cluster files kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

struct Proc {
    id: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Proc {
    fn line(&mut self) -> String {
        let mut s = String::new();
        self.stdout.read_line(&mut s).expect("read client stdout");
        assert!(
            !s.is_empty(),
            "client {} ended without saying more",
            self.id
        );
        s.trim_end().to_string()
    }

    fn tell(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .expect("write client stdin");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(url: &str, dir: &Path, stop: &Path, id: &str, args: &[(&str, String)]) -> Proc {
    let mut child = Command::new(CLIENT)
        .arg(format!("url={url}"))
        .arg(format!("id={id}"))
        .arg(format!("out={}", dir.join(format!("{id}.ops")).display()))
        .arg(format!("stop={}", stop.display()))
        .args(args.iter().map(|(k, v)| format!("{k}={v}")))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {CLIENT}: {e}"));
    let stdin = child.stdin.take();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    Proc {
        id: id.to_string(),
        child,
        stdin,
        stdout,
    }
}

/// (era, counter) of a token, as lockext.token_parts (layout 2: an era over 41 bits).
fn parts(token: i64) -> String {
    format!("{}/{}", token >> 41, token & ((1 << 41) - 1))
}

fn failover(name: &str, synchronous: bool) {
    let started = Instant::now();
    let mut ha = Ha::start(name, synchronous);
    println!(
        "{name}: leader node1 on {}, standby node2 on {} ({} replication), files in {}",
        ha.nodes[0].pg_port,
        ha.nodes[1].pg_port,
        if synchronous {
            "synchronous"
        } else {
            "asynchronous"
        },
        ha.dir.display()
    );
    let url = ha.url();
    let hist = ha.dir.join("history");
    std::fs::create_dir_all(&hist).unwrap();
    let stop = hist.join("stop");
    let seed = now_us() as u64;

    // Holder A takes the `ledger` lock now, with a 1 s lease, and pauses through the failover.
    let mut a = spawn(
        &url,
        &hist,
        &stop,
        "A",
        &[
            ("mode", "pause-a".into()),
            ("locks", "ledger".into()),
            ("ttl_ms", "1000".into()),
            ("run_ms", "120000".into()),
        ],
    );
    let a_granted = a.line();
    assert!(a_granted.starts_with("granted ledger"), "A: {a_granted}");
    let a_token: i64 = a_granted.rsplit(' ').next().unwrap().parse().unwrap();

    let mut workers: Vec<Proc> = (0..8)
        .map(|i| {
            spawn(
                &url,
                &hist,
                &stop,
                &format!("w{i}"),
                &[
                    ("mode", "worker".into()),
                    ("locks", "lk0,lk1,lk2".into()),
                    ("ttl_ms", "300".into()),
                    ("stale_pct", "20".into()),
                    ("run_ms", "120000".into()),
                    ("seed", seed.wrapping_add(i * 7919).to_string()),
                ],
            )
        })
        .collect();
    sleep(Duration::from_secs(3));

    // Sentinel: grants of 60 s leases, one after the other, straight on node1 until it dies;
    // afterwards each acknowledged one must be on node2 (synchronous) or may be lost (async).
    let sentinel_url = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=2",
        ha.nodes[0].pg_port
    );
    let sentinel = std::thread::spawn(move || {
        let mut acked: Vec<(String, i64)> = Vec::new();
        let Ok(mut c) = Client::connect(&sentinel_url, NoTls) else {
            return acked;
        };
        let t0 = Instant::now();
        for i in 0.. {
            let lock = format!("sentinel-{i}");
            match c.query_one(
                "SELECT fence_token FROM lockext.lock_acquire($1, 'sentinel', '60 seconds')",
                &[&lock],
            ) {
                Ok(row) => acked.push((lock, row.get(0))),
                Err(_) => break, // node1 died
            }
            if t0.elapsed() > Duration::from_secs(30) {
                break;
            }
            sleep(Duration::from_millis(20));
        }
        acked
    });
    sleep(Duration::from_millis(500));

    // Replication lag: freeze node1's WAL sender (what it has not sent yet stays on node1),
    // then crash the leader node.
    let mut leader = try_connect(ha.nodes[0].pg_port).expect("connect to the leader");
    let sender: i32 = leader
        .query_one("SELECT pid FROM pg_stat_replication", &[])
        .expect("a WAL sender")
        .get(0);
    drop(leader);
    sigstop(sender, "node1's WAL sender");
    sleep(Duration::from_millis(1500));
    let kill_us = now_us();
    ha.nodes[0].crash();
    println!(
        "{name}: WAL sender of node1 frozen 1.5 s, then node1 (Patroni and PostgreSQL) killed -9"
    );

    let promoted = eventually(Duration::from_secs(90), "node2 is promoted", || {
        ha.nodes[1].is_primary().then(now_us)
    });
    println!(
        "{name}: node2 promoted {:.1} s after the crash",
        (promoted - kill_us) as f64 / 1e6
    );

    // B takes the lock on the new leader and writes; then A wakes up and writes.
    let mut b = spawn(
        &url,
        &hist,
        &stop,
        "B",
        &[
            ("mode", "pause-b".into()),
            ("locks", "ledger".into()),
            ("ttl_ms", "5000".into()),
            ("run_ms", "60000".into()),
        ],
    );
    let b_granted = b.line();
    let b_write = b.line();
    assert!(b_granted.starts_with("granted ledger"), "B: {b_granted}");
    let b_token: i64 = b_granted.rsplit(' ').next().unwrap().parse().unwrap();
    a.tell("go");
    let (a_write, a_renew, a_release) = (a.line(), a.line(), a.line());
    println!("{name}: A (token {a_token}, granted before) after B (token {b_token}, granted on node2): {a_write}, {a_renew}, {a_release}; B: {b_write}");

    sleep(Duration::from_secs(4));
    std::fs::write(&stop, "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    for p in workers.iter_mut().chain([&mut a, &mut b]) {
        loop {
            match p.child.try_wait().unwrap() {
                Some(s) => {
                    assert!(s.success(), "client {} failed: {s}", p.id);
                    break;
                }
                None if Instant::now() > deadline => panic!("client {} still running", p.id),
                None => sleep(Duration::from_millis(20)),
            }
        }
    }

    // The history: the clients' files, and the new leader's tables.
    let mut h = History::default();
    for entry in std::fs::read_dir(&hist).unwrap().flatten() {
        if entry.path().extension().is_some_and(|e| e == "ops") {
            h.read_ops(&entry.path());
        }
    }
    let mut c = try_connect(ha.nodes[1].pg_port).unwrap();
    h.read_server(&mut c);
    let opts = CheckOptions {
        restarts: vec![Restart {
            kill_us,
            restarted_us: promoted,
        }],
    };
    let report = check(&h, &opts);

    // Writes acknowledged before the crash and missing now: allowed only asynchronously.
    let is_lost_write = |v: &&lockext_cluster_tests::history::Violation| {
        v.invariant == Invariant::NoLostWrites && v.detail.ends_with("is not in the database")
    };
    let lost_writes = report.violations.iter().filter(is_lost_write).count();
    let others: Vec<String> = report
        .violations
        .iter()
        .filter(|v| !is_lost_write(v))
        .map(|v| v.to_string())
        .collect();

    // Sentinel grants acknowledged by node1 and missing on node2: lost grants.
    let present: BTreeMap<String, i64> = c
        .query(
            "SELECT lock_id, fence_token FROM lockext.locks WHERE lock_id LIKE 'sentinel-%'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let sentinels = sentinel.join().expect("sentinel thread");
    let lost_grants: Vec<&(String, i64)> = sentinels
        .iter()
        .filter(|(l, t)| present.get(l) != Some(t))
        .collect();
    println!(
        "{name}: sentinel grants (60 s leases) acknowledged by node1 in its last 2 s: {}, missing on node2: {}",
        sentinels.len(),
        lost_grants.len()
    );

    // Tokens: highest acknowledged before the crash, lowest granted after the promotion.
    let mut grants: BTreeMap<i64, (i64, i64)> = BTreeMap::new(); // token -> (first start, first end)
    for o in h
        .ops
        .iter()
        .filter(|o| o.kind == Kind::Acquire && o.outcome == Outcome::Ok)
    {
        let e = grants
            .entry(o.token.unwrap())
            .or_insert((o.start_us, o.end_us));
        *e = (e.0.min(o.start_us), e.1.min(o.end_us));
    }
    let before = grants
        .iter()
        .filter(|(_, (_, end))| *end < kill_us)
        .map(|(t, _)| *t)
        .chain(sentinels.iter().map(|(_, t)| *t))
        .max()
        .expect("grants before");
    let after = grants
        .iter()
        .filter(|(_, (start, _))| *start > promoted)
        .map(|(t, _)| *t)
        .min()
        .expect("grants after");
    let acked_grants_before = grants.values().filter(|(_, end)| *end < kill_us).count();
    let grants_after = grants
        .values()
        .filter(|(start, _)| *start > promoted)
        .count();
    println!(
        "TOKENS {name}: highest acknowledged before the crash {before} ({}), lowest granted after the promotion {after} ({}); \
         {acked_grants_before} grants before, {grants_after} after",
        parts(before),
        parts(after)
    );
    println!(
        "{} lost-acknowledged-writes={lost_writes} failover-secs={:.1} secs={:.1}",
        report.summary(name),
        (promoted - kill_us) as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );

    assert!(
        after > before,
        "a token after the failover is not above one acknowledged before"
    );
    assert!(b_token > a_token);
    assert_eq!(a_write, "write false", "A's stale write after the failover");
    assert_eq!(a_renew, "renew false");
    assert_eq!(a_release, "release false");
    assert_eq!(b_write, "write true");
    assert!(
        others.is_empty(),
        "{} violations:\n{}",
        others.len(),
        others.join("\n")
    );
    if synchronous {
        assert_eq!(lost_writes, 0, "synchronous_mode lost acknowledged writes");
        assert!(
            lost_grants.is_empty(),
            "synchronous_mode lost acknowledged grants: {lost_grants:?}"
        );
    }
    assert!(!sentinels.is_empty(), "no sentinel grant before the crash");
    assert!(report.writes_acked > 0 && report.grants > 0);
}

#[test]
fn failover_with_asynchronous_replication() {
    failover("patroni-async", false);
}

#[test]
fn failover_with_synchronous_mode() {
    failover("patroni-sync", true);
}
