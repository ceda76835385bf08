//! lockext from Rust (tokio-postgres): a `with_lock` helper and three scenarios.
//!
//!     cargo run --release -- [all|work|lost|pause]      (default: all)
//!
//! Connects to $LOCKEXT_URL (default postgresql://postgres@127.0.0.1:5499/postgres) and
//! exits 0 only if every scenario behaved as it must:
//!
//! - work:  hold a 1 s lease for ~2.5 s of work; the background renewer keeps it, and every
//!   write goes through lockext.fence in the writing transaction.
//! - lost:  an operator releases the lease in the middle of the work; the next renewal
//!   fails, and the work stops at its next check.
//! - pause: holder A is frozen (SIGSTOP, like a long GC pause) past its lease; B takes the
//!   lock with a higher token and writes; A is resumed and writes as if nothing happened:
//!   the write is refused (SQLSTATE 55L01) and B's data stays.
//!
//! Every statement goes through `query_typed`/`execute_typed`: the unnamed statement, with
//! the parameter types given, no named prepared statement. That is what lets this run
//! behind PgBouncer in transaction pooling mode (lockext itself keeps no session state).

use std::future::Future;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls};

const TABLE: &str = "example_ledger_rust";
const STALE: &str = "55L01"; // lockext: stale fence token

#[derive(Debug)]
enum Error {
    /// The lease ended (renewal refused or impossible): stop working.
    LeaseLost(String),
    /// lockext.fence refused our token (55L01): a newer holder has written.
    StaleToken(String),
    Db(tokio_postgres::Error),
    Other(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::LeaseLost(m) => write!(f, "lease lost: {m}"),
            Error::StaleToken(m) => write!(f, "stale token: {m}"),
            Error::Db(e) => write!(f, "database: {e}"),
            Error::Other(m) => write!(f, "{m}"),
        }
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) if db.code().code() == STALE => Error::StaleToken(db.message().to_string()),
            _ => Error::Db(e),
        }
    }
}

type Result<T> = std::result::Result<T, Error>;

fn url() -> String {
    std::env::var("LOCKEXT_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5499/postgres".into())
}

async fn connect() -> Result<Client> {
    let (client, connection) = tokio_postgres::connect(&url(), NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await; // ends when the client is dropped or the connection breaks
    });
    Ok(client)
}

fn interval(d: Duration) -> String {
    format!("{} milliseconds", d.as_millis())
}

/// A grant held by `with_lock`. Fence tokens are 64-bit (about 3.6e16).
struct Lease {
    lock_id: String,
    owner: String,
    token: i64,
    ttl: Duration,
    renewals: AtomicU64,
    /// Why the lease was lost; None while it is held.
    lost: Mutex<Option<String>>,
    /// lock_release's answer, set when `with_lock` ends.
    released: Mutex<Option<bool>>,
}

impl Lease {
    /// Call before each step of work: Err(LeaseLost) once the renewer gave up.
    fn check(&self) -> Result<()> {
        match &*self.lost.lock().unwrap() {
            Some(reason) => Err(Error::LeaseLost(format!("{}: {reason}", self.lock_id))),
            None => Ok(()),
        }
    }

    fn lose(&self, reason: String) {
        *self.lost.lock().unwrap() = Some(reason);
    }

    fn released(&self) -> Option<bool> {
        *self.released.lock().unwrap()
    }
}

