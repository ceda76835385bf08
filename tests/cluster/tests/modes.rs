//! Shared and exclusive modes, counting semaphores, all-or-nothing acquisition of several
//! locks, session-bound leases and fenced reads (issue 9), with real sessions on a real
//! server.
//!
//! Run with `--test-threads=1 --nocapture` to see the measured numbers.

use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use lockext_cluster_tests::history::{now_us, Kind, Op, Outcome};
use lockext_cluster_tests::permits::check_permits;
use lockext_cluster_tests::*;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn sqlstate(e: &postgres::Error) -> Option<String> {
    e.code().map(|c| c.code().to_string())
}

/// Asserts that `r` failed with SQLSTATE `want`.
fn expect_sqlstate<T>(r: Result<T, postgres::Error>, want: &str, what: &str) {
    match r {
        Ok(_) => panic!("{what}: succeeded, but SQLSTATE {want} was expected"),
        Err(e) => assert_eq!(
            sqlstate(&e).as_deref(),
            Some(want),
            "{what}: wrong error: {e:?}"
        ),
    }
}

/// `lockext.lock_acquire(lock, owner, ttl, <extra>)`, `extra` being named arguments such
/// as `mode => 'shared'`; the token, or None when refused.
fn acquire(
    c: &mut Client,
    lock: &str,
    owner: &str,
    ttl: &str,
    extra: &str,
) -> Result<Option<i64>, postgres::Error> {
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    c.query_one(
        &format!("SELECT fence_token FROM lockext.lock_acquire($1, $2, $3::text::interval{extra})"),
        &[&lock, &owner, &ttl],
    )
    .map(|row| row.get(0))
}

fn release(c: &mut Client, lock: &str, owner: &str) -> bool {
    c.query_one("SELECT lockext.lock_release($1, $2)", &[&lock, &owner])
        .expect("lock_release")
        .get(0)
}

/// The new expiry (µs), or None when refused.
fn renew(c: &mut Client, lock: &str, owner: &str, ttl: &str) -> Option<i64> {
    c.query_one(
        "SELECT (extract(epoch FROM lockext.lock_renew($1, $2, $3::text::interval)) * 1000000)::bigint",
        &[&lock, &owner, &ttl],
    )
    .expect("lock_renew")
    .get(0)
}

/// (owner, mode, token) of the live leases of `lock`, by token.
fn holders(c: &mut Client, lock: &str) -> Vec<(String, String, i64)> {
    c.query(
        "SELECT owner, mode, fence_token FROM lockext.holders WHERE lock_id = $1 ORDER BY fence_token",
        &[&lock],
    )
    .expect("lockext.holders")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

fn held(owner: &str, mode: &str, token: i64) -> (String, String, i64) {
    (owner.to_string(), mode.to_string(), token)
}

/// Asserts that the waiting call reporting on `rx` has not returned within `within`.
fn not_yet<T: std::fmt::Debug>(rx: &mpsc::Receiver<T>, within: Duration, who: &str) {
    if let Ok(v) = rx.recv_timeout(within) {
        panic!("{who}: its waiting call returned {v:?}; it should still be waiting");
    }
}

fn waiting(c: &mut Client, lock: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM lockext.waiters WHERE lock_id = $1",
        &[&lock],
    )
    .expect("lockext.waiters")
    .get(0)
}

/// Polls lockext.holders every 20 ms until `owner`'s lease of `lock` is gone; the time
/// from `since`. Panics after 10 s.
fn time_until_gone(c: &mut Client, lock: &str, owner: &str, since: Instant) -> Duration {
    loop {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM lockext.holders WHERE lock_id = $1 AND owner = $2",
                &[&lock, &owner],
            )
            .expect("poll lockext.holders")
            .get(0);
        let elapsed = since.elapsed();
        if n == 0 {
            return elapsed;
        }
        assert!(
            elapsed < Duration::from_secs(10),
            "{owner}'s lease of {lock} is still there after {elapsed:?}"
        );
        sleep(ms(20));
    }
}

fn backend_alive(c: &mut Client, pid: i32) -> bool {
    c.query_one(
        "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)",
        &[&pid],
    )
    .expect("pg_stat_activity")
    .get(0)
}

// ---------------------------------------------------------------------------------------
// 1. Readers share, a writer is alone
// ---------------------------------------------------------------------------------------

#[test]
fn readers_together_writer_alone() {
    let cluster = Cluster::start("modes-rw", "");
    let mut r1 = cluster.connect();
    let mut r2 = cluster.connect();
    let mut w = cluster.connect();
    let mut admin = cluster.connect();
    let id = "rw:doc";
    let shared = "mode => 'shared'";

    let t1 = acquire(&mut r1, id, "reader-1", "1 minute", shared)
        .unwrap()
        .expect("the first reader is granted");
    let t2 = acquire(&mut r2, id, "reader-2", "1 minute", shared)
        .unwrap()
        .expect("a second reader is granted while the first reads");
    assert!(
        t2 > t1,
        "each reader has its own, increasing token: {t1}, {t2}"
    );
    assert_eq!(
        holders(&mut admin, id),
        [
            held("reader-1", "shared", t1),
            held("reader-2", "shared", t2)
        ]
    );
    // The same reader asking again gets its own grant back (shared leases are keyed by
    // lock and owner), not a second one.
    assert_eq!(
        acquire(&mut r1, id, "reader-1", "1 minute", shared).unwrap(),
        Some(t1)
    );
    assert!(
        renew(&mut r1, id, "reader-1", "2 minutes").is_some(),
        "a shared lease renews"
    );

    assert_eq!(
        acquire(&mut w, id, "writer", "1 minute", "").unwrap(),
        None,
        "no writer while readers read"
    );
    assert_eq!(
        acquire(&mut w, id, "writer", "1 minute", "mode => 'exclusive'").unwrap(),
        None,
        "no writer while readers read (explicit mode)"
    );
    assert_eq!(
        holders(&mut admin, id).len(),
        2,
        "the refused writer took nothing"
    );

    assert!(release(&mut r1, id, "reader-1"));
    assert!(!release(&mut r1, id, "reader-1"), "released already");
    assert_eq!(
        acquire(&mut w, id, "writer", "1 minute", "").unwrap(),
        None,
        "no writer while one reader still reads"
    );
    assert!(release(&mut r2, id, "reader-2"));
    assert!(holders(&mut admin, id).is_empty());

    let tw = acquire(&mut w, id, "writer", "1 minute", "")
        .unwrap()
        .expect("the writer is granted once the readers are gone");
    assert!(tw > t2, "writer's token {tw} above the readers' {t2}");
    assert_eq!(holders(&mut admin, id), [held("writer", "exclusive", tw)]);
    assert_eq!(
        acquire(&mut r1, id, "reader-3", "1 minute", shared).unwrap(),
        None,
        "no reader while the writer writes"
    );
    assert_eq!(holders(&mut admin, id), [held("writer", "exclusive", tw)]);
    assert!(release(&mut w, id, "writer"));

    let t3 = acquire(&mut r1, id, "reader-3", "1 minute", shared)
        .unwrap()
        .expect("readers are back once the writer is gone");
    assert!(t3 > tw);
    println!(
        "readers_together_writer_alone: tokens readers {t1}, {t2}; writer {tw}; reader after {t3}"
    );
}

