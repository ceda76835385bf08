//! What an operator sees: lockext.holders and lockext.stats on a preloaded server.

use std::collections::HashMap;

use lockext_cluster_tests::*;

fn stats(c: &mut Client) -> HashMap<String, i64> {
    c.query("SELECT name, value FROM lockext.stats", &[])
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[test]
fn holders_and_counters_tell_who_holds_what_and_what_happened() {
    let cluster = Cluster::start("operations", "");
    let mut c = cluster.connect();
    c.batch_execute("SET application_name = 'billing-worker'")
        .unwrap();
    // An earlier grant, so that t - 1 below is a token that was issued (a fresh
    // cluster's first token is 1).
    c.batch_execute("SELECT lockext.lock_acquire('invoice:6', 'host-a:11:req-0', '1 minute')")
        .unwrap();
    let before = stats(&mut c);

    let t: i64 = c
        .query_one(
            "SELECT (lockext.lock_acquire('invoice:7', 'host-a:11:req-1', '1 minute')).fence_token",
            &[],
        )
        .unwrap()
        .get(0);
    let mut other = cluster.connect();
    let refused: bool = other
        .query_one(
            "SELECT lockext.lock_acquire('invoice:7', 'host-b:12:req-2', '1 minute') IS NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(refused);
    c.batch_execute("SELECT lockext.lock_renew('invoice:7', 'host-a:11:req-1', '1 minute')")
        .unwrap();
    c.batch_execute("SELECT lockext.lock_renew('invoice:7', 'nobody', '1 minute')")
        .unwrap();
    c.query_one("SELECT lockext.fenced_update('invoice', $1, '{}')", &[&t])
        .unwrap();
    c.query_one(
        "SELECT lockext.fenced_update('invoice', $1, '{}')",
        &[&(t - 1)],
    )
    .unwrap();

    // Who holds it, joined with the taker's session.
    let row = c
        .query_one(
            "SELECT h.owner, h.role::text, h.application_name, host(h.client_addr), h.renewals, \
                    h.time_left > interval '50 seconds', a.application_name \
               FROM lockext.holders h JOIN pg_stat_activity a ON a.pid = h.pid \
              WHERE h.lock_id = 'invoice:7'",
            &[],
        )
        .expect("the holder, joinable with pg_stat_activity");
    assert_eq!(row.get::<_, String>(0), "host-a:11:req-1");
    assert_eq!(row.get::<_, String>(1), "postgres");
    assert_eq!(row.get::<_, String>(2), "billing-worker");
    assert_eq!(row.get::<_, String>(3), "127.0.0.1");
    assert_eq!(row.get::<_, i32>(4), 1);
    assert!(row.get::<_, bool>(5));
    assert_eq!(row.get::<_, String>(6), "billing-worker");

    c.batch_execute("SELECT lockext.lock_release('invoice:7', 'host-a:11:req-1')")
        .unwrap();
    c.batch_execute("SELECT lockext.lock_release('invoice:7', 'host-a:11:req-1')")
        .unwrap();

    let after = stats(&mut c);
    let delta = |name: &str| after[name] - before.get(name).copied().unwrap_or(0);
    assert_eq!(delta("acquires_granted"), 1);
    assert_eq!(delta("acquires_refused"), 1);
    assert_eq!(delta("renewals_ok"), 1);
    assert_eq!(delta("renewals_failed"), 1);
    assert_eq!(delta("releases_ok"), 1);
    assert_eq!(delta("releases_failed"), 1);
    assert_eq!(delta("fence_rejected_stale"), 1);
    let latency: i64 = after
        .iter()
        .filter(|(k, _)| k.starts_with("acquire_latency_"))
        .map(|(_, v)| v)
        .sum();
    let latency_before: i64 = before
        .iter()
        .filter(|(k, _)| k.starts_with("acquire_latency_"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        latency - latency_before,
        2,
        "one histogram sample per lock_acquire"
    );

    c.batch_execute("SELECT lockext.stats_reset()").unwrap();
    let reset = stats(&mut c);
    assert!(reset.values().all(|&v| v == 0), "{reset:?}");
}