/// Renews every `every` on its own connection until `stop` changes. A refused renewal ends
/// the lease at once; failing calls are retried until the lease would have expired anyway
/// (by our own clock, counted from the last successful call).
async fn renewer(lease: Arc<Lease>, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut conn: Option<Client> = None;
    let mut valid_until = Instant::now() + lease.ttl;
    let ttl = interval(lease.ttl);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let sent = Instant::now();
        let attempt = async {
            if conn.as_ref().is_none_or(|c| c.is_closed()) {
                conn = Some(connect().await?);
            }
            let row = conn
                .as_ref()
                .unwrap()
                .query_typed_one(
                    "SELECT lockext.lock_renew($1, $2, $3::text::interval, $4) IS NOT NULL",
                    &[
                        (&lease.lock_id, Type::TEXT),
                        (&lease.owner, Type::TEXT),
                        (&ttl, Type::TEXT),
                        (&lease.token, Type::INT8),
                    ],
                )
                .await?;
            Ok::<bool, Error>(row.get(0))
        };
        match tokio::time::timeout(every, attempt).await {
            Ok(Ok(true)) => {
                lease.renewals.fetch_add(1, Ordering::Relaxed);
                valid_until = sent + lease.ttl;
            }
            Ok(Ok(false)) => {
                lease.lose("renewal refused (expired, released or taken over)".into());
                return;
            }
            failed => {
                if Instant::now() >= valid_until {
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".into(),
                    };
                    lease.lose(format!("could not renew before expiry: {why}"));
                    return;
                }
                conn = None;
            }
        }
    }
}

/// Acquires `lock_id` for `owner` (unique per holder), renews it in the background every
/// ttl/3, runs `work`, and releases the lock at the end, whatever happened. Fails when the
/// lock stays taken for `wait`; returns Err(LeaseLost) when the lease was lost, even if the
/// work itself did not notice.
async fn with_lock<T, F, Fut>(
    lock_id: &str,
    owner: &str,
    ttl: Duration,
    wait: Duration,
    work: F,
) -> (Option<Arc<Lease>>, Result<T>)
where
    F: FnOnce(Arc<Lease>) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let conn = match connect().await {
        Ok(c) => c,
        Err(e) => return (None, Err(e)),
    };
    let acquired = conn
        .query_typed_one(
            "SELECT fence_token FROM lockext.lock_acquire($1, $2, $3::text::interval, wait => $4::text::interval)",
            &[(&lock_id, Type::TEXT), (&owner, Type::TEXT), (&interval(ttl), Type::TEXT), (&interval(wait), Type::TEXT)],
        )
        .await;
    let token: Option<i64> = match acquired {
        Ok(row) => row.get(0),
        Err(e) => return (None, Err(e.into())),
    };
    let Some(token) = token else {
        return (
            None,
            Err(Error::Other(format!(
                "lock {lock_id} still taken after {wait:?}"
            ))),
        );
    };
    let lease = Arc::new(Lease {
        lock_id: lock_id.into(),
        owner: owner.into(),
        token,
        ttl,
        renewals: AtomicU64::new(0),
        lost: Mutex::new(None),
        released: Mutex::new(None),
    });
    let (stop, stopped) = watch::channel(false);
    let renewing = tokio::spawn(renewer(lease.clone(), ttl / 3, stopped));

    let result = work(lease.clone()).await;

    let _ = stop.send(true);
    let _ = renewing.await;
    if let Ok(row) = conn
        .query_typed_one(
            "SELECT lockext.lock_release($1, $2, $3)",
            &[
                (&lock_id, Type::TEXT),
                (&owner, Type::TEXT),
                (&token, Type::INT8),
            ],
        )
        .await
    {
        *lease.released.lock().unwrap() = Some(row.get(0));
    }
    let result = result.and_then(|v| lease.check().map(|_| v));
    (Some(lease), result)
}

