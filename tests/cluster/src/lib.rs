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

pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

pub struct Cluster {
    pub name: String,
    pub port: u16,
    pub dir: PathBuf,
}

impl Cluster {
    /// Creates and starts a cluster with lockext preloaded and `extra_conf` appended to
    /// postgresql.conf, and creates the extension in database `postgres`.
    pub fn start(name: &str, extra_conf: &str) -> Cluster {
        let port = free_port();
        let dir = PathBuf::from(format!("/tmp/lockext-tests/{name}-{port}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create cluster dir");
        run_checked(Command::new("chown").arg("-R").arg("postgres:postgres").arg("/tmp/lockext-tests"));
        let cluster = Cluster { name: name.to_string(), port, dir };
        cluster.as_postgres(&format!(
            "{PG_BIN}/initdb -D {} -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8",
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
        cluster.pg_ctl("start -w -t 60");
        cluster.connect().batch_execute("CREATE EXTENSION lockext").expect("create extension");
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
        format!("host=127.0.0.1 port={} user=postgres dbname={db} connect_timeout=10", self.port)
    }

    pub fn connect(&self) -> Client {
        self.connect_to("postgres")
    }

    pub fn connect_to(&self, db: &str) -> Client {
        Client::connect(&self.url(db), NoTls)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url(db)))
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

    pub fn pg_ctl(&self, args: &str) {
        self.as_postgres(&format!(
            "{PG_BIN}/pg_ctl -D {} -l {} {args}",
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
        text.lines().next().and_then(|l| l.trim().parse().ok()).expect("pid in postmaster.pid")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--", "sh", "-c"])
            .arg(format!("{PG_BIN}/pg_ctl -D {} -m immediate -w stop", self.data().display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("cluster {} kept for inspection in {}", self.name, self.dir.display());
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
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    listener.local_addr().expect("local addr").port()
}

/// Sends a signal to a process (`kill -SIG pid`).
pub fn signal(pid: i32, sig: &str) {
    run_checked(Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()));
}

/// Polls `check` until it returns Some, or panics with `what` after `within`.
pub fn eventually<T>(within: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for: {what}");
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

pub fn count_leases(client: &mut Client) -> i64 {
    client.query_one("SELECT count(*) FROM lockext.locks", &[]).expect("count leases").get(0)
}
