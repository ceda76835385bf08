//! `lock_acquire_all`: all or nothing, in sorted order, and no deadlock between sets taken
//! in opposite orders, with real sessions on a real server.
//!
//! Run with `--test-threads=1 --nocapture` to see the measured numbers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use lockext_cluster_tests::history::now_us;
use lockext_cluster_tests::leases::*;
use lockext_cluster_tests::*;

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
