//! Shared and exclusive leases with real sessions on a real server: readers share, a
//! writer is alone, a waiting writer is not starved by later readers, fenced reads, and a
//! holder retrying gets its grant back while others wait.
//!
//! Run with `--test-threads=1 --nocapture` to see the measured numbers.

use std::sync::mpsc;
use std::thread::{self};
use std::time::{Duration, Instant};

use lockext_cluster_tests::leases::*;
use lockext_cluster_tests::*;

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
