//! Safety under faults, with real clients: several client OS processes
//! (`lockext-fault-client`) drive a real server while the test pauses them (SIGSTOP), kills
//! the server (kill -9), steps the server's clock (libfaketime) and kills the reaper. Every
//! call is recorded, accepted writes are recorded inside the database in the writing
//! transaction, and `history::check` verifies the invariants on the whole history.
//!
//! Each scenario prints one `SUMMARY` line with its counts.
//!
//! Set LOCKEXT_FAULTS_SEED to replay a run's random choices (the clients' timing still
//! differs from run to run).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use lockext_cluster_tests::history::*;
use lockext_cluster_tests::*;

const CLIENT: &str = env!("CARGO_BIN_EXE_lockext-fault-client");

// ---------------------------------------------------------------------------------------
// Client processes
// ---------------------------------------------------------------------------------------

struct Proc {
    id: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Option<BufReader<ChildStdout>>,
    done: bool,
}

/// The client processes of one scenario, and their history files. Dropping it kills the
/// ones still running (after SIGCONT, in case they were stopped).
struct Run {
    name: String,
    dir: PathBuf,
    seed: u64,
    procs: Vec<Proc>,
    started: Instant,
}

fn seed() -> u64 {
    std::env::var("LOCKEXT_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_us() as u64)
}

/// `kill -SIG pid`, ignoring a process that is already gone.
fn try_signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

impl Run {
    fn new(name: &str) -> Run {
        let dir = PathBuf::from(format!(
            "/tmp/lockext-tests/history-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("history dir");
        let seed = seed();
        println!("{name}: seed {seed}, histories in {}", dir.display());
        Run {
            name: name.to_string(),
            dir,
            seed,
            procs: Vec::new(),
            started: Instant::now(),
        }
    }

    /// Starts a client; returns its index. `args` are the client's `key=value` arguments
    /// beyond url, id, mode, seed and out.
    fn spawn(&mut self, cluster: &Cluster, id: &str, mode: &str, args: &[(&str, &str)]) -> usize {
        let mut cmd = Command::new(CLIENT);
        cmd.arg(format!("url={}", cluster.url("postgres")))
            .arg(format!("id={id}"))
            .arg(format!("mode={mode}"))
            .arg(format!(
                "seed={}",
                self.seed.wrapping_add(self.procs.len() as u64 * 7919)
            ))
            .arg(format!(
                "out={}",
                self.dir.join(format!("{id}.ops")).display()
            ))
            .arg(format!("stop={}", self.stop_file().display()))
            .arg("run_ms=60000")
            .args(args.iter().map(|(k, v)| format!("{k}={v}")))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {CLIENT}: {e}"));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().map(BufReader::new);
        self.procs.push(Proc {
            id: id.to_string(),
            child,
            stdin,
            stdout,
            done: false,
        });
        self.procs.len() - 1
    }

    /// Tells workers and holders to finish (they poll for this file), and waits for all.
    fn stop(&mut self, within: Duration) {
        std::fs::write(self.stop_file(), "").expect("create stop file");
        self.wait_all(within);
    }

    fn stop_file(&self) -> PathBuf {
        self.dir.join("stop")
    }

    fn pid(&self, i: usize) -> u32 {
        self.procs[i].child.id()
    }

    /// The next line the client printed (waits for it).
    fn read_line(&mut self, i: usize) -> String {
        let mut line = String::new();
        let p = &mut self.procs[i];
        p.stdout
            .as_mut()
            .expect("stdout")
            .read_line(&mut line)
            .expect("read client stdout");
        assert!(
            !line.is_empty(),
            "client {} ended without saying more",
            p.id
        );
        line.trim_end().to_string()
    }

    fn tell(&mut self, i: usize, line: &str) {
        let stdin = self.procs[i].stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .expect("write client stdin");
    }

    /// Waits for every client to exit (successfully), at most `within`.
    fn wait_all(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        for p in self.procs.iter_mut().filter(|p| !p.done) {
            // Drain what it prints so that it never blocks on a full pipe.
            let mut rest = String::new();
            loop {
                match p.child.try_wait().expect("try_wait") {
                    Some(status) => {
                        assert!(status.success(), "client {} failed: {status}", p.id);
                        p.done = true;
                        break;
                    }
                    None if Instant::now() > deadline => {
                        panic!("client {} still running after {within:?}", p.id)
                    }
                    None => sleep(Duration::from_millis(20)),
                }
            }
            if let Some(out) = p.stdout.as_mut() {
                let _ = std::io::Read::read_to_string(out, &mut rest);
            }
        }
    }

    /// The clients' half of the history from their files, the server's from `c`.
    fn history(&self, c: &mut Client) -> History {
        let mut h = History::default();
        for p in &self.procs {
            let path = self.dir.join(format!("{}.ops", p.id));
            if path.exists() {
                h.read_ops(&path);
            }
        }
        h.read_server(c);
        h
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().filter(|p| !p.done) {
            try_signal(p.child.id(), "CONT");
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!(
                "{}: client histories kept in {}",
                self.name,
                self.dir.display()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Shared steps
// ---------------------------------------------------------------------------------------

fn setup(cluster: &Cluster) -> Client {
    let mut c = cluster.connect();
    c.batch_execute(SETUP_SQL).expect("create fence_history");
    c
}

/// Checks the run's history, prints the summary line (with `extra`), fails on violations.
fn finish(
    run: &Run,
    c: &mut Client,
    opts: &CheckOptions,
    allow_overlaps: bool,
    extra: &str,
) -> Report {
    let history = run.history(c);
    let report = check(&history, opts);
    println!(
        "{} {extra} secs={:.1}",
        report.summary(&run.name),
        run.started.elapsed().as_secs_f64()
    );
    let failures = report.failures(allow_overlaps);
    if !failures.is_empty() {
        let shown: Vec<String> = failures.iter().take(30).map(|v| v.to_string()).collect();
        panic!(
            "{}: {} violations, first ones:\n{}",
            run.name,
            failures.len(),
            shown.join("\n")
        );
    }
    assert!(
        report.grants > 0 && report.writes_acked > 0,
        "{}: nothing was exercised",
        run.name
    );
    report
}

/// kill -9 of the postmaster and, at once, of every server process: the whole server
/// dies as in a machine crash (what was only in shared memory, like WAL buffers of
/// asynchronous commits, is gone; what was written to the OS stays). Returns when no
/// server process is left. (A postmaster killed alone leaves its children running until
/// they notice, which makes the restart wait for them.)
fn kill_server(cluster: &Cluster) {
    let pm = cluster.postmaster_pid();
    let kids = children(pm);
    signal(pm, "KILL");
    for &k in &kids {
        try_signal(k as u32, "KILL");
    }
    // Dead: gone, or a zombie nobody has reaped yet.
    let dead = |p: i32| proc_stat(p).is_none_or(|(state, _)| state == 'Z');
    eventually(
        Duration::from_secs(30),
        "every server process is dead",
        || {
            std::iter::once(pm)
                .chain(kids.iter().copied())
                .all(dead)
                .then_some(())
        },
    );
    // A new postmaster refuses to start while the pid in postmaster.pid exists, zombies
    // included. Init reaps them at once, normally; where it does not, the lock file of a
    // dead server is removed, as an operator would.
    let reaped = (0..40).any(|_| {
        sleep(Duration::from_millis(50));
        proc_stat(pm).is_none()
    });
    if !reaped {
        std::fs::remove_file(cluster.data().join("postmaster.pid"))
            .expect("remove stale postmaster.pid");
    }
}

fn server_clock_us(c: &mut Client) -> i64 {
    c.query_one("SELECT public.us(clock_timestamp())", &[])
        .expect("server clock")
        .get(0)
}

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

/// 16 client processes, 4 locks, 200 ms leases. A quarter of the holders pause past their
/// lease between acquire and write, and the test itself SIGSTOPs random clients for longer
/// than a lease (at any point: between calls, inside a write transaction...).
#[test]
fn contention_16_clients_4_locks_with_pauses_past_the_lease() {
    let cluster = Cluster::start("faults-contention", "lockext.reap_interval = '50ms'");
    let mut c = setup(&cluster);
    let mut run = Run::new("contention");
    for i in 0..16 {
        run.spawn(
            &cluster,
            &format!("c{i:02}"),
            "worker",
            &[
                ("locks", "lk0,lk1,lk2,lk3"),
                ("ttl_ms", "200"),
                ("stale_pct", "25"),
            ],
        );
    }
    let mut rng = Rng(run.seed | 1);
    let until = Instant::now() + Duration::from_secs(8);
    let mut stops = 0;
    while Instant::now() < until {
        let pid = run.pid(rng.below(16) as usize);
        try_signal(pid, "STOP");
        stops += 1;
        sleep(Duration::from_millis(250 + rng.below(300)));
        try_signal(pid, "CONT");
        sleep(Duration::from_millis(100 + rng.below(200)));
    }
    run.stop(Duration::from_secs(60));
    // Both write paths carried accepted writes: fenced_update and lockext.fence.
    let row = c
        .query_one(
            "SELECT count(*) FILTER (WHERE resource_id LIKE 'res-%'), \
                    count(*) FILTER (WHERE resource_id LIKE 'fence-%') FROM public.fence_history",
            &[],
        )
        .unwrap();
    let (via_update, via_fence): (i64, i64) = (row.get(0), row.get(1));
    assert!(
        via_update > 0 && via_fence > 0,
        "fenced_update {via_update}, lockext.fence {via_fence}"
    );
    let extra = format!(
        "sigstops={stops} accepted-via-fenced_update={via_update} accepted-via-fence={via_fence}"
    );
    let report = finish(&run, &mut c, &CheckOptions::default(), false, &extra);
    // Stale holders were really refused: the run tested fencing, not just locking.
    assert!(
        report.writes_rejected > 0,
        "no stale write was ever refused"
    );
}

/// The article's scenario with real processes: A acquires and is frozen (SIGSTOP) past its
/// lease, B takes the lock with a higher token and writes, A is resumed (SIGCONT) and
/// carries on as if it still held the lock: its write is refused, its renewal and release
/// fail, and the resource keeps B's data.
#[test]
fn pause_past_the_lease_with_sigstop() {
    let cluster = Cluster::start("faults-pause", "lockext.reap_interval = '100ms'");
    let mut c = setup(&cluster);
    let mut run = Run::new("pause");
    let args = [("locks", "ledger"), ("ttl_ms", "1000"), ("run_ms", "20000")];
    let a = run.spawn(&cluster, "A", "pause-a", &args);
    let granted = run.read_line(a);
    let a_token: i64 = granted
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .expect("A's token");
    assert!(granted.starts_with("granted ledger"), "{granted}");

    // Freeze A, and tell it to go on: it will read that only when resumed.
    sigstop(run.pid(a) as i32, "A");
    run.tell(a, "go");

    // B tries until A's lease is over, takes the lock, writes.
    let b = run.spawn(&cluster, "B", "pause-b", &args);
    let granted = run.read_line(b);
    let b_token: i64 = granted
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .expect("B's token");
    assert_eq!(run.read_line(b), "write true", "B's write");
    assert!(
        b_token > a_token,
        "B's token {b_token} is above A's {a_token}"
    );
    let expired: bool = c
        .query_one(
            "SELECT count(*) = 0 FROM lockext.locks WHERE lock_id = 'ledger' AND fence_token = $1",
            &[&a_token],
        )
        .unwrap()
        .get(0);
    assert!(expired, "A's lease is gone");

    try_signal(run.pid(a), "CONT");
    assert_eq!(run.read_line(a), "write false", "A's late write is refused");
    assert_eq!(run.read_line(a), "renew false", "A's renewal fails");
    assert_eq!(run.read_line(a), "release false", "A's release fails");
    run.wait_all(Duration::from_secs(30));

    let row = c
        .query_one("SELECT fence_token, data->>'op' FROM lockext.resources WHERE resource_id = 'res-ledger'", &[])
        .expect("the resource exists");
    let (token, op): (i64, String) = (row.get(0), row.get(1));
    assert_eq!(token, b_token, "the resource holds B's token");
    assert!(
        op.starts_with("B:"),
        "the resource holds B's data, not {op}"
    );
    finish(
        &run,
        &mut c,
        &CheckOptions::default(),
        false,
        &format!("a-token={a_token} b-token={b_token}"),
    );
}

/// 8 clients under load, half of them with synchronous_commit = off; the whole server is
/// killed with kill -9 and restarted; the clients reconnect and carry on.
///
/// What must hold (see `history::check`):
/// - grants: lockext commits every grant synchronously, so every token acknowledged
///   before the crash survives it, and every grant made after the restart has a higher
///   token than all of them (`TokensAfterRestart`), and no token is ever handed out twice;
/// - fenced writes of synchronous sessions: every acknowledged one survived;
/// - fenced writes of `synchronous_commit = off` sessions MAY be lost: that is the
///   setting's contract, and lockext does not (and should not) change it for writes. Only
///   the ones with no later synchronous commit can be: a lost one that some synchronous
///   commit started after its acknowledgment is a violation;
/// - in every case, accepted tokens never go backwards per resource and the resource
///   holds the last write that survived (the history row is in the write's transaction,
///   so a lost write loses both);
/// - no overlap of grants, counting only expiries that were durable (a renewal
///   acknowledged to an async session may be lost, the lease then ends earlier).
#[test]
fn crash_of_the_whole_server_under_load() {
    // lockext.durability = grant (the default): every grant commits synchronously.
    let cluster = Cluster::start(
        "faults-crash",
        "lockext.reap_interval = '100ms'\nlockext.durability = 'grant'",
    );
    let c = setup(&cluster);
    let mut run = Run::new("crash");
    for i in 0..8 {
        let sync = if i < 4 { "on" } else { "off" };
        run.spawn(
            &cluster,
            &format!("c{i}-{sync}"),
            "worker",
            &[
                ("locks", "lk0,lk1,lk2,lk3"),
                ("ttl_ms", "500"),
                ("stale_pct", "20"),
                ("sync", sync),
            ],
        );
    }
    sleep(Duration::from_millis(3000));
    kill_server(&cluster);
    // Taken once the server is dead, not before the kill: a reply can still reach a client
    // while the signals are on their way, and it was acknowledged before the crash.
    let kill_us = now_us();
    cluster.pg_ctl("start -w -t 60");
    let restarted_us = now_us();
    sleep(Duration::from_millis(3000));
    run.stop(Duration::from_secs(60));
    drop(c); // died with the server
    let mut c2 = cluster.reconnect(Duration::from_secs(30));
    let opts = CheckOptions {
        restarts: vec![Restart {
            kill_us,
            restarted_us,
        }],
    };
    let history = run.history(&mut c2);
    let granted = |o: &&Op| o.kind == Kind::Acquire && o.ok();
    let before: Vec<i64> = history
        .ops
        .iter()
        .filter(granted)
        .filter(|o| o.end_us < kill_us)
        .filter_map(|o| o.token)
        .collect();
    let after: Vec<i64> = history
        .ops
        .iter()
        .filter(granted)
        .filter(|o| o.start_us > restarted_us)
        .filter_map(|o| o.token)
        .filter(|t| !before.contains(t)) // a pre-crash grant given back to its owner
        .collect();
    let (highest_before, lowest_after) =
        (before.iter().max().copied(), after.iter().min().copied());
    let report = finish(
        &run,
        &mut c2,
        &opts,
        false,
        &format!(
            "acquires-granted-before-crash={} after-restart={} highest-token-before={} lowest-new-token-after={} \
             restart-ms={}",
            before.len(),
            after.len(),
            highest_before.unwrap_or(0),
            lowest_after.unwrap_or(0),
            (restarted_us - kill_us) / 1000
        ),
    );
    assert!(
        !before.is_empty() && !after.is_empty(),
        "grants before ({before:?}) and after ({after:?}) the crash"
    );
    assert!(report.failed_ops > 0, "the crash was felt by the clients");
}

/// The server runs under libfaketime; while 8 clients work, its clock is stepped forward
/// and back by minutes. Leases end early (forward) or late (back): in server time grants
/// may then seem to overlap, and in real time they really do. Fencing keeps invariants
/// 1-3. Overlaps are counted, not failed.
#[test]
fn server_clock_steps_forward_and_back_by_minutes() {
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: apt-get install faketime (scripts/bootstrap.sh does)"
    );
    let offset = PathBuf::from(format!(
        "/tmp/lockext-tests/faketime-{}.rc",
        std::process::id()
    ));
    std::fs::create_dir_all(offset.parent().unwrap()).unwrap();
    set_fake_offset(&offset, "+0");
    let env = faketime_env(&offset);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let cluster = Cluster::start_with_env("faults-clock", "lockext.reap_interval = '50ms'", &env);
    let mut c = setup(&cluster);
    let mut run = Run::new("clock");
    for i in 0..8 {
        run.spawn(
            &cluster,
            &format!("c{i}"),
            "worker",
            &[
                ("locks", "lk0,lk1,lk2,lk3"),
                ("ttl_ms", "300"),
                ("stale_pct", "20"),
            ],
        );
    }
    let mut seen = Vec::new();
    for (text, secs) in [
        ("+4m", 240),
        ("+0", 0),
        ("-3m", -180),
        ("+5m", 300),
        ("+0", 0),
    ] {
        sleep(Duration::from_millis(1600));
        set_fake_offset(&offset, text);
        // The server's clock really moved (libfaketime is in effect).
        let got = eventually(
            Duration::from_secs(10),
            &format!("server clock at {text}"),
            || {
                let off = (server_clock_us(&mut c) - now_us()) / 1_000_000;
                ((off - secs).abs() <= 20).then_some(off)
            },
        );
        seen.push(format!("{got:+}s"));
    }
    sleep(Duration::from_millis(1000));
    run.stop(Duration::from_secs(60));
    let _ = std::fs::remove_file(&offset);
    finish(
        &run,
        &mut c,
        &CheckOptions::default(),
        true,
        &format!("server-clock-offsets={}", seen.join(",")),
    );
}

/// Holders keep leases live (renewing every 100 ms), workers churn short leases, and the
/// reaper is busy deleting 20 000 expired ones when it is killed with kill -9. The
/// postmaster resets every backend and restarts the workers; the clients reconnect. No
/// live lease is lost: each holder's lease is there with its token and every renewal of
/// it after the restart succeeds; the new reaper clears the expired leases.
#[test]
fn reaper_killed_mid_round_no_live_lease_lost() {
    let cluster = Cluster::start(
        "faults-reaper",
        "lockext.reap_interval = '100ms'\nlockext.reap_batch_size = 200",
    );
    let mut c = setup(&cluster);
    let mut run = Run::new("reaper");
    let mut holders = Vec::new();
    for i in 0..4 {
        let lock = format!("hold-{i}");
        let h = run.spawn(
            &cluster,
            &format!("h{i}"),
            "holder",
            &[("locks", &lock), ("ttl_ms", "30000")],
        );
        holders.push(h);
    }
    for i in 0..4 {
        run.spawn(
            &cluster,
            &format!("w{i}"),
            "worker",
            &[("locks", "lk0,lk1"), ("ttl_ms", "150"), ("stale_pct", "20")],
        );
    }
    let mut held = Vec::new();
    for &h in &holders {
        let line = run.read_line(h);
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f[0], "granted", "{line}");
        held.push((
            f[1].to_string(),
            f[2].to_string(),
            f[3].parse::<i64>().unwrap(),
        ));
    }

    c.batch_execute(
        "SELECT count(lockext.lock_acquire('dead-' || g, 'dead-client', '1 millisecond')) \
           FROM generate_series(1, 20000) g",
    )
    .unwrap();
    let dead = |c: &mut Client| -> i64 {
        c.query_one(
            "SELECT count(*) FROM lockext.locks WHERE owner = 'dead-client'",
            &[],
        )
        .unwrap()
        .get(0)
    };
    let old = eventually(Duration::from_secs(10), "a reaper", || {
        reaper_pid(&mut c, "postgres")
    });
    // Kill it while it works through them, if we catch it at it.
    let left = eventually(
        Duration::from_secs(30),
        "the reaper starts on the expired leases",
        || {
            let n = dead(&mut c);
            (n < 20000).then_some(n)
        },
    );
    signal(old, "KILL");
    // The postmaster resets every backend, ours included.
    eventually(
        Duration::from_secs(30),
        "the postmaster resets the backends",
        || c.simple_query("SELECT 1").is_err().then_some(()),
    );
    // Taken once the backends are gone (see the crash scenario).
    let kill_us = now_us();
    let mut c = cluster.reconnect(Duration::from_secs(30));
    let restarted_us = now_us();
    let new = eventually(Duration::from_secs(30), "a new reaper", || {
        reaper_pid(&mut c, "postgres").filter(|&p| p != old)
    });
    assert_ne!(new, old);
    eventually(
        Duration::from_secs(30),
        "the new reaper clears the expired leases",
        || (dead(&mut c) == 0).then_some(()),
    );
    for (lock, owner, token) in &held {
        let row = c
            .query_opt(
                "SELECT owner, fence_token FROM lockext.locks WHERE lock_id = $1",
                &[lock],
            )
            .unwrap()
            .unwrap_or_else(|| panic!("live lease {lock} was lost"));
        assert_eq!(
            (row.get::<_, String>(0), row.get::<_, i64>(1)),
            (owner.clone(), *token),
            "lease {lock}"
        );
    }
    sleep(Duration::from_millis(2000)); // the clients carry on a while
    run.stop(Duration::from_secs(60));
    let opts = CheckOptions {
        restarts: vec![Restart {
            kill_us,
            restarted_us,
        }],
    };
    let history = run.history(&mut c);
    let holder_ids: Vec<String> = (0..4).map(|i| format!("h{i}")).collect();
    let mut renewals_after = 0;
    for o in history
        .ops
        .iter()
        .filter(|o| holder_ids.contains(&o.client) && o.kind == Kind::Renew)
    {
        assert_ne!(
            o.outcome,
            Outcome::Refused,
            "holder's renewal {} refused: its live lease was lost",
            o.id()
        );
        if o.ok() && o.start_us > restarted_us {
            renewals_after += 1;
        }
    }
    assert!(renewals_after > 0, "holders renewed after the restart");
    finish(
        &run,
        &mut c,
        &opts,
        false,
        &format!(
            "expired-leases-left-at-kill={left} holder-renewals-after-restart={renewals_after}"
        ),
    );
}

// ---------------------------------------------------------------------------------------
// The checker's own tests: bad histories must be reported.
// ---------------------------------------------------------------------------------------

struct Builder {
    h: History,
    seq: u64,
}

const MS: i64 = 1000;

impl Builder {
    fn new() -> Builder {
        Builder {
            h: History::default(),
            seq: 0,
        }
    }

    fn op(
        &mut self,
        client: &str,
        kind: Kind,
        target: &str,
        owner: &str,
        token: Option<i64>,
        at_ms: i64,
    ) -> &mut Op {
        self.seq += 1;
        self.h.ops.push(Op {
            client: client.into(),
            seq: self.seq,
            kind,
            target: target.into(),
            owner: owner.into(),
            token,
            start_us: at_ms * MS,
            end_us: at_ms * MS + 500,
            outcome: Outcome::Ok,
            durable: true,
            srv_before: Some(at_ms * MS),
            srv_after: Some(at_ms * MS + 100),
            acquired_at: None,
            expires_at: None,
        });
        self.h.ops.last_mut().unwrap()
    }

    /// A grant of `lock` to `owner` at `at_ms` for `ttl_ms`.
    fn acquire(
        &mut self,
        client: &str,
        lock: &str,
        owner: &str,
        token: i64,
        at_ms: i64,
        ttl_ms: i64,
    ) -> &mut Op {
        let o = self.op(client, Kind::Acquire, lock, owner, Some(token), at_ms);
        o.acquired_at = Some(at_ms * MS);
        o.expires_at = Some((at_ms + ttl_ms) * MS);
        o
    }

    /// The same owner getting its live grant back (acquired_at unchanged).
    #[allow(clippy::too_many_arguments)]
    fn reacquire(
        &mut self,
        client: &str,
        lock: &str,
        owner: &str,
        token: i64,
        first_ms: i64,
        at_ms: i64,
        ttl_ms: i64,
    ) {
        let o = self.acquire(client, lock, owner, token, at_ms, ttl_ms);
        o.acquired_at = Some(first_ms * MS);
    }

    fn release(
        &mut self,
        client: &str,
        lock: &str,
        owner: &str,
        token: i64,
        at_ms: i64,
        live: bool,
    ) {
        let o = self.op(client, Kind::Release, lock, owner, Some(token), at_ms);
        if !live {
            o.outcome = Outcome::Refused;
        }
    }

    fn renew(
        &mut self,
        client: &str,
        lock: &str,
        owner: &str,
        token: i64,
        at_ms: i64,
        ttl_ms: i64,
    ) {
        let o = self.op(client, Kind::Renew, lock, owner, Some(token), at_ms);
        o.expires_at = Some((at_ms + ttl_ms) * MS);
    }

    /// A write the client saw with `outcome`; returns its op id.
    fn write(
        &mut self,
        client: &str,
        res: &str,
        owner: &str,
        token: i64,
        at_ms: i64,
        outcome: Outcome,
    ) -> String {
        let o = self.op(client, Kind::Write, res, owner, Some(token), at_ms);
        o.outcome = outcome;
        o.id()
    }

    /// Records an accepted write in the server's history (commit order = call order).
    fn stored(&mut self, res: &str, token: i64, op: &str) {
        let seq = self.h.accepted.len() as i64 + 1;
        self.h.accepted.push(Accepted {
            seq,
            resource: res.into(),
            token,
            op: op.into(),
        });
        self.h.resources.retain(|r| r.resource != res);
        self.h.resources.push(FinalResource {
            resource: res.into(),
            token,
            op: Some(op.into()),
        });
    }

    fn check(&self) -> Report {
        check(&self.h, &CheckOptions::default())
    }
}

/// A correct history: A holds, writes, releases; B takes over, renews, writes; A's late
/// write is refused; A re-acquires and gets its grant back.
fn good_history() -> Builder {
    let mut b = Builder::new();
    b.acquire("a", "L", "a-1", 10, 0, 100);
    b.reacquire("a", "L", "a-1", 10, 0, 20, 100);
    let w = b.write("a", "R", "a-1", 10, 30, Outcome::Ok);
    b.stored("R", 10, &w);
    b.acquire("b", "L", "b-1", 11, 130, 100);
    b.renew("b", "L", "b-1", 11, 180, 100);
    let w = b.write("b", "R", "b-1", 11, 200, Outcome::Ok);
    b.stored("R", 11, &w);
    b.write("a", "R", "a-1", 10, 210, Outcome::Refused);
    b.release("a", "L", "a-1", 10, 220, false);
    b.release("b", "L", "b-1", 11, 230, true);
    b.acquire("c", "L", "c-1", 12, 231, 100);
    b
}

#[test]
fn checker_accepts_a_correct_history_and_counts_it() {
    let r = good_history().check();
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!((r.grants, r.same_grant_reacquires), (3, 1));
    assert_eq!(
        (r.writes_acked, r.writes_rejected, r.writes_in_db),
        (2, 1, 2)
    );
    assert_eq!((r.renews_ok, r.releases_ok, r.releases_refused), (1, 1, 1));
    assert_eq!(r.overlaps, 0);
}

#[test]
fn checker_reports_a_token_returned_by_two_grants() {
    let mut b = good_history();
    b.acquire("d", "M", "d-1", 11, 300, 100); // 11 was b's grant of L
    let r = b.check();
    assert_eq!(r.count(Invariant::UniqueTokens), 1, "{:?}", r.violations);

    // The same owner and token but a new acquired_at: a second grant, not the same one.
    let mut b = good_history();
    b.acquire("c", "L", "c-1", 12, 400, 100);
    assert_eq!(b.check().count(Invariant::UniqueTokens), 1);
}

#[test]
fn checker_reports_an_out_of_order_acceptance() {
    let mut b = good_history();
    let w = b.write("a", "R", "a-1", 10, 240, Outcome::Ok);
    b.stored("R", 10, &w); // accepted after token 11
    let r = b.check();
    assert_eq!(r.count(Invariant::MonotonicWrites), 1, "{:?}", r.violations);
}

#[test]
fn checker_reports_a_lost_write() {
    let mut b = good_history();
    b.write("c", "R", "c-1", 12, 240, Outcome::Ok); // acknowledged, never stored
    let r = b.check();
    assert_eq!(r.count(Invariant::NoLostWrites), 1, "{:?}", r.violations);

    // The resource lost its last write although the history has it.
    let mut b = good_history();
    b.h.resources[0].token = 10;
    assert_eq!(b.check().count(Invariant::NoLostWrites), 1);

    // A write refused to its client that is in the database anyway.
    let mut b = good_history();
    let w = b.write("c", "R", "c-1", 12, 240, Outcome::Refused);
    b.stored("R", 12, &w);
    assert_eq!(b.check().count(Invariant::NoLostWrites), 1);
}

#[test]
fn checker_allows_losing_async_writes_only_when_nothing_flushed_them() {
    // The last write, in a synchronous_commit=off session, lost in a crash: allowed.
    let mut b = good_history();
    b.h.ops.iter_mut().for_each(|o| o.durable = o.client != "c");
    b.write("c", "R", "c-1", 12, 240, Outcome::Ok);
    b.h.ops.last_mut().unwrap().durable = false;
    let crash = CheckOptions {
        restarts: vec![Restart {
            kill_us: 400 * MS,
            restarted_us: 500 * MS,
        }],
    };
    let r = check(&b.h, &crash);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!(r.async_writes_lost, 1);

    // ...not without a crash,
    assert_eq!(b.check().count(Invariant::NoLostWrites), 1);

    // ...and not when a synchronous commit started after it and ended before the crash
    // (one after the restart does not count: the write was gone by then).
    b.acquire("d", "M", "d-1", 13, 600, 100);
    assert!(check(&b.h, &crash).violations.is_empty());
    b.acquire("d", "N", "d-2", 14, 300, 100);
    let r = check(&b.h, &crash);
    assert_eq!(r.count(Invariant::NoLostWrites), 1, "{:?}", r.violations);
}

#[test]
fn checker_reports_overlapping_grants() {
    let mut b = Builder::new();
    b.acquire("a", "L", "a-1", 10, 0, 100);
    b.acquire("b", "L", "b-1", 11, 50, 100); // a's lease runs to 100
    let r = b.check();
    assert_eq!(
        (r.overlaps, r.count(Invariant::NoOverlap)),
        (1, 1),
        "{:?}",
        r.violations
    );

    // A renewal extends the lease: a grant after the first expiry but before the renewed
    // one overlaps.
    let mut b = Builder::new();
    b.acquire("a", "L", "a-1", 10, 0, 100);
    b.renew("a", "L", "a-1", 10, 80, 100);
    b.acquire("b", "L", "b-1", 11, 120, 100);
    assert_eq!(b.check().overlaps, 1);

    // Released before: no overlap.
    let mut b = Builder::new();
    b.acquire("a", "L", "a-1", 10, 0, 100);
    b.release("a", "L", "a-1", 10, 40, true);
    b.acquire("b", "L", "b-1", 11, 50, 100);
    assert_eq!(b.check().overlaps, 0);

    // Overlaps may be allowed (clock steps), other violations not.
    let mut b = Builder::new();
    b.acquire("a", "L", "a-1", 10, 0, 100);
    b.acquire("b", "L", "b-1", 11, 50, 100);
    assert!(b.check().failures(true).is_empty());
    assert_eq!(b.check().failures(false).len(), 1);
}

#[test]
fn checker_reports_a_token_at_or_below_one_acknowledged_before_a_crash() {
    let opts = CheckOptions {
        restarts: vec![Restart {
            kill_us: 500 * MS,
            restarted_us: 900 * MS,
        }],
    };
    let mut b = good_history();
    b.acquire("d", "M", "d-1", 5, 1000, 100); // 12 was acknowledged before the crash
    let r = check(&b.h, &opts);
    assert_eq!(
        r.count(Invariant::TokensAfterRestart),
        1,
        "{:?}",
        r.violations
    );
    assert_eq!(r.violations.len(), 1, "{:?}", r.violations);

    // A grant made before the crash whose reply was lost, given back after the restart
    // to the same owner retrying: not a new grant.
    let mut b = good_history();
    b.op("e", Kind::Acquire, "M", "e-1", None, 400).outcome = Outcome::Failed {
        code: None,
        message: "connection closed".into(),
    };
    b.acquire("e", "M", "e-1", 5, 1000, 100).acquired_at = Some(400 * MS);
    let r = check(&b.h, &opts);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    // The same grant (token 12, acquired before) coming back after the restart: not new.
    b.reacquire("c", "L", "c-1", 12, 231, 1000, 100);
    let r = check(&b.h, &opts);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}

#[test]
fn checker_reports_errors_no_fault_explains() {
    let mut b = good_history();
    b.op("d", Kind::Write, "R", "d-1", Some(99), 300).outcome = Outcome::Failed {
        code: Some("22023".into()),
        message: "fence token 99 was never issued".into(),
    };
    b.op("d", Kind::Acquire, "L", "d-2", None, 310).outcome = Outcome::Failed {
        code: Some("57P01".into()),
        message: "terminating connection".into(),
    };
    b.op("d", Kind::Acquire, "L", "d-3", None, 320).outcome = Outcome::Failed {
        code: None,
        message: "connection closed".into(),
    };
    let r = b.check();
    assert_eq!(r.count(Invariant::UnexpectedError), 1, "{:?}", r.violations);
    assert_eq!((r.failed_ops, r.writes_unknown), (3, 1));
}

#[test]
fn history_lines_round_trip() {
    let b = good_history();
    let mut failed = b.h.ops[0].clone();
    failed.outcome = Outcome::Failed {
        code: Some("08006".into()),
        message: "broken\tpipe: eof".into(),
    };
    for o in b.h.ops.iter().chain([&failed]) {
        let back = Op::from_line(&o.to_line()).unwrap();
        let mut expected = o.clone();
        if let Outcome::Failed { message, .. } = &mut expected.outcome {
            *message = message.replace('\t', " ");
        }
        assert_eq!(back, expected);
    }
}
