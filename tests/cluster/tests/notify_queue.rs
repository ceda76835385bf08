//! A listener that never reads (`LISTEN lockext`, then a transaction left open) keeps every
//! later notification in the cluster-wide queue. On 0.3.0, once that queue was full every
//! `lock_release` with `lockext.notify = on` failed at commit and left the lease held, and
//! every reaper round failed. Events are hints: from `lockext.notify_queue_limit` of the
//! queue in use on (half, by default; a small fraction here, so that the test fills it in
//! a moment instead of 4 GB), lockext sends none, counts the skip and logs it once, and the
//! release commits.

use lockext_cluster_tests::*;
use postgres::fallible_iterator::FallibleIterator;

fn stat(c: &mut Client, name: &str) -> i64 {
    c.query_one(
        "SELECT coalesce((SELECT value FROM lockext.stats WHERE name = $1), 0)",
        &[&name],
    )
    .expect("lockext.stats")
    .get(0)
}

#[test]
fn a_stuck_listener_costs_events_never_a_release() {
    let cluster = Cluster::start(
        "notify-queue",
        "lockext.notify = on\nlockext.notify_queue_limit = 0.00001\n",
    );
    let mut c = cluster.connect();
    // Below the limit, events go out.
    let mut listener = cluster.connect();
    listener.batch_execute("LISTEN lockext").expect("listen");
    c.batch_execute(
        "SELECT lockext.lock_acquire('q-1', 'o', '1 minute');
         SELECT lockext.lock_release('q-1', 'o')",
    )
    .expect("acquire and release");
    let got = listener
        .notifications()
        .timeout_iter(std::time::Duration::from_secs(5))
        .next()
        .expect("poll notifications");
    assert!(got.is_some(), "a release below the limit sends its event");
    assert_eq!(stat(&mut c, "events_skipped"), 0);

    // The listener stops reading, inside an open transaction; others fill the queue.
    listener
        .batch_execute("BEGIN; SELECT 1")
        .expect("a transaction left open");
    c.batch_execute(
        "SELECT pg_notify('lockext', repeat('x', 7000) || g) FROM generate_series(1, 200) g",
    )
    .expect("fill the queue");
    let used: f64 = c
        .query_one("SELECT pg_notification_queue_usage()", &[])
        .unwrap()
        .get(0);
    assert!(used >= 0.00001, "the queue is past the limit ({used})");

    // Past the limit: the release commits, without its event.
    let token: i64 = c
        .query_one(
            "SELECT fence_token FROM lockext.lock_acquire('q-2', 'o', '1 minute')",
            &[],
        )
        .expect("acquire past the limit")
        .get(0);
    let released: bool = c
        .query_one("SELECT lockext.lock_release('q-2', 'o', $1)", &[&token])
        .expect("a release past the limit commits")
        .get(0);
    assert!(released);
    let held: i64 = c
        .query_one(
            "SELECT count(*) FROM lockext.locks WHERE lock_id = 'q-2'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(held, 0, "the lease is gone");
    let skipped = stat(&mut c, "events_skipped");
    assert!(skipped >= 1, "the skipped event is counted ({skipped})");
    assert!(
        cluster.log().contains("lockext: NOTIFY queue"),
        "the skip is in the server's log"
    );
    drop(listener);
}
