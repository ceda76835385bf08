//! Waiting for a lock with real sessions: woken by a release, served in arrival order,
//! cancellable, and notifications that only committed changes send.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use lockext_cluster_tests::*;
use postgres::fallible_iterator::FallibleIterator;

fn acquire(c: &mut Client, lock: &str, owner: &str, wait: &str) -> Option<i64> {
    c.query_one(
        "SELECT (lockext.lock_acquire($1, $2, '1 minute', wait => $3::text::interval)).fence_token",
        &[&lock, &owner, &wait],
    )
    .expect("lock_acquire")
    .get(0)
}

fn release(c: &mut Client, lock: &str, owner: &str) -> bool {
    c.query_one("SELECT lockext.lock_release($1, $2)", &[&lock, &owner])
        .unwrap()
        .get(0)
}

fn waiting(c: &mut Client, lock: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM lockext.waiters WHERE lock_id = $1",
        &[&lock],
    )
    .unwrap()
    .get(0)
}

#[test]
fn a_waiter_is_woken_by_the_release_long_before_its_timeout() {
    let cluster = Cluster::start("wait-wake", "");
    let mut holder = cluster.connect();
    acquire(&mut holder, "job", "holder", "0").unwrap();
    let url = cluster.url("postgres");
    let waiter = thread::spawn(move || {
        let mut c = Client::connect(&url, NoTls).unwrap();
        let started = Instant::now();
        let token = acquire(&mut c, "job", "waiter", "60 seconds");
        (token, started.elapsed())
    });
    eventually(Duration::from_secs(10), "the waiter is queued", || {
        (waiting(&mut holder, "job") == 1).then_some(())
    });
    let released_at = Instant::now();
    assert!(release(&mut holder, "job", "holder"));
    let (token, waited) = waiter.join().unwrap();
    assert!(token.is_some(), "the waiter got the lock");
    println!(
        "hand-off: the waiter had the lock {:?} after the release",
        released_at.elapsed()
    );
    assert!(waited < Duration::from_secs(60), "woken before the timeout");
    assert_eq!(waiting(&mut holder, "job"), 0, "and left the queue");
}