/// Runs `sql` in one transaction that starts with lockext.fence(resource, token): if a newer
/// token was fenced on `resource`, the transaction aborts (Err(StaleToken)) and nothing is
/// written.
async fn fenced_write(
    conn: &mut Client,
    lease: &Lease,
    resource: &str,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<()> {
    let tx = conn.transaction().await?;
    tx.execute_typed(
        "SELECT lockext.fence($1, $2)",
        &[(&resource, Type::TEXT), (&lease.token, Type::INT8)],
    )
    .await?;
    tx.execute_typed(sql, params).await?;
    tx.commit().await?;
    Ok(())
}

async fn write_account(
    conn: &mut Client,
    lease: &Lease,
    account: &str,
    writer: &str,
    delta: i64,
) -> Result<()> {
    let sql = format!("UPDATE {TABLE} SET balance = balance + $1, last_writer = $2, last_token = $3 WHERE id = $4");
    let resource = format!("account:{account}");
    fenced_write(
        conn,
        lease,
        &resource,
        &sql,
        &[
            (&delta, Type::INT8),
            (&writer, Type::TEXT),
            (&lease.token, Type::INT8),
            (&account, Type::TEXT),
        ],
    )
    .await
}

async fn setup(conn: &Client, account: &str) -> Result<()> {
    conn.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {TABLE} (id text PRIMARY KEY, balance bigint NOT NULL, last_writer text, last_token bigint)"
    ))
    .await?;
    conn.execute_typed(
        &format!("INSERT INTO {TABLE} (id, balance) VALUES ($1, 0)"),
        &[(&account, Type::TEXT)],
    )
    .await?;
    Ok(())
}

/// (balance, last_writer, last_token)
async fn account_row(conn: &Client, account: &str) -> Result<(i64, Option<String>, Option<i64>)> {
    let row = conn
        .query_typed_one(
            &format!("SELECT balance, last_writer, last_token FROM {TABLE} WHERE id = $1"),
            &[(&account, Type::TEXT)],
        )
        .await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

fn random() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{:08x}", nanos ^ std::process::id().rotate_left(16))
}

fn new_owner(role: &str) -> String {
    let host =
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "localhost".into());
    format!("{}:{}:{role}:{}", host.trim(), std::process::id(), random())
}

fn run_id() -> String {
    format!("{}-{}", std::process::id(), random())
}

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

