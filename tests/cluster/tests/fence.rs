//! A real client process, paused with SIGSTOP past its lease, writes a user table through
//! lockext.fence after SIGCONT: its whole transaction aborts with 55L01, and the table
//! holds only the new holder's write.

use std::io::Write;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use lockext_cluster_tests::*;

#[test]
fn paused_client_transaction_is_aborted_by_the_fence() {
    let cluster = Cluster::start("fence-pause", "");
    let mut c = cluster.connect();
    c.batch_execute(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, written_by text);
         INSERT INTO accounts VALUES (42, 100, 'nobody');",
    )
    .unwrap();

    // Client A: a psql process that takes the lock and will write once it is told to.
    let mut a = Command::new(format!("{PG_BIN}/psql"))
        .args([
            "-X",
            "-q",
            "-v",
            "VERBOSITY=verbose",
            "-v",
            "ON_ERROR_STOP=0",
        ])
        .arg(cluster.url("postgres"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn psql");
    let mut a_in = a.stdin.take().unwrap();
    writeln!(a_in, "SELECT fence_token AS a FROM lockext.lock_acquire('acct:42', 'A', '300 milliseconds') \\gset").unwrap();
    a_in.flush().unwrap();
    let a_token = eventually(Duration::from_secs(10), "A holds the lock", || {
        c.query_opt(
            "SELECT fence_token FROM lockext.locks WHERE lock_id = 'acct:42' AND owner = 'A'",
            &[],
        )
        .unwrap()
        .map(|row| row.get::<_, i64>(0))
    });

    // A is paused (a GC pause, a VM stall) for longer than its lease.
    sigstop(a.id() as i32, "client A");
    // Its next transaction is already written and waiting in the pipe.
    writeln!(
        a_in,
        "BEGIN;\nSELECT lockext.fence('acct:42', :a);\n\
         UPDATE accounts SET balance = 0, written_by = 'A' WHERE id = 42;\nCOMMIT;"
    )
    .unwrap();
    a_in.flush().unwrap();
    thread::sleep(Duration::from_millis(600));

    // B takes the expired lock with a higher token and writes through the fence.
    let b_token: i64 = c
        .query_one(
            "SELECT (lockext.lock_acquire('acct:42', 'B', '1 minute')).fence_token",
            &[],
        )
        .unwrap()
        .get::<_, Option<i64>>(0)
        .expect("B gets the expired lock");
    assert!(b_token > a_token);
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT lockext.fence('acct:42', $1)", &[&b_token])
        .unwrap();
    tx.execute(
        "UPDATE accounts SET balance = 80, written_by = 'B' WHERE id = 42",
        &[],
    )
    .unwrap();
    tx.commit().unwrap();

    // A wakes up believing it still holds the lock.
    signal(a.id() as i32, "CONT");
    drop(a_in); // end of input: psql runs what it has and exits
    let out = a.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("client A (token {a_token}) after SIGCONT:\n{stderr}");
    assert!(
        stderr.contains("ERROR:  55L01: fence token"),
        "A's transaction fails with 55L01:\n{stderr}"
    );
    assert!(
        stderr.contains("current transaction is aborted"),
        "A's UPDATE never runs:\n{stderr}"
    );

    let row = c
        .query_one(
            "SELECT balance, written_by FROM accounts WHERE id = 42",
            &[],
        )
        .unwrap();
    assert_eq!(
        (row.get::<_, i32>(0), row.get::<_, String>(1)),
        (80, "B".to_string())
    );
}