#[test]
fn eight_waiters_are_served_in_arrival_order() {
    let cluster = Cluster::start("wait-fifo", "");
    let mut holder = cluster.connect();
    acquire(&mut holder, "queue", "holder", "0").unwrap();
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for i in 0..8 {
        let url = cluster.url("postgres");
        let tx = tx.clone();
        threads.push(thread::spawn(move || {
            let mut c = Client::connect(&url, NoTls).unwrap();
            let owner = format!("w{i}");
            acquire(&mut c, "queue", &owner, "60 seconds").expect("served before the timeout");
            tx.send(i).unwrap();
            thread::sleep(Duration::from_millis(20)); // hold it a moment
            assert!(release(&mut c, "queue", &owner));
        }));
        // Arrival order is the order of queueing: wait until this one is in line.
        eventually(Duration::from_secs(10), "waiter queued", || {
            (waiting(&mut holder, "queue") == i + 1).then_some(())
        });
    }
    let positions: Vec<i64> = holder
        .query(
            "SELECT position FROM lockext.waiters WHERE lock_id = 'queue' ORDER BY waiting_since",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(positions, (1..=8).collect::<Vec<i64>>());
    // Someone who does not wait cannot jump the queue, even when the lock is free for a moment.
    assert!(release(&mut holder, "queue", "holder"));
    let mut order = Vec::new();
    for _ in 0..8 {
        order.push(
            rx.recv_timeout(Duration::from_secs(30))
                .expect("a waiter was served"),
        );
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(order, (0..8).collect::<Vec<i64>>(), "FIFO");
}

#[test]
fn queue_jumpers_are_refused_while_others_wait() {
    let cluster = Cluster::start("wait-jump", "");
    let mut holder = cluster.connect();
    acquire(&mut holder, "door", "holder", "0").unwrap();
    let url = cluster.url("postgres");
    let waiter = thread::spawn(move || {
        let mut c = Client::connect(&url, NoTls).unwrap();
        acquire(&mut c, "door", "patient", "60 seconds")
    });
    eventually(Duration::from_secs(10), "queued", || {
        (waiting(&mut holder, "door") == 1).then_some(())
    });
    // Release and try to snatch it at once in the same transaction (no commit in between:
    // the waiter cannot have been woken yet): the queue comes first.
    let mut jumper = cluster.connect();
    let mut tx = holder.transaction().unwrap();
    tx.execute("SELECT lockext.lock_release('door', 'holder')", &[])
        .unwrap();
    tx.commit().unwrap();
    let snatched = acquire(&mut jumper, "door", "jumper", "0");
    assert!(
        waiter.join().unwrap().is_some(),
        "the patient waiter is served"
    );
    assert_eq!(snatched, None, "the jumper was refused");
}

#[test]
fn a_waiting_backend_can_be_cancelled_and_leaves_the_queue() {
    let cluster = Cluster::start("wait-cancel", "");
    let mut holder = cluster.connect();
    acquire(&mut holder, "job", "holder", "0").unwrap();
    let url = cluster.url("postgres");
    let waiter = thread::spawn(move || {
        let mut c = Client::connect(&url, NoTls).unwrap();
        let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        let err = c
            .query_one(
                "SELECT lockext.lock_acquire('job', 'waiter', '1 minute', wait => '60 seconds')",
                &[],
            )
            .expect_err("cancelled");
        (pid, err.code().map(|c| c.code().to_string()))
    });
    let pid: i32 = eventually(Duration::from_secs(10), "queued", || {
        holder
            .query_opt("SELECT pid FROM lockext.waiters WHERE lock_id = 'job'", &[])
            .unwrap()
            .map(|r| r.get(0))
    });
    holder
        .execute("SELECT pg_cancel_backend($1)", &[&pid])
        .unwrap();
    let (_, code) = waiter.join().unwrap();
    assert_eq!(code.as_deref(), Some("57014"), "query_canceled");
    assert_eq!(
        waiting(&mut holder, "job"),
        0,
        "the cancelled waiter left the queue"
    );

    // statement_timeout ends a wait the same way.
    let mut c = cluster.connect();
    c.batch_execute("SET statement_timeout = '300ms'").unwrap();
    let err = c
        .query_one(
            "SELECT lockext.lock_acquire('job', 'impatient', '1 minute', wait => '60 seconds')",
            &[],
        )
        .expect_err("statement timeout");
    assert_eq!(err.code().map(|c| c.code()), Some("57014"));
    assert_eq!(waiting(&mut holder, "job"), 0);
}

#[test]
fn listeners_hear_only_committed_releases_take_overs_and_expiries() {
    // The reaper sleeps until the take-over has happened: a reaper deleting the expired
    // lease first would turn the take-over into a plain grant.
    let cluster = Cluster::start(
        "wait-notify",
        "lockext.notify = on\nlockext.reap_interval = '1h'",
    );
    let mut listener = cluster.connect();
    listener.batch_execute("LISTEN lockext").unwrap();
    let mut c = cluster.connect();
    // A release that rolls back sends nothing; one that commits does.
    acquire(&mut c, "job", "A", "0").unwrap();
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT lockext.lock_release('job', 'A')", &[])
        .unwrap();
    tx.rollback().unwrap();
    assert!(release(&mut c, "job", "A"));
    // A take-over of an expired lease, and an expiry the reaper clears.
    c.batch_execute("SELECT lockext.lock_acquire('short', 'A', '50 milliseconds')")
        .unwrap();
    thread::sleep(Duration::from_millis(80));
    c.batch_execute(
        "SET lockext.notify = on; SELECT lockext.lock_acquire('short', 'B', '50 milliseconds')",
    )
    .unwrap();
    c.batch_execute("ALTER SYSTEM SET lockext.reap_interval = '100ms'")
        .unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while events.len() < 3 && Instant::now() < deadline {
        let mut notes = listener.notifications();
        let mut it = notes.timeout_iter(Duration::from_millis(200));
        while let Ok(Some(n)) = it.next() {
            assert_eq!(n.channel(), "lockext");
            events.push(n.payload().to_string());
        }
    }
    println!("events: {events:#?}");
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| {
            if e.contains("\"released\"") {
                "released"
            } else if e.contains("\"taken_over\"") {
                "taken_over"
            } else if e.contains("\"expired\"") {
                "expired"
            } else {
                "other"
            }
        })
        .collect();
    assert_eq!(kinds, ["released", "taken_over", "expired"], "{events:?}");
    assert!(events[0].contains("\"lock_id\" : \"job\""), "{}", events[0]);
}

#[test]
fn a_terminated_waiter_leaves_the_queue() {
    let cluster = Cluster::start("wait-terminated", "");
    let mut holder = cluster.connect();
    acquire(&mut holder, "desk", "holder", "0").unwrap();
    let url = cluster.url("postgres");
    let doomed = thread::spawn(move || {
        let mut c = Client::connect(&url, NoTls).unwrap();
        c.query_one(
            "SELECT lockext.lock_acquire('desk', 'doomed', '1 minute', wait => '60 seconds')",
            &[],
        )
        .is_err()
    });
    eventually(Duration::from_secs(10), "the waiter is queued", || {
        (waiting(&mut holder, "desk") == 1).then_some(())
    });
    // A FATAL ends the backend without unwinding its wait: its exit hook must still leave.
    holder
        .execute(
            "SELECT pg_terminate_backend(pid) FROM lockext.waiters WHERE lock_id = 'desk'",
            &[],
        )
        .unwrap();
    assert!(doomed.join().unwrap(), "the terminated waiter got an error");
    eventually(Duration::from_secs(5), "the queue is empty", || {
        (waiting(&mut holder, "desk") == 0).then_some(())
    });
    assert!(release(&mut holder, "desk", "holder"));
    let mut other = cluster.connect();
    assert!(
        acquire(&mut other, "desk", "next", "0").is_some(),
        "nobody is left ahead in the queue, so a caller that does not wait gets the lock"
    );
}

#[test]
fn a_waiter_whose_client_was_killed_leaves_the_queue_and_gets_nothing() {
    let cluster = Cluster::start("wait-client-killed", "");
    let mut holder = cluster.connect();
    acquire(&mut holder, "desk", "holder", "0").unwrap();
    // A real client process, killed with SIGKILL while its backend waits: nothing tells
    // the backend but its socket.
    let mut psql = std::process::Command::new(format!("{PG_BIN}/psql"))
        .args([
            "-X",
            "-q",
            "-h",
            "127.0.0.1",
            "-p",
            &cluster.port.to_string(),
        ])
        .args(["-U", "postgres", "-d", "postgres", "-c"])
        .arg("SELECT lockext.lock_acquire('desk', 'doomed', '1 hour', wait => '60 seconds')")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("psql");
    eventually(Duration::from_secs(10), "the waiter is queued", || {
        (waiting(&mut holder, "desk") == 1).then_some(())
    });
    signal(psql.id() as i32, "KILL");
    let _ = psql.wait();
    eventually(
        Duration::from_secs(5),
        "the dead client's waiter leaves the queue",
        || (waiting(&mut holder, "desk") == 0).then_some(()),
    );
    assert!(release(&mut holder, "desk", "holder"));
    let mut other = cluster.connect();
    assert!(
        acquire(&mut other, "desk", "next", "0").is_some(),
        "nobody is left ahead in the queue"
    );
    let doomed: i64 = holder
        .query_one(
            "SELECT count(*) FROM lockext.locks WHERE owner = 'doomed'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(doomed, 0, "the dead client's backend was granted nothing");
}