// ---------------------------------------------------------------------------------------
// 2. A waiting writer is not starved by later readers; fenced reads
// ---------------------------------------------------------------------------------------

#[test]
fn writer_waits_for_readers() {
    let cluster = Cluster::start("modes-ww", "");
    let mut r1 = cluster.connect();
    let mut r2 = cluster.connect();
    let mut admin = cluster.connect();
    let id = "ww:doc";
    let res = "ww:resource";
    let shared = "mode => 'shared'";

    let t1 = acquire(&mut r1, id, "reader-1", "1 minute", shared)
        .unwrap()
        .unwrap();
    let t2 = acquire(&mut r2, id, "reader-2", "1 minute", shared)
        .unwrap()
        .unwrap();

    // The writer waits in its own session.
    let (w_granted_tx, w_granted) = mpsc::channel::<(Option<i64>, Instant)>();
    let (w_go_tx, w_go) = mpsc::channel::<()>();
    let (w_done_tx, w_done) = mpsc::channel::<(bool, bool, Instant)>();
    let url = cluster.url("postgres");
    let writer = thread::spawn(move || {
        let mut c = Client::connect(&url, NoTls).unwrap();
        let token = acquire(&mut c, id, "writer", "1 minute", "wait => '10 seconds'").unwrap();
        w_granted_tx.send((token, Instant::now())).unwrap();
        let Some(token) = token else { return };
        // Write, then release when told to.
        w_go.recv().unwrap();
        let wrote: bool = c
            .query_one(
                "SELECT lockext.fenced_update($1, $2, '{\"by\": \"writer\", \"v\": 1}'::jsonb)",
                &[&res, &token],
            )
            .unwrap()
            .get(0);
        let releasing = Instant::now();
        let released = release(&mut c, id, "writer");
        w_done_tx.send((wrote, released, releasing)).unwrap();
    });
    eventually(Duration::from_secs(10), "the writer queues", || {
        (waiting(&mut admin, id) == 1).then_some(())
    });

    // A reader who comes after the waiting writer, and would be compatible with the readers
    // holding the lock, must queue behind the writer.
    let (late_tx, late) = mpsc::channel::<(Option<i64>, Instant)>();
    let (late_go_tx, late_go) = mpsc::channel::<()>();
    let url = cluster.url("postgres");
    let late_reader = thread::spawn(move || {
        let mut c = Client::connect(&url, NoTls).unwrap();
        let token = acquire(
            &mut c,
            id,
            "reader-late",
            "1 minute",
            "mode => 'shared', wait => '10 seconds'",
        )
        .unwrap();
        late_tx.send((token, Instant::now())).unwrap();
        if token.is_some() {
            late_go.recv().unwrap();
            assert!(release(&mut c, id, "reader-late"));
        }
    });
    eventually(Duration::from_secs(10), "the late reader queues", || {
        (waiting(&mut admin, id) == 2).then_some(())
    });
    let queue: Vec<(i64, i32)> = admin
        .query(
            "SELECT position, pid FROM lockext.waiters WHERE lock_id = $1 ORDER BY position",
            &[&id],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    println!("queue of {id}: {queue:?}");

    // Both readers hold: nobody else is granted.
    not_yet(
        &w_granted,
        ms(300),
        "the writer, while two readers hold the lock",
    );
    not_yet(
        &late,
        ms(10),
        "the late reader, queued behind the waiting writer (writer starvation)",
    );
    assert!(release(&mut r1, id, "reader-1"));
    not_yet(
        &w_granted,
        ms(300),
        "the writer, while reader-2 still holds the lock",
    );
    not_yet(
        &late,
        ms(10),
        "the late reader, queued behind the waiting writer, after reader-1 left",
    );
    let last_reader_leaving = Instant::now();
    assert!(release(&mut r2, id, "reader-2"));
    let (tw, w_at) = w_granted
        .recv_timeout(Duration::from_secs(5))
        .expect("the writer is granted once the last reader left");
    let tw = tw.expect("the writer's wait ended in a grant");
    assert!(w_at > last_reader_leaving);
    assert!(
        tw > t1 && tw > t2,
        "the writer's token {tw} is above the readers' {t1}, {t2}"
    );
    println!(
        "writer granted {:?} after the last reader's release began",
        w_at - last_reader_leaving
    );
    assert_eq!(holders(&mut admin, id), [held("writer", "exclusive", tw)]);
    not_yet(
        &late,
        ms(300),
        "the late reader, while the writer holds the lock",
    );

    w_go_tx.send(()).unwrap();
    let (wrote, released, w_releasing) = w_done.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(wrote, "the writer's fenced_update is accepted");
    assert!(released);
    let (t3, late_at) = late
        .recv_timeout(Duration::from_secs(5))
        .expect("the late reader is served after the writer");
    let t3 = t3.expect("the late reader's wait ended in a grant");
    assert!(late_at > w_releasing && late_at > w_at);
    assert!(t3 > tw, "late reader's token {t3} above the writer's {tw}");
    println!(
        "late reader granted {:?} after the writer's release began; tokens r1 {t1} r2 {t2} w {tw} late {t3}",
        late_at - w_releasing
    );
    writer.join().unwrap();

    // Fenced reads: a reader whose token predates the writer's write is refused; one whose
    // token is at or above the mark reads the document; a read never moves the mark.
    for stale in [t1, t2] {
        expect_sqlstate(
            r1.query_one("SELECT lockext.fenced_read($1, $2)", &[&res, &stale]),
            "55L01",
            &format!("fenced_read with the pre-write reader token {stale}"),
        );
        expect_sqlstate(
            r1.query_one("SELECT lockext.fence_read($1, $2)", &[&res, &stale]),
            "55L01",
            &format!("fence_read with the pre-write reader token {stale}"),
        );
    }
    let doc: String = r2
        .query_one("SELECT lockext.fenced_read($1, $2)::text", &[&res, &t3])
        .expect("fenced_read with the late reader's token")
        .get(0);
    let same: bool = r2
        .query_one(
            "SELECT lockext.fenced_read($1, $2) = '{\"by\": \"writer\", \"v\": 1}'::jsonb",
            &[&res, &t3],
        )
        .unwrap()
        .get(0);
    assert!(
        same,
        "the late reader reads the writer's document, got {doc}"
    );
    let doc_at_mark: String = r2
        .query_one("SELECT lockext.fenced_read($1, $2)::text", &[&res, &tw])
        .expect("fenced_read with a token equal to the mark")
        .get(0);
    assert_eq!(doc_at_mark, doc);
    r2.query_one("SELECT lockext.fence_read($1, $2)", &[&res, &t3])
        .expect("fence_read with a current token");
    let mark: i64 = admin
        .query_one(
            "SELECT fence_token FROM lockext.resources WHERE resource_id = $1",
            &[&res],
        )
        .unwrap()
        .get(0);
    assert_eq!(mark, tw, "fenced_read did not advance the mark");
    println!("fenced_read: token {t3} read {doc}; tokens {t1}, {t2} refused (mark {mark})");

    late_go_tx.send(()).unwrap();
    late_reader.join().unwrap();
}

// ---------------------------------------------------------------------------------------
// 3. A semaphore never has more live permits than it was made with
// ---------------------------------------------------------------------------------------

const PERMITS: usize = 4;
const SEM: &str = "sem:pool";

struct SemClient {
    c: Client,
    id: String,
    seq: u64,
    ops: Vec<Op>,
}

impl SemClient {
    fn op(&mut self, kind: Kind, owner: &str, token: Option<i64>) -> Op {
        self.seq += 1;
        Op {
            client: self.id.clone(),
            seq: self.seq,
            kind,
            target: SEM.to_string(),
            owner: owner.to_string(),
            token,
            start_us: now_us(),
            end_us: 0,
            outcome: Outcome::Refused,
            durable: true,
            srv_before: None,
            srv_after: None,
            acquired_at: None,
            expires_at: None,
        }
    }

    fn failed(e: &postgres::Error) -> Outcome {
        Outcome::Failed {
            code: sqlstate(e),
            message: e.to_string(),
        }
    }

    fn acquire(&mut self, owner: &str, ttl_ms: u64, wait_ms: u64) -> Option<i64> {
        let mut op = self.op(Kind::Acquire, owner, None);
        let res = self.c.query_one(
            &format!(
                "WITH a AS MATERIALIZED (SELECT lockext.lock_acquire($1, $2, $3::text::interval, \
                     wait => $4::text::interval, permits => {PERMITS}) AS g) \
                 SELECT (a.g).fence_token, public.us((a.g).acquired_at), public.us((a.g).expires_at), \
                        public.us(clock_timestamp()) \
                   FROM a"
            ),
            &[
                &SEM,
                &owner,
                &format!("{ttl_ms} milliseconds"),
                &format!("{wait_ms} milliseconds"),
            ],
        );
        op.end_us = now_us();
        match res {
            Ok(row) => {
                op.token = row.get(0);
                op.acquired_at = row.get(1);
                op.expires_at = row.get(2);
                op.srv_after = row.get(3);
                op.outcome = if op.token.is_some() {
                    Outcome::Ok
                } else {
                    Outcome::Refused
                };
            }
            Err(e) => op.outcome = Self::failed(&e),
        }
        let token = op.token;
        self.ops.push(op);
        token
    }

    fn renew(&mut self, owner: &str, token: i64, ttl_ms: u64) -> bool {
        let mut op = self.op(Kind::Renew, owner, Some(token));
        let res = self.c.query_one(
            "WITH a AS MATERIALIZED (SELECT public.us(clock_timestamp()) AS t0, \
                                            lockext.lock_renew($1, $2, $3::text::interval, $4) AS e) \
             SELECT t0, public.us(e), public.us(clock_timestamp()) FROM a",
            &[&SEM, &owner, &format!("{ttl_ms} milliseconds"), &token],
        );
        op.end_us = now_us();
        match res {
            Ok(row) => {
                op.srv_before = row.get(0);
                op.expires_at = row.get(1);
                op.srv_after = row.get(2);
                op.outcome = if op.expires_at.is_some() {
                    Outcome::Ok
                } else {
                    Outcome::Refused
                };
            }
            Err(e) => op.outcome = Self::failed(&e),
        }
        let ok = op.ok();
        self.ops.push(op);
        ok
    }

    fn release(&mut self, owner: &str, token: i64) -> bool {
        let mut op = self.op(Kind::Release, owner, Some(token));
        let res = self.c.query_one(
            "WITH a AS MATERIALIZED (SELECT public.us(clock_timestamp()) AS t0, \
                                            lockext.lock_release($1, $2, $3) AS r) \
             SELECT t0, r, public.us(clock_timestamp()) FROM a",
            &[&SEM, &owner, &token],
        );
        op.end_us = now_us();
        match res {
            Ok(row) => {
                op.srv_before = row.get(0);
                let released: bool = row.get(1);
                op.srv_after = row.get(2);
                op.outcome = if released {
                    Outcome::Ok
                } else {
                    Outcome::Refused
                };
            }
            Err(e) => op.outcome = Self::failed(&e),
        }
        let ok = op.ok();
        self.ops.push(op);
        ok
    }
}

/// What one semaphore client did, beyond its history.
struct SemRun {
    ops: Vec<Op>,
    /// Same-owner re-acquires of a live permit that did not return the same token.
    reacquire_mismatches: Vec<String>,
    pauses: usize,
}

fn semaphore_client(url: String, i: usize, run: Duration, seed: u64) -> SemRun {
    let mut s = SemClient {
        c: Client::connect(&url, NoTls).expect("connect"),
        id: format!("c{i:02}"),
        seq: 0,
        ops: Vec::new(),
    };
    let mut rng = Rng(seed | 1);
    let pauser = i % 4 == 0; // 4 of the 16 clients sometimes stall past their TTL
    let mut out = SemRun {
        ops: Vec::new(),
        reacquire_mismatches: Vec::new(),
        pauses: 0,
    };
    let deadline = Instant::now() + run;
    let mut n = 0;
    while Instant::now() < deadline {
        n += 1;
        let owner = format!("{}-{n}", s.id);
        let ttl = if rng.pct(60) { 200 } else { 600 };
        let wait = if rng.pct(40) { 0 } else { 20 + rng.below(300) };
        let Some(token) = s.acquire(&owner, ttl, wait) else {
            sleep(ms(rng.below(8)));
            continue;
        };
        if rng.pct(10) {
            // A retry, as after a lost reply: the same grant comes back, extended.
            let again = s.acquire(&owner, ttl, 0);
            if again != Some(token) {
                out.reacquire_mismatches.push(format!(
                    "{owner}: granted {token}, re-acquire returned {again:?}"
                ));
            }
        }
        sleep(ms(1 + rng.below(12)));
        let roll = rng.below(100);
        if pauser && roll < 25 {
            // Stalled past the TTL (a GC pause, a stopped VM): the permit expired under it.
            out.pauses += 1;
            sleep(ms(ttl + 50 + rng.below(100)));
            s.renew(&owner, token, ttl);
            s.release(&owner, token);
        } else if roll < 25 {
            if s.renew(&owner, token, ttl) {
                sleep(ms(1 + rng.below(8)));
            }
            if rng.pct(70) {
                s.release(&owner, token);
            }
        } else if roll < 75 {
            s.release(&owner, token);
        }
        // else: walk away; the TTL ends the permit.
    }
    out.ops = s.ops;
    out
}

#[test]
fn semaphore_never_exceeds_permits() {
    let cluster = Cluster::start("modes-sem", "max_connections = 60");
    let mut admin = cluster.connect();
    admin
        .batch_execute(
            "CREATE FUNCTION public.us(timestamptz) RETURNS bigint LANGUAGE sql IMMUTABLE STRICT \
             AS 'SELECT (extract(epoch FROM $1) * 1000000)::bigint'",
        )
        .unwrap();

    // The rules, with one permit held.
    let mut main = cluster.connect();
    let p = "permits => 4";
    let t = acquire(&mut main, SEM, "main", "1 minute", p)
        .unwrap()
        .expect("a permit of a free semaphore");
    assert_eq!(
        acquire(&mut main, SEM, "main", "1 minute", p).unwrap(),
        Some(t),
        "the same owner holds at most one permit: re-acquiring returns the same grant"
    );
    let row = admin
        .query_one(
            "SELECT mode, permits, session_bound, fence_token FROM lockext.holders WHERE lock_id = $1",
            &[&SEM],
        )
        .expect("one holders row for the one permit");
    assert_eq!(row.get::<_, String>(0), "permit");
    assert_eq!(row.get::<_, Option<i32>>(1), Some(4));
    assert!(!row.get::<_, bool>(2));
    assert_eq!(row.get::<_, i64>(3), t);
    expect_sqlstate(
        acquire(&mut main, SEM, "other", "1 minute", "permits => 5"),
        "22023",
        "another permit count while permits are live",
    );
    expect_sqlstate(
        acquire(&mut main, SEM, "other", "1 minute", "mode => 'shared'"),
        "42809",
        "a shared lease of a semaphore",
    );
    expect_sqlstate(
        acquire(&mut main, SEM, "other", "1 minute", ""),
        "42809",
        "an exclusive lease of a semaphore",
    );
    expect_sqlstate(
        acquire(
            &mut main,
            "sem:other",
            "x",
            "1 minute",
            "mode => 'shared', permits => 4",
        ),
        "22023",
        "permits with mode shared",
    );
    expect_sqlstate(
        acquire(&mut main, "sem:other", "x", "1 minute", "mode => 'bogus'"),
        "22023",
        "an unknown mode",
    );
    match acquire(&mut main, "sem:other", "x", "1 minute", "permits => 0") {
        Ok(g) => panic!("permits => 0 was accepted: {g:?}"),
        Err(e) => println!("permits => 0: {:?} {e}", sqlstate(&e)),
    }
    acquire(&mut main, "sem:excl", "x", "1 minute", "")
        .unwrap()
        .unwrap();
    expect_sqlstate(
        acquire(&mut main, "sem:excl", "y", "1 minute", "permits => 4"),
        "42809",
        "permits of an exclusively held id",
    );
    assert_eq!(
        holders(&mut admin, SEM),
        [held("main", "permit", t)],
        "the refused calls took nothing"
    );
    assert!(release(&mut main, SEM, "main"));

    // The run.
    let run = Duration::from_secs(8);
    let seed = std::env::var("LOCKEXT_MODES_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_us() as u64);
    println!("semaphore run: seed {seed}, 16 clients, {PERMITS} permits, {run:?}");
    let mut threads = Vec::new();
    for i in 0..16 {
        let url = cluster.url("postgres");
        let s = seed.wrapping_add(i as u64 * 7919);
        threads.push(thread::spawn(move || semaphore_client(url, i, run, s)));
    }
    // Meanwhile an operator watches lockext.holders.
    let started = Instant::now();
    let mut polls = 0;
    let mut poll_max = 0;
    let mut poll_hist = [0usize; PERMITS + 2];
    let mut poll_over = Vec::new();
    while started.elapsed() < run + ms(200) {
        let rows = admin
            .query(
                "SELECT owner, fence_token FROM lockext.holders WHERE lock_id = $1 AND mode = 'permit'",
                &[&SEM],
            )
            .unwrap();
        polls += 1;
        poll_max = poll_max.max(rows.len());
        poll_hist[rows.len().min(PERMITS + 1)] += 1;
        if rows.len() > PERMITS {
            let who: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            poll_over.push(who);
        }
        sleep(ms(3));
    }
    let mut ops = Vec::new();
    let mut mismatches = Vec::new();
    let mut pauses = 0;
    for t in threads {
        let r = t.join().expect("client thread");
        ops.extend(r.ops);
        mismatches.extend(r.reacquire_mismatches);
        pauses += r.pauses;
    }
    let report = check_permits(&ops, PERMITS);
    println!("SUMMARY semaphore: {}", report.summary());
    println!(
        "holders polls: {polls}, most permit rows seen {poll_max}, polls by rows seen {poll_hist:?}; \
         client stalls past the TTL: {pauses}"
    );
    for v in report.violations.iter().take(20) {
        println!("VIOLATION {v}");
    }
    assert!(
        report.violations.is_empty(),
        "{} violations",
        report.violations.len()
    );
    assert!(
        poll_over.is_empty(),
        "lockext.holders showed more than {PERMITS} permits: {poll_over:?}"
    );
    // The run exercised what it means to.
    assert_eq!(report.max_live, PERMITS, "the semaphore was saturated");
    assert_eq!(poll_max, PERMITS, "an operator saw all permits taken");
    assert!(report.acquires_refused > 0, "acquires were refused");
    assert!(report.expired > 0, "permits expired");
    assert!(report.releases_ok > 0 && report.renews_ok > 0);
    assert!(
        report.renews_refused > 0,
        "stalled clients' renewals were refused"
    );
    // Last, so that everything above is checked first: a holder's retry returns its grant.
    assert!(
        mismatches.is_empty(),
        "{} same-owner re-acquires of a live permit did not return the grant: {mismatches:?}",
        mismatches.len()
    );
    assert!(report.same_grant_reacquires > 0);
}

// ---------------------------------------------------------------------------------------
// A holder's retry (its acquire's reply was lost) returns its grant, even while others
// wait for the lock
// ---------------------------------------------------------------------------------------

#[test]
fn a_holder_retrying_gets_its_grant_back_while_others_wait() {
    let cluster = Cluster::start("modes-retry", "");
    let mut holder = cluster.connect();
    let mut admin = cluster.connect();
    let mut results = Vec::new();
    for (kind, hold, waiter_extra) in [
        ("exclusive", "", ""),
        ("shared", "mode => 'shared'", ""),
        ("permit", "permits => 1", ", permits => 1"),
    ] {
        let id = format!("retry:{kind}");
        let t = acquire(&mut holder, &id, "holder", "1 minute", hold)
            .unwrap()
            .expect("granted");
        assert_eq!(
            acquire(&mut holder, &id, "holder", "1 minute", hold).unwrap(),
            Some(t),
            "{kind}: a retry with nobody waiting returns the grant"
        );
        let url = cluster.url("postgres");
        let (wid, extra) = (id.clone(), format!("wait => '5 seconds'{waiter_extra}"));
        let waiter = thread::spawn(move || {
            let mut c = Client::connect(&url, NoTls).unwrap();
            let t = acquire(&mut c, &wid, "waiter", "1 minute", &extra).unwrap();
            if t.is_some() {
                assert!(release(&mut c, &wid, "waiter"));
            }
            t
        });
        eventually(Duration::from_secs(10), "the other client waits", || {
            (waiting(&mut admin, &id) == 1).then_some(())
        });
        let retry = acquire(&mut holder, &id, "holder", "1 minute", hold).unwrap();
        println!(
            "{kind}: holder's token {t}; its retry while another client waits returned {retry:?}"
        );
        assert!(
            release(&mut holder, &id, "holder"),
            "{kind}: the holder still held it"
        );
        let w = waiter.join().unwrap();
        assert!(
            w.is_some_and(|w| w > t),
            "{kind}: the waiter is served after the release"
        );
        results.push((kind, t, retry));
    }
    let wrong: Vec<_> = results.iter().filter(|(_, t, r)| *r != Some(*t)).collect();
    assert!(
        wrong.is_empty(),
        "(kind, token, what the retry returned) where a holder's retry did not return its grant \
         because another client was waiting: {wrong:?}"
    );
}

// ---------------------------------------------------------------------------------------
// The permit checker catches what it must (no cluster)
// ---------------------------------------------------------------------------------------

/// A granted acquire on the server's clock (ms), for checker tests.
fn granted(client: &str, seq: u64, owner: &str, token: i64, at_ms: i64, ttl_ms: i64) -> Op {
    Op {
        client: client.into(),
        seq,
        kind: Kind::Acquire,
        target: "sem".into(),
        owner: owner.into(),
        token: Some(token),
        start_us: at_ms * 1000 - 500,
        end_us: at_ms * 1000 + 500,
        outcome: Outcome::Ok,
        durable: true,
        srv_before: None,
        srv_after: Some(at_ms * 1000),
        acquired_at: Some(at_ms * 1000 - 100),
        expires_at: Some((at_ms + ttl_ms) * 1000),
    }
}

fn released(client: &str, seq: u64, owner: &str, token: i64, at_ms: i64) -> Op {
    Op {
        client: client.into(),
        seq,
        kind: Kind::Release,
        target: "sem".into(),
        owner: owner.into(),
        token: Some(token),
        start_us: at_ms * 1000 - 500,
        end_us: at_ms * 1000 + 500,
        outcome: Outcome::Ok,
        durable: true,
        srv_before: Some(at_ms * 1000),
        srv_after: Some(at_ms * 1000 + 100),
        acquired_at: None,
        expires_at: None,
    }
}

/// Four permits held from t=0 for 1 s, and a fifth: granted while they live (bad), or
/// after one was released or had expired (good).
#[test]
fn permit_checker_catches_five_overlapping_permits() {
    let four: Vec<Op> = (0..4)
        .map(|i| granted(&format!("c{i}"), 1, &format!("o{i}"), 10 + i, i, 1000))
        .collect();

    let mut bad = four.clone();
    bad.push(granted("c4", 1, "o4", 20, 500, 1000));
    let r = check_permits(&bad, 4);
    println!("bad: {} {:?}", r.summary(), r.violations);
    assert_eq!(r.max_live, 5);
    assert!(
        r.violations
            .iter()
            .any(|v| v.contains("5 grants live at once")),
        "{:?}",
        r.violations
    );

    // The fifth granted just after a release: fine.
    let mut good = four.clone();
    good.push(released("c2", 2, "o2", 12, 400));
    good.push(granted("c4", 1, "o4", 20, 401, 1000));
    let r = check_permits(&good, 4);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!(r.max_live, 4);

    // The fifth granted after one expired: fine; one millisecond before: caught.
    let mut good = four.clone();
    good.push(granted("c4", 1, "o4", 20, 1000, 1000));
    assert!(check_permits(&good, 4).violations.is_empty());
    let mut bad = four.clone();
    bad.push(granted("c4", 1, "o4", 20, 999, 1000));
    assert!(!check_permits(&bad, 4).violations.is_empty());

    // A renewal keeps a permit live: a fifth granted when the first would have expired
    // (fine above) but had been renewed is caught.
    let mut bad = four.clone();
    let mut ren = released("c0", 2, "o0", 10, 900);
    ren.kind = Kind::Renew;
    ren.expires_at = Some(1900 * 1000);
    bad.push(ren);
    bad.push(granted("c4", 1, "o4", 20, 1000, 1000));
    let r = check_permits(&bad, 4);
    assert!(
        r.violations
            .iter()
            .any(|v| v.contains("5 grants live at once")),
        "{:?}",
        r.violations
    );

    // A release that comes back false while the permit is live is reported.
    let mut bad = four.clone();
    let mut rel = released("c1", 2, "o1", 11, 300);
    rel.outcome = Outcome::Refused;
    bad.push(rel);
    assert!(!check_permits(&bad, 4).violations.is_empty());
}

#[test]
fn permit_checker_catches_a_duplicate_token() {
    let mut ops = vec![
        granted("c0", 1, "o0", 10, 0, 100),
        granted("c1", 1, "o1", 11, 200, 100),
    ];
    // Same owner, same grant (a retry): fine.
    let mut retry = granted("c1", 2, "o1", 11, 250, 100);
    retry.acquired_at = ops[1].acquired_at;
    ops.push(retry);
    let r = check_permits(&ops, 4);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!((r.grants, r.same_grant_reacquires), (2, 1));
    // A later grant to someone else with an old token, even long after the first ended.
    ops.push(granted("c2", 1, "o2", 10, 5000, 100));
    let r = check_permits(&ops, 4);
    println!("duplicate: {:?}", r.violations);
    assert!(
        r.violations
            .iter()
            .any(|v| v.contains("token 10 returned by two grants")),
        "{:?}",
        r.violations
    );
}

// ---------------------------------------------------------------------------------------
// 4. lock_acquire_all: all or nothing, in sorted order, no deadlock
// ---------------------------------------------------------------------------------------

/// (lock id, token) rows of lock_acquire_all, in the order returned.
fn acquire_all(
    c: &mut Client,
    ids: &[&str],
    owner: &str,
    wait: &str,
) -> Result<Vec<(String, i64)>, postgres::Error> {
    c.query(
        "SELECT lock_id, fence_token FROM lockext.lock_acquire_all($1, $2, '10 seconds', wait => $3::text::interval)",
        &[&ids, &owner, &wait],
    )
    .map(|rows| rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

fn release_all(c: &mut Client, ids: &[&str], owner: &str) -> i32 {
    c.query_one("SELECT lockext.lock_release_all($1, $2)", &[&ids, &owner])
        .expect("lock_release_all")
        .get(0)
}

/// Every row of lockext.locks: (lock id, owner, token, expiry µs).
fn all_locks(c: &mut Client) -> Vec<(String, String, i64, i64)> {
    c.query(
        "SELECT lock_id, owner, fence_token, (extract(epoch FROM expires_at) * 1000000)::bigint \
           FROM lockext.locks ORDER BY lock_id",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

#[derive(Default, Debug)]
struct AllStats {
    calls: usize,
    full: usize,
    empty: usize,
    /// Non-empty results that are not exactly the four ids in byte order.
    bad_rows: Vec<Vec<String>>,
    /// (returned, live in lockext.locks right after) when they differ.
    db_mismatch: Vec<(Vec<String>, Vec<String>)>,
    errors: Vec<String>,
    bad_release: Vec<i32>,
    max_call: Duration,
    total_call: Duration,
}

#[test]
fn acquire_all_reverse_order_no_deadlock() {
    let cluster = Cluster::start("modes-all", "");
    let mut c = cluster.connect();
    // Byte order: upper case before lower case.
    const SORTED: [&str; 4] = ["q4:A", "q4:C", "q4:b", "q4:d"];
    let reversed: Vec<&str> = SORTED.iter().rev().copied().collect();

    expect_sqlstate(
        c.query(
            "SELECT * FROM lockext.lock_acquire_all('{}'::text[], 'x', '1 minute')",
            &[],
        ),
        "22023",
        "an empty array",
    );
    expect_sqlstate(
        c.query(
            "SELECT * FROM lockext.lock_acquire_all(ARRAY['q4:A', NULL], 'x', '1 minute')",
            &[],
        ),
        "22004",
        "a NULL lock id",
    );
    assert!(
        all_locks(&mut c).is_empty(),
        "the refused calls took nothing"
    );
    let dup = acquire_all(&mut c, &["q4:z", "q4:Z", "q4:z"], "dup", "0").unwrap();
    let dup_ids: Vec<&str> = dup.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(
        dup_ids,
        ["q4:Z", "q4:z"],
        "one row per distinct id, in byte order"
    );
    assert!(dup[0].1 != dup[1].1);
    assert_eq!(release_all(&mut c, &["q4:z", "q4:Z"], "dup"), 2);
    assert_eq!(release_all(&mut c, &["q4:z", "q4:Z"], "dup"), 0);

    // With no waiting, one id held by a rival means nothing at all.
    let mut rival = cluster.connect();
    acquire(&mut rival, "q4:b", "rival", "1 minute", "")
        .unwrap()
        .unwrap();
    let before = all_locks(&mut c);
    let got = acquire_all(&mut c, &reversed, "eager", "0").unwrap();
    assert!(got.is_empty(), "a held id: zero rows, got {got:?}");
    assert_eq!(
        all_locks(&mut c),
        before,
        "the refused acquire_all took nothing"
    );
    let got = acquire_all(&mut c, &reversed, "eager", "200 milliseconds").unwrap();
    assert!(
        got.is_empty(),
        "a held id past the wait: zero rows, got {got:?}"
    );
    assert_eq!(
        all_locks(&mut c),
        before,
        "the timed-out acquire_all took nothing"
    );
    // A shared rival counts too.
    assert!(release(&mut rival, "q4:b", "rival"));
    acquire(&mut rival, "q4:d", "rival", "1 minute", "mode => 'shared'")
        .unwrap()
        .unwrap();
    let before_shared = holders(&mut c, "q4:d");
    let got = acquire_all(&mut c, &SORTED, "eager", "0").unwrap();
    assert!(got.is_empty(), "a shared-held id: zero rows, got {got:?}");
    assert!(all_locks(&mut c).is_empty(), "nothing taken");
    assert_eq!(holders(&mut c, "q4:d"), before_shared);
    assert!(release(&mut rival, "q4:d", "rival"));

    // Two clients, the same four ids in opposite orders, waiting.
    let stop_observer = Arc::new(AtomicBool::new(false));
    let observer = {
        let url = cluster.url("postgres");
        let stop = stop_observer.clone();
        thread::spawn(move || {
            let mut c = Client::connect(&url, NoTls).unwrap();
            let (mut polls, mut partial) = (0usize, 0usize);
            while !stop.load(Ordering::Relaxed) {
                let rows = c
                    .query(
                        "SELECT owner, count(*) FROM lockext.locks \
                          WHERE lock_id = ANY($1) AND expires_at > clock_timestamp() GROUP BY owner",
                        &[&&SORTED[..]],
                    )
                    .unwrap();
                polls += 1;
                if rows.iter().any(|r| r.get::<_, i64>(1) != 4) {
                    partial += 1;
                }
                sleep(ms(2));
            }
            (polls, partial)
        })
    };
    let mut threads = Vec::new();
    for (name, order) in [("forward", SORTED.to_vec()), ("reverse", reversed.clone())] {
        let url = cluster.url("postgres");
        threads.push(thread::spawn(move || {
            let mut c = Client::connect(&url, NoTls).unwrap();
            let mut rng = Rng(now_us() as u64 | 1);
            let mut s = AllStats::default();
            let deadline = Instant::now() + Duration::from_secs(8);
            for _ in 0..300 {
                if Instant::now() > deadline {
                    break;
                }
                s.calls += 1;
                let t0 = Instant::now();
                let res = acquire_all(&mut c, &order, name, "2 seconds");
                let took = t0.elapsed();
                s.max_call = s.max_call.max(took);
                s.total_call += took;
                let rows = match res {
                    Ok(rows) => rows,
                    Err(e) => {
                        s.errors.push(format!("{:?} {e}", sqlstate(&e)));
                        continue;
                    }
                };
                let got: Vec<String> = rows.into_iter().map(|(l, _)| l).collect();
                if got.is_empty() {
                    s.empty += 1;
                } else if got == SORTED {
                    s.full += 1;
                } else {
                    s.bad_rows.push(got.clone());
                }
                let live: Vec<String> = c
                    .query(
                        "SELECT lock_id FROM lockext.locks \
                          WHERE owner = $1 AND expires_at > clock_timestamp() ORDER BY lock_id COLLATE \"C\"",
                        &[&name],
                    )
                    .unwrap()
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                let mut got_sorted = got.clone();
                got_sorted.sort();
                if live != got_sorted {
                    s.db_mismatch.push((got.clone(), live));
                }
                if !got.is_empty() {
                    sleep(Duration::from_micros(rng.below(2000)));
                    let n = release_all(&mut c, &order, name);
                    if n != got.len() as i32 {
                        s.bad_release.push(n);
                    }
                }
            }
            (name, s)
        }));
    }
    let mut all_ok = true;
    for t in threads {
        let (name, s) = t.join().expect("client thread");
        println!(
            "{name}: {} calls, {} all four, {} none, mean call {:?}, longest {:?}; errors {:?}",
            s.calls,
            s.full,
            s.empty,
            s.total_call / s.calls.max(1) as u32,
            s.max_call,
            s.errors
        );
        let deadlocks = s.errors.iter().filter(|e| e.contains("40P01")).count();
        assert_eq!(deadlocks, 0, "{name}: deadlocks: {:?}", s.errors);
        assert!(s.errors.is_empty(), "{name}: errors: {:?}", s.errors);
        assert!(
            s.bad_rows.is_empty(),
            "{name}: partial or unsorted results: {:?}",
            s.bad_rows
        );
        assert!(
            s.db_mismatch.is_empty(),
            "{name}: held in lockext.locks differs from what the call returned: {:?}",
            s.db_mismatch
        );
        assert!(
            s.bad_release.is_empty(),
            "{name}: lock_release_all returned {:?}",
            s.bad_release
        );
        assert!(s.full > 0, "{name}: never got all four");
        all_ok &= s.full + s.empty == s.calls;
    }
    assert!(all_ok);
    stop_observer.store(true, Ordering::Relaxed);
    let (polls, partial) = observer.join().unwrap();
    println!("observer: {polls} snapshots of lockext.locks, {partial} with an owner holding 1-3 of the four");
    assert!(all_locks(&mut c).is_empty(), "everything released");
}

// ---------------------------------------------------------------------------------------
// 5. A session-bound lease ends with its backend
// ---------------------------------------------------------------------------------------

#[test]
fn session_bound_gone_after_terminate() {
    let cluster = Cluster::start("modes-term", "");
    let mut admin = cluster.connect();
    for (mode, extra) in [
        ("exclusive", "session_bound => true"),
        ("shared", "mode => 'shared', session_bound => true"),
    ] {
        let id = format!("sb:{mode}");
        let mut s = cluster.connect();
        let pid: i32 = s.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        let token = acquire(&mut s, &id, "doomed", "1 hour", extra)
            .unwrap()
            .expect("granted");
        // In shared mode an ordinary reader holds alongside; it must stay.
        let mut bystander = cluster.connect();
        if mode == "shared" {
            acquire(
                &mut bystander,
                &id,
                "bystander",
                "1 hour",
                "mode => 'shared'",
            )
            .unwrap()
            .expect("a second reader");
        }
        let row = admin
            .query_one(
                "SELECT mode, pid, session_bound FROM lockext.holders WHERE lock_id = $1 AND owner = 'doomed'",
                &[&id],
            )
            .unwrap();
        assert_eq!(row.get::<_, String>(0), mode);
        assert_eq!(row.get::<_, Option<i32>>(1), Some(pid));
        assert!(row.get::<_, bool>(2), "holders says it is session-bound");

        let t0 = Instant::now();
        let terminated: bool = admin
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .unwrap()
            .get(0);
        assert!(terminated);
        let gone = time_until_gone(&mut admin, &id, "doomed", t0);
        println!(
            "{mode} session-bound lease (ttl 1 hour) gone {gone:?} after pg_terminate_backend"
        );
        assert!(gone < Duration::from_secs(1), "took {gone:?}");
        assert!(s.simple_query("SELECT 1").is_err(), "the session is dead");
        if mode == "shared" {
            let left = holders(&mut admin, &id);
            assert_eq!(left.len(), 1, "{left:?}");
            assert_eq!(left[0].0, "bystander", "the other reader keeps its lease");
            assert!(release(&mut bystander, &id, "bystander"));
        }
        let next = acquire(&mut admin, &id, "next", "1 minute", "")
            .unwrap()
            .expect("the lock is free again");
        assert!(next > token);
        assert!(release(&mut admin, &id, "next"));
    }

    // A normal close ends it too.
    let mut s = cluster.connect();
    acquire(
        &mut s,
        "sb:close",
        "closer",
        "1 hour",
        "session_bound => true",
    )
    .unwrap()
    .unwrap();
    let t0 = Instant::now();
    drop(s);
    let gone = time_until_gone(&mut admin, "sb:close", "closer", t0);
    println!("session-bound lease gone {gone:?} after the client closed its connection");
    assert!(gone < Duration::from_secs(1), "took {gone:?}");

    // And a session-bound lease is not ended by another session closing.
    let mut keeper = cluster.connect();
    acquire(
        &mut keeper,
        "sb:keep",
        "keeper",
        "1 hour",
        "session_bound => true",
    )
    .unwrap()
    .unwrap();
    drop(cluster.connect());
    sleep(ms(300));
    assert_eq!(holders(&mut admin, "sb:keep").len(), 1);
}

// ---------------------------------------------------------------------------------------
// 6. A session-bound lease ends when its client process is killed
// ---------------------------------------------------------------------------------------

/// A psql client process running `script`, its stdin kept open so that it stays
/// connected (idle or busy) until killed.
fn psql(cluster: &Cluster, script: &str) -> (Child, ChildStdin) {
    let mut child = Command::new(format!("{PG_BIN}/psql"))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", cluster.port.to_string())
        .env("PGUSER", "postgres")
        .env("PGDATABASE", "postgres")
        .env("PGAPPNAME", "modes-psql")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn psql");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(script.as_bytes()).unwrap();
    stdin.flush().unwrap();
    (child, stdin)
}

/// Waits until `owner` holds `lock`; (backend pid, token).
fn visible(c: &mut Client, lock: &str, owner: &str) -> (i32, i64) {
    eventually(
        Duration::from_secs(10),
        "the client's lease is visible",
        || {
            c.query_opt(
                "SELECT pid, fence_token FROM lockext.holders WHERE lock_id = $1 AND owner = $2",
                &[&lock, &owner],
            )
            .unwrap()
            .map(|r| (r.get::<_, i32>(0), r.get::<_, i64>(1)))
        },
    )
}

#[test]
fn session_bound_gone_after_client_sigkill() {
    let cluster = Cluster::start("modes-kill", "");
    let mut admin = cluster.connect();

    // The client sits idle after taking the lease (working on something else).
    let (mut child, _stdin) = psql(
        &cluster,
        "SELECT lockext.lock_acquire('sk:idle', 'idle-client', '1 hour', session_bound => true);\n",
    );
    let (pid, _) = visible(&mut admin, "sk:idle", "idle-client");
    let t0 = Instant::now();
    child.kill().expect("kill -9 psql");
    child.wait().unwrap();
    let gone = time_until_gone(&mut admin, "sk:idle", "idle-client", t0);
    println!(
        "idle client killed with SIGKILL: session-bound lease (ttl 1 hour) gone after {gone:?}"
    );
    assert!(gone < Duration::from_secs(1), "took {gone:?}");
    assert!(!backend_alive(&mut admin, pid));

    // The client's backend is busy in a long statement when the client dies; with
    // client_connection_check_interval the backend notices and exits.
    let (mut child, _stdin) = psql(
        &cluster,
        "SET client_connection_check_interval = '100ms';\n\
         SELECT lockext.lock_acquire('sk:busy', 'busy-client', '1 hour', session_bound => true);\n\
         SELECT pg_sleep(600);\n",
    );
    let (pid, _) = visible(&mut admin, "sk:busy", "busy-client");
    eventually(
        Duration::from_secs(10),
        "the client's backend sleeps",
        || {
            let q: Option<String> = admin
                .query_opt(
                    "SELECT query FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
                    &[&pid],
                )
                .unwrap()
                .map(|r| r.get(0));
            q.filter(|q| q.contains("pg_sleep")).map(|_| ())
        },
    );
    let t0 = Instant::now();
    child.kill().expect("kill -9 psql");
    child.wait().unwrap();
    let gone = time_until_gone(&mut admin, "sk:busy", "busy-client", t0);
    println!(
        "busy client (pg_sleep, client_connection_check_interval 100ms) killed with SIGKILL: lease gone after {gone:?}"
    );
    assert!(gone < Duration::from_secs(1), "took {gone:?}");

    // Without session_bound the lease outlives its client, until its TTL.
    let (mut child, _stdin) = psql(
        &cluster,
        "SELECT lockext.lock_acquire('sk:plain', 'plain-client', '4 seconds');\n",
    );
    let (pid, token) = visible(&mut admin, "sk:plain", "plain-client");
    let t0 = Instant::now();
    child.kill().expect("kill -9 psql");
    child.wait().unwrap();
    eventually(
        Duration::from_secs(2),
        "the dead client's backend exits",
        || (!backend_alive(&mut admin, pid)).then_some(()),
    );
    sleep(Duration::from_secs(2).saturating_sub(t0.elapsed()));
    let h = holders(&mut admin, "sk:plain");
    assert_eq!(
        h,
        [held("plain-client", "exclusive", token)],
        "a lease without session_bound survives its client's death"
    );
    let gone = time_until_gone(&mut admin, "sk:plain", "plain-client", t0);
    println!("lease without session_bound (ttl 4 s) still held 2 s after its client died; gone {gone:?} after the kill");
    assert!(gone > Duration::from_secs(2));
}

// ---------------------------------------------------------------------------------------
// 7. A DBA can forbid session-bound leases
// ---------------------------------------------------------------------------------------

#[test]
fn session_leases_off_refused() {
    let cluster = Cluster::start("modes-off", "");
    let mut admin = cluster.connect();
    admin
        .batch_execute(
            "CREATE ROLE app LOGIN;
             GRANT lockext_user TO app;
             ALTER ROLE app SET lockext.session_leases = off;",
        )
        .unwrap();
    let url = cluster.url("postgres").replace("user=postgres", "user=app");
    let mut app = Client::connect(&url, NoTls).expect("connect as app");
    let setting: String = app
        .query_one("SHOW lockext.session_leases", &[])
        .unwrap()
        .get(0);
    assert_eq!(setting, "off");

    expect_sqlstate(
        acquire(
            &mut app,
            "off:1",
            "app",
            "1 minute",
            "session_bound => true",
        ),
        "0A000",
        "a session-bound lease with lockext.session_leases off",
    );
    expect_sqlstate(
        acquire(
            &mut app,
            "off:1",
            "app",
            "1 minute",
            "mode => 'shared', session_bound => true",
        ),
        "0A000",
        "a session-bound shared lease with lockext.session_leases off",
    );
    expect_sqlstate(
        app.query(
            "SELECT * FROM lockext.lock_acquire_all(ARRAY['off:1', 'off:2'], 'app', '1 minute', session_bound => true)",
            &[],
        ),
        "0A000",
        "session-bound lock_acquire_all with lockext.session_leases off",
    );
    assert!(all_locks(&mut admin).is_empty(), "nothing is held");
    assert!(holders(&mut admin, "off:1").is_empty());
    assert!(holders(&mut admin, "off:2").is_empty());
    // The role cannot turn it back on.
    expect_sqlstate(
        app.batch_execute("SET lockext.session_leases = on"),
        "42501",
        "a non-superuser setting lockext.session_leases",
    );
    // Ordinary leases still work for it.
    acquire(&mut app, "off:1", "app", "1 minute", "")
        .unwrap()
        .expect("an ordinary lease");
    assert!(release(&mut app, "off:1", "app"));

    // A superuser's session, SET off.
    admin
        .batch_execute("SET lockext.session_leases = off")
        .unwrap();
    expect_sqlstate(
        acquire(
            &mut admin,
            "off:2",
            "dba",
            "1 minute",
            "session_bound => true",
        ),
        "0A000",
        "a session-bound lease after SET lockext.session_leases = off",
    );
    assert!(holders(&mut admin, "off:2").is_empty());
    admin
        .batch_execute("SET lockext.session_leases = on")
        .unwrap();
    acquire(
        &mut admin,
        "off:2",
        "dba",
        "1 minute",
        "session_bound => true",
    )
    .unwrap()
    .expect("a session-bound lease once it is on again");
    println!("session_bound refused with 0A000 while lockext.session_leases = off (role and session settings)");
}