async fn scenario_work() -> Result<bool> {
    let rid = run_id();
    let account = format!("work-{rid}");
    let mut conn = connect().await?;
    setup(&conn, &account).await?;
    let (lease, result) = with_lock(
        &format!("example:rust:work:{rid}"),
        &new_owner("worker"),
        Duration::from_secs(1),
        Duration::from_secs(30),
        |lease| {
            let conn = &mut conn;
            let account = &account;
            async move {
                for _ in 0..10 {
                    // 10 steps of 250 ms: 2.5 leases long
                    lease.check()?;
                    write_account(conn, &lease, account, "worker", 1).await?;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Ok(())
            }
        },
    )
    .await;
    result?;
    let lease = lease.expect("granted");
    let (balance, _, token) = account_row(&conn, &account).await?;
    let renewals = lease.renewals.load(Ordering::Relaxed);
    println!(
        "work:  10 fenced writes committed={balance}, renewals={renewals}, released={:?}",
        lease.released()
    );
    Ok(balance == 10
        && token == Some(lease.token)
        && renewals >= 3
        && lease.released() == Some(true))
}

async fn scenario_lost() -> Result<bool> {
    let rid = run_id();
    let account = format!("lost-{rid}");
    let lock_id = format!("example:rust:lost:{rid}");
    let mut conn = connect().await?;
    let operator = connect().await?;
    setup(&conn, &account).await?;
    let mut steps = 0i64;
    let (lease, result) = with_lock(
        &lock_id,
        &new_owner("worker"),
        Duration::from_secs(1),
        Duration::from_secs(30),
        |lease| {
            let (conn, account, steps, operator, lock_id) =
                (&mut conn, &account, &mut steps, &operator, &lock_id);
            async move {
                for i in 0..40 {
                    // would take 4 s
                    lease.check()?;
                    write_account(conn, &lease, account, "worker", 1).await?;
                    *steps += 1;
                    if i == 2 {
                        // an operator clears the lock (lockext_admin may do it for any holder)
                        operator
                            .execute_typed(
                                "SELECT lockext.lock_release($1, $2, $3)",
                                &[
                                    (lock_id, Type::TEXT),
                                    (&lease.owner, Type::TEXT),
                                    (&lease.token, Type::INT8),
                                ],
                            )
                            .await?;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(())
            }
        },
    )
    .await;
    let lease = lease.expect("granted");
    let (balance, _, _) = account_row(&conn, &account).await?;
    let stopped = match &result {
        Err(e @ Error::LeaseLost(_)) => Some(e.to_string()),
        Err(e) => return Err(Error::Other(e.to_string())),
        Ok(()) => None,
    };
    println!(
        "lost:  work stopped after {steps} of 40 steps ({stopped:?}); release returned {:?}",
        lease.released()
    );
    Ok(stopped.is_some() && steps < 15 && balance == steps && lease.released() == Some(false))
}

/// Holder A: writes once, says `ready`, blocks on stdin (it is frozen there), then writes
/// again without checking the lease, like code that checked it just before the pause.
async fn pause_a(lock_id: &str, account: &str) -> Result<i32> {
    let mut conn = connect().await?;
    let (lease, result) = with_lock(
        lock_id,
        &new_owner("A"),
        Duration::from_secs(1),
        Duration::from_secs(30),
        |lease| {
            let conn = &mut conn;
            async move {
                lease.check()?;
                write_account(conn, &lease, account, "A", 1).await?;
                println!("ready {}", lease.token);
                let mut line = String::new();
                // `go` was written while we were stopped
                BufReader::new(tokio::io::stdin())
                    .read_line(&mut line)
                    .await
                    .map_err(|e| Error::Other(e.to_string()))?;
                write_account(conn, &lease, account, "A", 1).await
            }
        },
    )
    .await;
    match result {
        Err(Error::StaleToken(m)) => {
            println!("stale write refused: {m}");
            Ok(if lease.and_then(|l| l.released()) == Some(false) {
                0
            } else {
                1
            })
        }
        other => {
            println!("stale write ACCEPTED ({other:?})");
            Ok(1)
        }
    }
}

/// Holder B: waits for the lock, writes, releases; prints its token.
async fn pause_b(lock_id: &str, account: &str) -> Result<i32> {
    let mut conn = connect().await?;
    let (lease, result) = with_lock(
        lock_id,
        &new_owner("B"),
        Duration::from_secs(5),
        Duration::from_secs(10),
        |lease| {
            let conn = &mut conn;
            async move { write_account(conn, &lease, account, "B", 100).await }
        },
    )
    .await;
    result?;
    println!("wrote {}", lease.expect("granted").token);
    Ok(0)
}

fn signal(pid: u32, sig: libc::c_int) {
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Returns once every thread of process `pid` is stopped (state T in
/// /proc/PID/task/*/stat), or an error after `within`. kill(SIGSTOP) is not enough: it
/// returns once the signal is queued, and the one thread woken to take it stops the others
/// only when it gets to run; until then the rest of a multi-threaded process (tokio's
/// workers, the thread that reads stdin) goes on, and could read and act on what we write
/// to its stdin.
async fn wait_stopped(pid: u32, within: Duration) -> std::result::Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        match all_threads_stopped(pid) {
            None => {
                return Err(format!(
                    "no live thread of process {pid} in /proc/{pid}/task: it exited (or this is not Linux)"
                ))
            }
            Some(true) => return Ok(()),
            Some(false) if Instant::now() > deadline => {
                return Err(format!(
                    "process {pid} not stopped {within:?} after SIGSTOP"
                ))
            }
            Some(false) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// Whether every live thread of `pid` is stopped; None when it has none left.
fn all_threads_stopped(pid: u32) -> Option<bool> {
    let mut live = 0;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // a thread that just exited
        };
        // "tid (comm) S ...": comm may hold spaces and ')', the state follows the last ')'.
        let after_comm = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
        match after_comm.split_whitespace().next() {
            None | Some("Z" | "X") => continue, // a dead thread will not run again
            Some("T") => live += 1,
            Some(_) => return Some(false),
        }
    }
    (live > 0).then_some(true)
}

async fn scenario_pause() -> Result<bool> {
    let rid = run_id();
    let account = format!("pause-{rid}");
    let lock_id = format!("example:rust:pause:{rid}");
    let conn = connect().await?;
    setup(&conn, &account).await?;
    let me = std::env::current_exe().map_err(|e| Error::Other(e.to_string()))?;
    let io = |e: std::io::Error| Error::Other(e.to_string());
    let mut a = tokio::process::Command::new(&me)
        .args(["pause-a", &lock_id, &account])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(io)?;
    let a_pid = a.id().expect("A's pid");
    let mut a_in = a.stdin.take().expect("A's stdin");
    let mut a_out = BufReader::new(a.stdout.take().expect("A's stdout")).lines();
    let ready = a_out.next_line().await.map_err(io)?.unwrap_or_default();
    let a_token: i64 = ready
        .trim_start_matches("ready ")
        .parse()
        .map_err(|_| Error::Other(format!("A said {ready:?}")))?;
    signal(a_pid, libc::SIGSTOP); // A, renewer included, is frozen past its 1 s lease
    wait_stopped(a_pid, Duration::from_secs(10))
        .await
        .map_err(|e| Error::Other(format!("A: {e}")))?;
    a_in.write_all(b"go\n").await.map_err(io)?; // A reads it only once resumed
    a_in.flush().await.map_err(io)?;
    let b = tokio::process::Command::new(&me)
        .args(["pause-b", &lock_id, &account])
        .stderr(Stdio::inherit())
        .output()
        .await
        .map_err(io)?;
    let b_token: Option<i64> = if b.status.success() {
        String::from_utf8_lossy(&b.stdout)
            .trim()
            .trim_start_matches("wrote ")
            .parse()
            .ok()
    } else {
        None
    };
    signal(a_pid, libc::SIGCONT);
    let a_said = tokio::time::timeout(Duration::from_secs(30), a_out.next_line())
        .await
        .ok()
        .and_then(|l| l.ok())
        .flatten()
        .unwrap_or_default();
    let a_status = tokio::time::timeout(Duration::from_secs(30), a.wait())
        .await
        .ok()
        .and_then(|s| s.ok());
    let (balance, writer, token) = account_row(&conn, &account).await?;
    println!("pause: A token {a_token}; B token {b_token:?}; A after resuming: {a_said}");
    println!("       account: balance={balance} last_writer={writer:?} last_token={token:?}");
    Ok(a_status.is_some_and(|s| s.success())
        && b_token.is_some_and(|b| b > a_token)
        && balance == 101
        && writer.as_deref() == Some("B")
        && token == b_token)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("all");
    let rc = match mode {
        "pause-a" => pause_a(&args[2], &args[3]).await.unwrap_or_else(|e| {
            println!("error {e}");
            2
        }),
        "pause-b" => pause_b(&args[2], &args[3]).await.unwrap_or_else(|e| {
            println!("error {e}");
            2
        }),
        _ => {
            let names: Vec<&str> = if mode == "all" {
                vec!["work", "lost", "pause"]
            } else {
                vec![mode]
            };
            let mut failed = 0;
            for name in &names {
                let outcome = match *name {
                    "work" => scenario_work().await,
                    "lost" => scenario_lost().await,
                    "pause" => scenario_pause().await,
                    other => Err(Error::Other(format!("unknown scenario {other}"))),
                };
                match outcome {
                    Ok(true) => {}
                    Ok(false) => failed += 1,
                    Err(e) => {
                        println!("{name}: error: {e}");
                        failed += 1;
                    }
                }
            }
            println!("rust: {} passed, {failed} failed", names.len() - failed);
            i32::from(failed > 0)
        }
    };
    std::process::exit(rc);
}
