//! Support for tests that drive a real PostgreSQL server with lockext installed, through
//! real client connections: a scratch cluster per test, owned by the `postgres` OS user
//! (PostgreSQL refuses to run as root), on a loopback port, stopped when dropped, even
//! when the test fails.
//!
//! The extension must already be installed into the system PostgreSQL (`make install`).

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub use postgres::{Client, NoTls};

pub mod checks;
pub mod citus;
pub mod client;
pub mod crash;
pub mod gdb;
pub mod history;
pub mod leases;
pub mod packages;
pub mod permits;
pub mod race;

/// xorshift64*: enough randomness for a test's choices (pauses, which client to stop), and
/// reproducible from a seed. Seed it with an odd number.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in 0..n (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True p times in 100.
    pub fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// The server's binaries: the system PostgreSQL 15, or the installation that
/// `LOCKEXT_PG_BIN` names when the tests run (`make cluster-test PG=18` sets it; a
/// relocated tree with a build of lockext of its own). Read at run time, so that one build
/// of the tests serves every version. It prints as the path (`{PG_BIN}` in a command).
pub static PG_BIN: PgBin = PgBin;

pub struct PgBin;

impl PgBin {
    pub fn path(&self) -> &'static str {
        static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        BIN.get_or_init(|| {
            std::env::var("LOCKEXT_PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into())
        })
    }
}

impl std::fmt::Display for PgBin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.path())
    }
}

/// The major version of the server whose binaries are in `bin` (15, 16, ...).
pub fn pg_major(bin: &str) -> u32 {
    let out = Command::new(format!("{bin}/pg_config"))
        .arg("--version")
        .output()
        .expect("run pg_config --version");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .strip_prefix("PostgreSQL ")
        .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("{bin}/pg_config --version said {text:?}"))
}

pub struct Cluster {
    pub name: String,
    pub port: u16,
    pub dir: PathBuf,
}

/// libfaketime, from Debian's `faketime` package.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

impl Cluster {
    /// Creates and starts a cluster with lockext preloaded and `extra_conf` appended to
    /// postgresql.conf, and creates the extension in database `postgres`.
    pub fn start(name: &str, extra_conf: &str) -> Cluster {
        Cluster::start_with_env(name, extra_conf, &[])
    }

    /// As `start`, with extra environment variables for the server processes (for
    /// instance `LD_PRELOAD` of libfaketime; see `faketime_env`). Values must not
    /// contain single quotes.
    pub fn start_with_env(name: &str, extra_conf: &str, env: &[(&str, &str)]) -> Cluster {
        let cluster = Cluster::init_with_env(name, extra_conf, env);
        cluster.pg_ctl("start -w -t 60");
        cluster
            .connect()
            .batch_execute("CREATE EXTENSION lockext")
            .expect("create extension");
        cluster
    }

    /// As `start_with_env`, but neither started nor with the extension: for a test that
    /// starts it with another installation's binaries (`pg_ctl_from`).
    pub fn init_with_env(name: &str, extra_conf: &str, env: &[(&str, &str)]) -> Cluster {
        Cluster::init_from(
            std::path::Path::new(PG_BIN.path()),
            name,
            extra_conf,
            env,
            "",
        )
    }

