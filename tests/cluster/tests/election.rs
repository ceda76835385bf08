//! Leader election with real sessions and processes: a leader's client killed with SIGKILL
//! and a follower taking over after the ttl, observers (lock_observe and LISTEN) learning
//! the new leader's value, a value change ending an observer's wait, a stale leader
//! refused, and an observer that holds no lock anyone else needs while it waits.
//!
//! Run with `--test-threads=1 --nocapture` to see the measured numbers.

use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;

use lockext_cluster_tests::leases::*;
use lockext_cluster_tests::*;

/// `lock_campaign(lock, owner, ttl, value, wait => wait)`: the token, or None.
fn campaign(
    c: &mut Client,
    lock: &str,
    owner: &str,
    ttl: &str,
    value: &str,
    wait: &str,
) -> Option<i64> {
    c.query_one(
        "SELECT fence_token FROM lockext.lock_campaign($1, $2, $3::text::interval, $4::text::jsonb, wait => $5::text::interval)",
        &[&lock, &owner, &ttl, &value, &wait],
    )
    .unwrap()
    .get(0)
}

/// What lock_observe returned: (changed, owner, token, value as text, version).
type Observed = (
    bool,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<i64>,
);

fn observe(
    c: &mut Client,
    lock: &str,
    token: Option<i64>,
    version: Option<i64>,
    timeout: &str,
) -> Observed {
    let row = c
        .query_one(
            "SELECT changed, owner, fence_token, value::text, version \
               FROM lockext.lock_observe($1, $2, $3, $4::text::interval)",
            &[&lock, &token, &version, &timeout],
        )
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
}

