//! A leader's value lives as long as its grant's lease row: a lease that has expired but is
//! still in its lock-delay keeps its value through the reaper's rounds (a renewal that read
//! the clock before the expiry may still renew it, and its holder, still the leader, must
//! not find its value gone), and the value goes once the lease itself is reaped.

use lockext_cluster_tests::*;
use std::time::Duration;

fn rounds(c: &mut Client) -> i64 {
    c.query_one(
        "SELECT rounds FROM lockext.reaper_status() WHERE database = 'postgres'",
        &[],
    )
    .map(|row| row.get(0))
    .unwrap_or(0)
}

fn has_value(c: &mut Client, token: i64) -> bool {
    c.query_one(
        "SELECT count(*) = 1 FROM lockext.lease_values WHERE lock_id = 'leader' AND fence_token = $1",
        &[&token],
    )
    .expect("lease_values")
    .get(0)
}

#[test]
fn a_leader_in_its_lock_delay_keeps_its_value_until_its_lease_is_reaped() {
    let cluster = Cluster::start(
        "leader-value",
        "lockext.database = 'postgres'\nlockext.reap_interval = '100ms'",
    );
    let mut c = cluster.connect();
    let token: i64 = c
        .query_one(
            "SELECT fence_token FROM lockext.lock_campaign('leader', 'node-a', '300 milliseconds', \
               '{\"addr\": \"node-a:5432\"}', lock_delay => '4 seconds')",
            &[],
        )
        .expect("lock_campaign")
        .get::<_, Option<i64>>(0)
        .expect("elected");
    eventually(
        Duration::from_secs(10),
        "the leader's lease has expired on the server clock",
        || {
            let expired: bool = c
                .query_one(
                    "SELECT bool_and(expires_at < clock_timestamp()) FROM lockext.locks WHERE lock_id = 'leader'",
                    &[],
                )
                .unwrap()
                .get(0);
            expired.then_some(())
        },
    );
    // Two rounds that started after the expiry, while the lease is in its lock-delay: a
    // round runs where something is due, so each is given an expired lease to reap.
    let seen = rounds(&mut c);
    for i in 0..2 {
        let lock = format!("tick-{i}");
        c.query_one(
            "SELECT lockext.lock_acquire($1, 'dead-client', '1 millisecond')",
            &[&lock],
        )
        .expect("lock_acquire");
        eventually(Duration::from_secs(10), "the tick reaped", || {
            let gone: bool = c
                .query_one(
                    "SELECT count(*) = 0 FROM lockext.locks WHERE lock_id = $1",
                    &[&lock],
                )
                .unwrap()
                .get(0);
            gone.then_some(())
        });
    }
    assert!(rounds(&mut c) >= seen + 2, "two more reaper rounds");
    let in_delay: bool = c
        .query_one(
            "SELECT count(*) = 1 FROM lockext.locks WHERE lock_id = 'leader' \
               AND lockext.free_at(expires_at, lock_delay) > clock_timestamp()",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        in_delay,
        "the lease left its lock-delay during the rounds: the test proves nothing"
    );
    assert!(
        has_value(&mut c, token),
        "the reaper deleted the value of a lease still in its lock-delay"
    );
    // Once the lease is free and reaped, its value goes too.
    eventually(
        Duration::from_secs(20),
        "the lease and then its value are reaped",
        || {
            let lease: i64 = c
                .query_one(
                    "SELECT count(*) FROM lockext.locks WHERE lock_id = 'leader'",
                    &[],
                )
                .unwrap()
                .get(0);
            (lease == 0 && !has_value(&mut c, token)).then_some(())
        },
    );
}