    /// As `init_with_env`, made by the `initdb` of the installation whose binaries are in
    /// `bin` (another major version's, for `pg_upgrade`) with `initdb_args` added; start it
    /// with `pg_ctl_from`.
    pub fn init_from(
        bin: &std::path::Path,
        name: &str,
        extra_conf: &str,
        env: &[(&str, &str)],
        initdb_args: &str,
    ) -> Cluster {
        let port = free_port();
        let dir = PathBuf::from(format!("/tmp/lockext-tests/{name}-{port}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create cluster dir");
        // The parent for the postgres user to enter, and this cluster's own directory: never
        // the whole tree, whose other clusters (another test run's) come and go meanwhile.
        run_checked(
            Command::new("chown")
                .arg("postgres:postgres")
                .arg("/tmp/lockext-tests"),
        );
        run_checked(
            Command::new("chown")
                .arg("-R")
                .arg("postgres:postgres")
                .arg(&dir),
        );
        let cluster = Cluster {
            name: name.to_string(),
            port,
            dir,
        };
        if !env.is_empty() {
            let text: String = env.iter().map(|(k, v)| format!("{k}='{v}'\n")).collect();
            fs::write(cluster.env_path(), text).expect("write server.env");
        }
        cluster.as_postgres(&format!(
            "{}/initdb -D {} -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 {initdb_args}",
            bin.display(),
            cluster.data().display()
        ));
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             max_connections = 100\nshared_preload_libraries = 'lockext'\n\
             log_line_prefix = '%m [%p] %b '\n{extra_conf}\n",
            cluster.dir.display()
        );
        let conf_path = cluster.data().join("postgresql.conf");
        let mut text = fs::read_to_string(&conf_path).expect("read postgresql.conf");
        text.push_str(&conf);
        fs::write(&conf_path, text).expect("write postgresql.conf");
        cluster
    }

    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn url(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db} connect_timeout=10",
            self.port
        )
    }

    pub fn connect(&self) -> Client {
        self.connect_to("postgres")
    }

    pub fn connect_to(&self, db: &str) -> Client {
        Client::connect(&self.url(db), NoTls)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url(db)))
    }

    /// Connects to `db` as the login role `role` (loopback connections are trusted).
    pub fn connect_as(&self, role: &str, db: &str) -> Client {
        let url = self
            .url(db)
            .replace("user=postgres", &format!("user={role}"));
        Client::connect(&url, NoTls).unwrap_or_else(|e| panic!("connect as {role} to {db}: {e}"))
    }

    /// Connects, retrying while the server restarts (after a crash, say).
    pub fn reconnect(&self, within: Duration) -> Client {
        let deadline = Instant::now() + within;
        loop {
            match Client::connect(&self.url("postgres"), NoTls) {
                Ok(c) => return c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("server did not come back within {within:?}: {e}"),
            }
        }
    }

    /// Extra environment of the server processes, as `sh` assignments, read by every
    /// `pg_ctl` call when the file exists (see `start_with_env`).
    pub fn env_path(&self) -> PathBuf {
        self.dir.join("server.env")
    }

    pub fn pg_ctl(&self, args: &str) {
        self.pg_ctl_from(std::path::Path::new(PG_BIN.path()), args);
    }

    /// `pg_ctl` of the installation whose binaries are in `bin`: it starts that
    /// installation's `postgres`, which loads that installation's libraries.
    pub fn pg_ctl_from(&self, bin: &std::path::Path, args: &str) {
        let env = self.env_path();
        let env = if env.exists() {
            format!("set -a; . {}; set +a; ", env.display())
        } else {
            String::new()
        };
        self.as_postgres(&format!(
            "{env}{}/pg_ctl -D {} -l {} {args}",
            bin.display(),
            self.data().display(),
            self.log_path().display()
        ));
    }

    fn as_postgres(&self, cmd: &str) {
        run_checked(Command::new("runuser").args(["-u", "postgres", "--", "sh", "-c", cmd]));
    }

    /// The postmaster's pid, from postmaster.pid.
    pub fn postmaster_pid(&self) -> i32 {
        let text = fs::read_to_string(self.data().join("postmaster.pid")).expect("postmaster.pid");
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("pid in postmaster.pid")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--", "sh", "-c"])
            .arg(format!(
                "{PG_BIN}/pg_ctl -D {} -m immediate -w stop",
                self.data().display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.dir);
        } else {
            eprintln!(
                "cluster {} kept for inspection in {}",
                self.name,
                self.dir.display()
            );
        }
    }
}

