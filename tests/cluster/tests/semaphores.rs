//! Counting semaphores with real sessions on a real server: never more live permits than
//! the semaphore was made with (checked by `permits::check_permits`, which is shown to catch
//! overlapping permits and a repeated token).
//!
//! Run with `--test-threads=1 --nocapture` to see the measured numbers.

use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use lockext_cluster_tests::history::{now_us, Kind, Op, Outcome};
use lockext_cluster_tests::leases::*;
use lockext_cluster_tests::permits::check_permits;
use lockext_cluster_tests::*;

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
            Err(e) => op.outcome = Outcome::failed(&e),
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
            Err(e) => op.outcome = Outcome::failed(&e),
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
            Err(e) => op.outcome = Outcome::failed(&e),
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
    let pauser = i.is_multiple_of(4); // 4 of the 16 clients sometimes stall past their TTL
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
