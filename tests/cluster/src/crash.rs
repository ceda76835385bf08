//! Crashes at a known point, and dumps: stopping the WAL writer (SIGSTOP) so that
//! asynchronous commits stay in the server's WAL buffers, killing the whole server with
//! kill -9 so that whatever was not yet written is lost, restarting it, reading the WAL
//! positions that say what a crash loses, and running pg_dump/pg_restore/createdb.
//!
//! A kill -9 loses the WAL that was inserted but not yet written (the OS keeps what the
//! server wrote, even unflushed): with the WAL writer stopped, an asynchronous commit's
//! WAL is written only when something flushes (a synchronous commit, a full WAL buffer).
//! Clusters for such tests should run with `CALM_CONF`, so that no background writer or
//! autovacuum worker flushes WAL behind the test's back.

use std::fs;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{children, eventually, proc_stat, signal, sigstop, Client, Cluster, PG_BIN};

/// postgresql.conf lines that keep background processes from writing WAL out during a
/// test: no autovacuum workers, no background-writer buffer writes (each flushes the WAL
/// up to the buffer's LSN first), no timed checkpoints.
pub const CALM_CONF: &str =
    "autovacuum = off\nbgwriter_lru_maxpages = 0\ncheckpoint_timeout = '1h'\n";

/// Runs `cmd` with `sh -c` as the `postgres` OS user; panics unless it succeeds; returns
/// its standard output.
pub fn as_postgres(cmd: &str) -> String {
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--", "sh", "-c", cmd])
        .output()
        .expect("spawn runuser");
    assert!(
        out.status.success(),
        "{cmd}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kill -9 of the postmaster, then a restart once its orphans have let go of shared memory.
pub fn crash_and_restart(cluster: &Cluster) -> Client {
    signal(cluster.postmaster_pid(), "KILL");
    restart_after_crash(cluster)
}

/// Starts a server that was killed, retrying until its old processes have let go of
/// shared memory and the data directory; returns a connection to `postgres`.
pub fn restart_after_crash(cluster: &Cluster) -> Client {
    let data = cluster.data();
    let log = cluster.log_path();
    eventually(
        Duration::from_secs(60),
        "the server restarts after kill -9",
        || {
            let started = Command::new("runuser")
                .args(["-u", "postgres", "--", "sh", "-c"])
                .arg(format!(
                    "{PG_BIN}/pg_ctl -D {} -l {} -w -t 20 start",
                    data.display(),
                    log.display()
                ))
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            started.then_some(())
        },
    );
    cluster.reconnect(Duration::from_secs(30))
}

/// A clean restart (`pg_ctl restart -m fast`): a new boot of the server, after a shutdown
/// checkpoint. Returns a connection to `postgres`.
pub fn restart(cluster: &Cluster) -> Client {
    cluster.pg_ctl("restart -m fast -w -t 60");
    cluster.reconnect(Duration::from_secs(30))
}

/// The command line of a process, NULs turned into spaces.
fn cmdline(pid: i32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// The pid of the postmaster's child whose command line contains `needle` (`walwriter`,
/// `background writer`, `checkpointer`).
pub fn server_process(cluster: &Cluster, needle: &str) -> i32 {
    let pm = cluster.postmaster_pid();
    eventually(
        Duration::from_secs(10),
        &format!("a server process {needle:?}"),
        || {
            children(pm)
                .into_iter()
                .find(|&pid| cmdline(pid).contains(needle))
        },
    )
}

/// A process stopped with SIGSTOP; dropping it sends SIGCONT if it is still stopped, so a
/// failed test does not leave a stopped server process behind.
pub struct Frozen {
    pub pid: i32,
    pub what: String,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if matches!(proc_stat(self.pid), Some(('T', _))) {
            let _ = Command::new("kill")
                .args(["-CONT", &self.pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Stops the server process named `needle` with SIGSTOP and waits until it is stopped.
pub fn freeze(cluster: &Cluster, needle: &str) -> Frozen {
    let pid = server_process(cluster, needle);
    sigstop(pid, needle);
    Frozen {
        pid,
        what: needle.to_string(),
    }
}

/// Stops the WAL writer: from now on an asynchronous commit's WAL stays in the WAL
/// buffers until something else flushes it.
pub fn stop_walwriter(cluster: &Cluster) -> Frozen {
    let frozen = freeze(cluster, "walwriter");
    println!("walwriter (pid {}) stopped with SIGSTOP", frozen.pid);
    frozen
}

/// kill -9 of the whole server at this very point: the postmaster is stopped first (so it
/// cannot react to its children dying), then every child is killed, stopped ones included,
/// then the postmaster. Waits until they are all gone. Whatever WAL was not yet written is
/// lost.
pub fn kill_server(cluster: &Cluster) {
    let pm = cluster.postmaster_pid();
    let kids = children(pm);
    sigstop(pm, "the postmaster");
    for &kid in &kids {
        let _ = Command::new("kill")
            .args(["-KILL", &kid.to_string()])
            .stderr(Stdio::null())
            .status();
    }
    signal(pm, "KILL");
    let all: Vec<i32> = kids.iter().copied().chain([pm]).collect();
    eventually(
        Duration::from_secs(30),
        "every server process is gone after kill -9",
        || {
            all.iter()
                .all(|&pid| matches!(proc_stat(pid), None | Some(('Z', _)) | Some(('X', _))))
                .then_some(())
        },
    );
    println!(
        "kill -9 of the postmaster {pm} and its {} children",
        kids.len()
    );
}

/// `kill_server`, then a restart; returns a connection to `postgres`.
pub fn kill_and_restart(cluster: &Cluster) -> Client {
    kill_server(cluster);
    restart_after_crash(cluster)
}

/// The server's WAL positions, in bytes: inserted (in the WAL buffers), written (to the
/// OS: survives a kill -9) and flushed (fsync'ed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wal {
    pub insert: i64,
    pub write: i64,
    pub flush: i64,
}

impl Wal {
    /// Bytes of WAL a kill -9 now would lose.
    pub fn unwritten(&self) -> i64 {
        self.insert - self.write
    }
}

impl std::fmt::Display for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WAL inserted {:X}, written {:X} ({} bytes not written), flushed {:X}",
            self.insert,
            self.write,
            self.unwritten(),
            self.flush
        )
    }
}

/// The WAL positions now (a read-only query: it writes no WAL itself).
pub fn wal(client: &mut Client) -> Wal {
    let row = client
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, \
                    pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, \
                    pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::bigint",
            &[],
        )
        .expect("WAL positions");
    Wal {
        insert: row.get(0),
        write: row.get(1),
        flush: row.get(2),
    }
}

fn conn_args(cluster: &Cluster) -> String {
    format!("-h 127.0.0.1 -p {} -U postgres", cluster.port)
}

/// `pg_dump -Fc` of `db` into `file` (a path the postgres user can write).
pub fn pg_dump(cluster: &Cluster, db: &str, file: &std::path::Path) {
    as_postgres(&format!(
        "{PG_BIN}/pg_dump -Fc -f {} {} -d {db}",
        file.display(),
        conn_args(cluster)
    ));
}

/// `pg_restore --exit-on-error <args> -d db file`.
pub fn pg_restore(cluster: &Cluster, db: &str, file: &std::path::Path, args: &str) {
    as_postgres(&format!(
        "{PG_BIN}/pg_restore --exit-on-error {args} {} -d {db} {}",
        conn_args(cluster),
        file.display()
    ));
}

/// `createdb db`.
pub fn createdb(cluster: &Cluster, db: &str) {
    as_postgres(&format!("{PG_BIN}/createdb {} {db}", conn_args(cluster)));
}

/// A server made from a base backup of `primary` (`pg_basebackup -X stream -c fast
/// <args>`, e.g. `-R` for a streaming standby), not started: its own loopback port and
/// socket directory, and `extra_conf` appended to the postgresql.conf it copied. Start it
/// with `pg_ctl("start -w -t 60")`; it is stopped and removed when dropped, as any cluster.
pub fn base_backup(primary: &Cluster, name: &str, args: &str, extra_conf: &str) -> Cluster {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
        l.local_addr().expect("local addr").port()
    };
    let dir = std::path::PathBuf::from(format!("/tmp/lockext-tests/{name}-{port}"));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create the backup's dir");
    let chown = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(&dir)
        .status()
        .expect("spawn chown");
    assert!(chown.success(), "chown {}", dir.display());
    let backup = Cluster {
        name: name.to_string(),
        port,
        dir,
    };
    as_postgres(&format!(
        "{PG_BIN}/pg_basebackup -D {} {} -X stream -c fast {args}",
        backup.data().display(),
        conn_args(primary)
    ));
    let conf = backup.data().join("postgresql.conf");
    let mut text = fs::read_to_string(&conf).expect("read the backup's postgresql.conf");
    text.push_str(&format!(
        "\n# {name}\nport = {port}\nunix_socket_directories = '{}'\n{extra_conf}\n",
        backup.dir.display()
    ));
    fs::write(&conf, text).expect("write the backup's postgresql.conf");
    backup
}

/// Waits until `standby` has replayed the WAL up to `lsn` (text, as `pg_current_wal_lsn()`
/// gives it on the primary).
pub fn wait_for_replay(standby: &mut Client, lsn: &str, within: Duration) {
    eventually(within, &format!("the standby replays up to {lsn}"), || {
        standby
            .query_one(
                "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)",
                &[&lsn],
            )
            .ok()?
            .get::<_, bool>(0)
            .then_some(())
    });
}

/// The WAL timeline the server writes on now (the one recovery ended on, after it).
pub fn timeline(client: &mut Client) -> i64 {
    client
        .query_one(
            "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint",
            &[],
        )
        .expect("the current timeline")
        .get(0)
}

/// Waits until the server has left recovery (a promotion, or the end of archive recovery).
pub fn wait_for_primary(cluster: &Cluster, within: Duration) -> Client {
    let mut c = cluster.reconnect(within);
    eventually(within, &format!("{} leaves recovery", cluster.name), || {
        let in_recovery: bool = c.query_one("SELECT pg_is_in_recovery()", &[]).ok()?.get(0);
        (!in_recovery).then_some(())
    });
    c
}

/// Makes a directory the `postgres` OS user owns.
pub fn postgres_dir(path: &std::path::Path) {
    let _ = fs::remove_dir_all(path);
    fs::create_dir_all(path).expect("create dir");
    std::process::Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()
        .expect("chown");
}

/// Removes a directory when dropped (a WAL archive shared by several clusters).
pub struct RemoveOnDrop(pub std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// The ledger file of a stopped cluster, as text.
pub fn ledger_file(cluster: &Cluster) -> String {
    fs::read_to_string(cluster.data().join("pg_lockext/ledger")).unwrap_or_default()
}

/// Rewrites one `key value` line of a stopped cluster's ledger file (for a test that needs
/// the era near its end without a few thousand failovers).
pub fn set_ledger(cluster: &Cluster, key: &str, value: i64) {
    let path = cluster.data().join("pg_lockext/ledger");
    let text: String = ledger_file(cluster)
        .lines()
        .map(|l| {
            if l.starts_with(&format!("{key} ")) {
                format!("{key} {value}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    fs::write(&path, text).expect("write the ledger");
}

/// Runs the real `pg_upgrade` of the stopped cluster `old` (its binaries in `old_bin`) into
/// the stopped, freshly made `new` (this installation's, `PG_BIN`), and with `copy_ledger`
/// copies lockext's token ledger file in, as docs/upgrading.md's step 3 says.
pub fn pg_upgrade(old: &Cluster, old_bin: &str, new: &Cluster, copy_ledger: bool) {
    as_postgres(&format!(
        "cd {dir} && {PG_BIN}/pg_upgrade -b {old_bin} -B {PG_BIN} -d {old} -D {new} \
         -p {op} -P {np} -U postgres -s {dir}",
        dir = new.dir.display(),
        old = old.data().display(),
        new = new.data().display(),
        op = old.port,
        np = new.port,
    ));
    if copy_ledger {
        as_postgres(&format!(
            "cp -a {}/pg_lockext {}/",
            old.data().display(),
            new.data().display()
        ));
    }
}