fn run_checked(cmd: &mut Command) {
    let out = cmd.output().expect("spawn command");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A loopback port nobody listens on now.
/// A free loopback port: one the OS picks, or the first free one of the range
/// `LOCKEXT_TEST_PORTS` names (`5800-5849`: an engineer sharing the machine keeps to theirs).
pub fn free_port() -> u16 {
    let range = std::env::var("LOCKEXT_TEST_PORTS").ok().and_then(|r| {
        let (low, high) = r.split_once('-')?;
        Some((low.parse::<u16>().ok()?, high.parse::<u16>().ok()?))
    });
    if let Some((low, high)) = range {
        return (low..=high)
            .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
            .expect("a free port in LOCKEXT_TEST_PORTS");
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    listener.local_addr().expect("local addr").port()
}

/// Environment that runs the server under libfaketime with its clock offset read from
/// `offset_file` at every clock call (write e.g. `+4m`, `-90`, `+0` into it, atomically,
/// to step the server's wall clock). Only the wall clock moves (CLOCK_REALTIME and
/// friends); monotonic clocks and file timestamps stay real, as when NTP steps a clock.
pub fn faketime_env(offset_file: &std::path::Path) -> Vec<(&'static str, String)> {
    vec![
        ("LD_PRELOAD", LIBFAKETIME.to_string()),
        ("FAKETIME_TIMESTAMP_FILE", offset_file.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        ("NO_FAKE_STAT", "1".to_string()),
    ]
}

/// Writes a libfaketime offset (`+4m`, `-3m`, `+0`) so that readers never see half a file.
pub fn set_fake_offset(offset_file: &std::path::Path, offset: &str) {
    let tmp = offset_file.with_extension("tmp");
    fs::write(&tmp, format!("{offset}\n")).expect("write faketime offset");
    fs::rename(&tmp, offset_file).expect("rename faketime offset");
}

/// The pids of the direct children of `pid` (the server processes of a postmaster).
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Some((_, ppid)) = proc_stat(child) {
            if ppid == pid {
                out.push(child);
            }
        }
    }
    out
}

/// (state, parent pid) of a process from /proc/PID/stat; state 'T' is stopped.
pub fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid ...": comm may hold spaces and parentheses; it ends at the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether every thread of `pid` is stopped (state 'T' in /proc/PID/task/*/stat); false when
/// the process has no live thread left.
pub fn all_threads_stopped(pid: i32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut live = 0;
    for task in tasks.flatten() {
        let Ok(text) = fs::read_to_string(task.path().join("stat")) else {
            continue; // a thread that just exited
        };
        let state = text
            .rfind(')')
            .and_then(|i| text[i + 1..].split_whitespace().next());
        match state {
            None | Some("Z" | "X") => continue, // a dead thread will not run again
            Some("T") => live += 1,
            Some(_) => return false,
        }
    }
    live > 0
}

/// Sends SIGSTOP to `pid` and returns once every thread of it is stopped (panics after 10 s).
/// `kill -STOP` returns once the signal is queued: the one thread woken to take it stops the
/// others only when it gets to run, and until then the process goes on (a multi-threaded
/// one can read its stdin and act on it, a postmaster can see its children die).
pub fn sigstop(pid: i32, what: &str) {
    signal(pid, "STOP");
    eventually(
        Duration::from_secs(10),
        &format!("{what} (pid {pid}) is stopped"),
        || all_threads_stopped(pid).then_some(()),
    );
}

/// Sends a signal to a process (`kill -SIG pid`).
pub fn signal(pid: i32, sig: &str) {
    run_checked(
        Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string()),
    );
}

/// Polls `check` until it returns Some, or panics with `what` after `within`.
pub fn eventually<T>(within: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        sleep(Duration::from_millis(50));
    }
}

/// The pid of the reaper of `db`, if one is running.
pub fn reaper_pid(client: &mut Client, db: &str) -> Option<i32> {
    client
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'lockext reaper' AND datname = $1",
            &[&db],
        )
        .ok()
        .flatten()
        .map(|row| row.get(0))
}

/// The pid of the reaper's launcher, if one is running.
pub fn launcher_pid(client: &mut Client) -> Option<i32> {
    client
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'lockext launcher'",
            &[],
        )
        .expect("pg_stat_activity")
        .map(|row| row.get(0))
}

pub fn count_leases(client: &mut Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM lockext.locks", &[])
        .expect("count leases")
        .get(0)
}