/// (owner, token, value as text, version) of every holder, oldest first.
fn holders_with_values(c: &mut Client, lock: &str) -> Vec<(String, i64, Option<String>, i64)> {
    c.query(
        "SELECT owner, fence_token, value::text, version FROM lockext.lock_holders($1)",
        &[&lock],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

/// A psql client process that runs `script` and stays connected until killed.
fn psql(cluster: &Cluster, script: &str) -> (Child, ChildStdin) {
    let mut child = Command::new(format!("{PG_BIN}/psql"))
        .args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            &cluster.url("postgres"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn psql");
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "{script}").unwrap();
    stdin.flush().unwrap();
    (child, stdin)
}

#[test]
fn leader_killed_follower_takes_over_and_observers_learn() {
    let cluster = Cluster::start("election-kill", "lockext.reap_interval = '100ms'");
    let mut admin = cluster.connect();
    // The leader: a client process that campaigns with a 2 s ttl and then hangs.
    let (mut leader, _stdin) = psql(
        &cluster,
        "SELECT lockext.lock_campaign('svc', 'node-1', '2 seconds', '{\"addr\": \"10.0.0.1:80\"}');\nSELECT pg_sleep(3600);",
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Some(h) = holders_with_values(&mut admin, "svc").into_iter().next() {
            break h;
        }
        assert!(Instant::now() < deadline, "the leader never took the lock");
        thread::sleep(ms(20));
    };
    assert_eq!(first.0, "node-1");
    assert_eq!(first.2.as_deref(), Some(r#"{"addr": "10.0.0.1:80"}"#));
    assert_eq!(first.3, 1);

    // A LISTENer, and an observer that knows the first leader.
    let mut listener = cluster.connect();
    listener.batch_execute("LISTEN lockext").unwrap();
    let (tx, rx) = mpsc::channel();
    let url = cluster.url("postgres");
    let known = first.1;
    let observer = thread::spawn(move || {
        let mut c = Client::connect(&url, NoTls).unwrap();
        let t0 = Instant::now();
        let seen = observe(&mut c, "svc", Some(known), Some(1), "30 seconds");
        tx.send((seen, Instant::now(), t0.elapsed())).unwrap();
    });
    // The follower waits to campaign, as a standby would.
    let (ftx, frx) = mpsc::channel();
    let url = cluster.url("postgres");
    let follower = thread::spawn(move || {
        let mut c = Client::connect(&url, NoTls).unwrap();
        c.batch_execute("SET lockext.notify = on").unwrap();
        let token = campaign(
            &mut c,
            "svc",
            "node-2",
            "1 minute",
            r#"{"addr": "10.0.0.2:80"}"#,
            "20 seconds",
        );
        ftx.send((token, Instant::now())).unwrap();
    });

    // SIGKILL the leader's client: nothing releases its lease, which runs out.
    let killed_at = Instant::now();
    leader.kill().unwrap();
    leader.wait().unwrap();
    not_yet(
        &rx,
        ms(500),
        "the observer, while the dead leader's lease is still live",
    );

    let (token, granted_at) = frx.recv_timeout(Duration::from_secs(20)).unwrap();
    let token = token.expect("the follower takes over once the ttl has passed");
    assert!(token > first.1);
    let took = killed_at.elapsed();
    println!("follower took over {took:?} after the SIGKILL (ttl 2 s)");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let (seen, returned_at, waited) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    println!(
        "observer returned after {waited:?}, {:?} after the take-over committed",
        returned_at.saturating_duration_since(granted_at)
    );
    // It returned when the dead leader's lease ended (free) or at the take-over; either way
    // it has changed, and by the take-over the new address is there.
    assert!(seen.0, "changed: {seen:?}");
    assert_ne!(seen.2, Some(first.1), "{seen:?}");
    let seen = if seen.2 == Some(token) {
        seen
    } else {
        assert_eq!(seen.1, None, "free before the take-over: {seen:?}");
        observe(&mut admin, "svc", None, None, "20 seconds")
    };
    assert_eq!(seen.1.as_deref(), Some("node-2"));
    assert_eq!(seen.3.as_deref(), Some(r#"{"addr": "10.0.0.2:80"}"#));
    observer.join().unwrap();
    follower.join().unwrap();

    // LISTENers saw it too: the take-over (or expiry, then grant) and the new value.
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !events.iter().any(|e: &String| e.contains("value_set")) && Instant::now() < deadline {
        let mut notes = listener.notifications();
        let mut it = notes.timeout_iter(ms(200));
        while let Ok(Some(n)) = it.next() {
            events.push(n.payload().to_string());
        }
    }
    println!("events: {events:#?}");
    let value_set = events
        .iter()
        .find(|e| e.contains("\"value_set\""))
        .expect("a value_set event");
    assert!(
        value_set.contains(&format!("\"fence_token\" : {token}")),
        "{value_set}"
    );
    assert!(value_set.contains("\"version\" : 1"), "{value_set}");
    assert!(
        events
            .iter()
            .any(|e| e.contains("\"taken_over\"") || e.contains("\"expired\"")),
        "the old leader's end is an event: {events:?}"
    );
}

#[test]
fn observe_returns_on_value_change_and_on_resignation() {
    let cluster = Cluster::start("election-observe", "");
    let mut leader = cluster.connect();
    let token = campaign(&mut leader, "svc", "node-1", "1 minute", r#""v1""#, "0").unwrap();

    // A value change ends the wait, with the new value and version.
    let url = cluster.url("postgres");
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let mut c = Client::connect(&url, NoTls).unwrap();
        for known_version in [1, 2] {
            let t0 = Instant::now();
            let seen = observe(
                &mut c,
                "svc",
                Some(token),
                Some(known_version),
                "30 seconds",
            );
            tx.send((seen, t0.elapsed())).unwrap();
        }
    });
    not_yet(&rx, ms(300), "the observer, before any change");
    let t0 = Instant::now();
    let version: i64 = leader
        .query_one(
            "SELECT lockext.lock_set_value('svc', 'node-1', $1, '\"v2\"')",
            &[&token],
        )
        .unwrap()
        .get(0);
    assert_eq!(version, 2);
    let (seen, _) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    println!(
        "observer saw the value change {:?} after it was set",
        t0.elapsed()
    );
    assert_eq!(
        seen,
        (
            true,
            Some("node-1".into()),
            Some(token),
            Some(r#""v2""#.into()),
            Some(2)
        )
    );

    // A resignation ends the next wait: the lock is free.
    not_yet(&rx, ms(300), "the observer, before the release");
    assert!(release(&mut leader, "svc", "node-1"));
    let (seen, _) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(seen, (true, None, None, None, None));
    waiter.join().unwrap();
}

#[test]
fn stale_leader_cannot_overwrite_the_new_leaders_value() {
    let cluster = Cluster::start("election-stale", "");
    let mut old = cluster.connect();
    let mut new = cluster.connect();
    let old_token = campaign(
        &mut old,
        "svc",
        "node-1",
        "300 milliseconds",
        r#""old""#,
        "0",
    )
    .unwrap();
    // The new leader waits for the old lease to run out; the old leader, paused past it,
    // comes back and tries to publish.
    let new_token = campaign(
        &mut new,
        "svc",
        "node-2",
        "1 minute",
        r#""new""#,
        "10 seconds",
    )
    .unwrap();
    assert!(new_token > old_token);
    expect_sqlstate(
        old.query_one(
            "SELECT lockext.lock_set_value('svc', 'node-1', $1, '\"old again\"')",
            &[&old_token],
        ),
        "55L01",
        "a stale leader sets its value",
    );
    // Nor by naming the new leader's owner and token from another role.
    new.batch_execute("CREATE ROLE intruder LOGIN; GRANT lockext_user TO intruder")
        .unwrap();
    let mut intruder = Client::connect(
        &format!(
            "host=127.0.0.1 port={} user=intruder dbname=postgres",
            cluster.port
        ),
        NoTls,
    )
    .unwrap();
    expect_sqlstate(
        intruder.query_one(
            "SELECT lockext.lock_set_value('svc', 'node-2', $1, '\"evil\"')",
            &[&new_token],
        ),
        "55L01",
        "another role sets the leader's value",
    );
    assert_eq!(
        holders_with_values(&mut old, "svc"),
        [(
            "node-2".to_string(),
            new_token,
            Some(r#""new""#.to_string()),
            1
        )]
    );
}

#[test]
fn an_observer_holds_no_lock_and_delays_no_one() {
    let cluster = Cluster::start("election-nolock", "");
    let mut leader = cluster.connect();
    let token = campaign(&mut leader, "svc", "node-1", "1 minute", r#""v1""#, "0").unwrap();
    let url = cluster.url("postgres");
    let observer = thread::spawn(move || {
        let mut c = Client::connect(&url, NoTls).unwrap();
        c.batch_execute("SET application_name = 'observer'")
            .unwrap();
        observe(&mut c, "svc", Some(token), Some(1), "3 seconds")
    });
    let mut admin = cluster.connect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid: i32 = loop {
        if let Some(row) = admin
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'observer' AND query LIKE '%lock_observe%' AND state = 'active'",
                &[],
            )
            .unwrap()
        {
            break row.get(0);
        }
        assert!(Instant::now() < deadline, "the observer never started");
        thread::sleep(ms(10));
    };
    // A look (a read in a subtransaction) holds a few locks for well under a millisecond;
    // between looks there must be none. Sampled until the observer, still waiting, holds
    // none: were they kept across the wait (no subtransaction), no sample would find it so.
    let sample = format!(
        "SELECT count(l.relation) FILTER (WHERE c.relnamespace = 'lockext'::regnamespace) \
           FROM pg_stat_activity a \
           LEFT JOIN pg_locks l ON l.pid = a.pid \
           LEFT JOIN pg_class c ON c.oid = l.relation \
          WHERE a.pid = {pid} AND a.state = 'active' AND a.query LIKE '%lock_observe%' \
         HAVING count(a.pid) > 0"
    );
    eventually(
        Duration::from_secs(2),
        "the observer, while it waits, holding no lock on lockext's tables",
        || {
            let held: Option<i64> = admin.query_opt(&sample, &[]).unwrap().map(|r| r.get(0));
            (held == Some(0)).then_some(())
        },
    );
    // What an administrator's DDL would take: at once, while the observer waits.
    admin
        .batch_execute(
            "SET lock_timeout = '100ms'; BEGIN; \
             LOCK TABLE lockext.locks, lockext.shared_leases, lockext.lease_values IN ACCESS EXCLUSIVE MODE; \
             ROLLBACK",
        )
        .unwrap();
    // Grants, renewals, releases and values go on.
    let t0 = Instant::now();
    assert!(renew(&mut leader, "svc", "node-1", "1 minute").is_some());
    let other = campaign(&mut leader, "other", "node-1", "1 minute", "1", "0").unwrap();
    assert!(release(&mut leader, "other", "node-1"));
    assert!(other > token);
    println!(
        "renew, campaign, release beside an observer: {:?}",
        t0.elapsed()
    );
    let seen = observer.join().unwrap();
    assert!(!seen.0, "nothing changed for it: {seen:?}");
    assert_eq!(seen.2, Some(token));
}

#[test]
fn the_reaper_deletes_values_of_grants_that_ended() {
    let cluster = Cluster::start("election-reap", "lockext.reap_interval = '100ms'");
    let mut c = cluster.connect();
    // Released (a plain lock_release) and expired grants leave their values behind, shown to
    // nobody; with no later campaign on those ids, the reaper deletes them.
    campaign(&mut c, "released", "node-1", "1 minute", r#""r""#, "0").unwrap();
    assert!(release(&mut c, "released", "node-1"));
    campaign(
        &mut c,
        "expired",
        "node-1",
        "100 milliseconds",
        r#""e""#,
        "0",
    )
    .unwrap();
    campaign(&mut c, "live", "node-1", "1 minute", r#""l""#, "0").unwrap();
    let t0 = Instant::now();
    let left = loop {
        let left: Vec<String> = c
            .query(
                "SELECT lock_id FROM lockext.lease_values ORDER BY lock_id",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        if left == ["live"] || t0.elapsed() > Duration::from_secs(10) {
            break left;
        }
        thread::sleep(ms(50));
    };
    println!(
        "values of ended grants deleted {:?} after they ended",
        t0.elapsed()
    );
    assert_eq!(
        left,
        ["live"],
        "the live grant's value stays, the others go"
    );
}
