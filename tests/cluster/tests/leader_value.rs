//! A leader's value lives as long as its grant's lease row: a lease that has expired but is
//! still in its lock-delay keeps its value through the reaper's rounds (a renewal that read
//! the clock before the expiry may still renew it, and its holder, still the leader, must
//! not find its value gone), and the value goes once the lease itself is reaped.
//! Whatever ends a lease takes its value with it, in the same statement (a take-over, a
//! dead lease cleared before a grant, a keep-alive's revoke, a session's exit, the reaper's
//! rounds) or, for a release, in the same transaction (a second statement, run only when
//! the released grant has values): no value is left for the reaper's sweep to find.

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

/// Values whose grant's lease row is gone: values nobody shows, left for a sweep.
fn orphans(c: &mut Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM lockext.lease_values AS v \
          WHERE v.lock_id <> 'canary' \
            AND NOT EXISTS (SELECT FROM lockext.locks AS l \
                             WHERE l.lock_id = v.lock_id AND l.fence_token = v.fence_token) \
            AND NOT EXISTS (SELECT FROM lockext.shared_leases AS s \
                             WHERE s.lock_id = v.lock_id AND s.fence_token = v.fence_token)",
        &[],
    )
    .expect("orphans")
    .get(0)
}

/// `lock_campaign(lock, owner, ttl, '"v"', <extra>)`: the token.
fn campaign(c: &mut Client, lock: &str, owner: &str, ttl: &str, extra: &str) -> i64 {
    c.query_one(
        &format!(
            "SELECT fence_token FROM lockext.lock_campaign($1, $2, $3::text::interval, '\"v\"'{extra})"
        ),
        &[&lock, &owner, &ttl],
    )
    .expect("lock_campaign")
    .get::<_, Option<i64>>(0)
    .expect("elected")
}

/// Waits until every lease of `lock` has expired and left its lock-delay.
fn dead(c: &mut Client, lock: &str) {
    eventually(Duration::from_secs(10), "the lease is free", || {
        let free: bool = c
            .query_one(
                "SELECT bool_and(lockext.free_at(expires_at, lock_delay) < clock_timestamp()) \
                   FROM (SELECT expires_at, lock_delay FROM lockext.locks WHERE lock_id = $1 \
                         UNION ALL \
                         SELECT expires_at, lock_delay FROM lockext.shared_leases WHERE lock_id = $1) AS l",
                &[&lock],
            )
            .unwrap()
            .get::<_, Option<bool>>(0)
            .expect("a lease row");
        free.then_some(())
    });
}

/// Whether `lock` has a lease row with `token`.
fn lease_with(c: &mut Client, lock: &str, token: i64) -> bool {
    c.query_one(
        "SELECT EXISTS (SELECT FROM lockext.locks WHERE lock_id = $1 AND fence_token = $2) \
             OR EXISTS (SELECT FROM lockext.shared_leases WHERE lock_id = $1 AND fence_token = $2)",
        &[&lock, &token],
    )
    .unwrap()
    .get(0)
}

#[test]
fn every_way_a_lease_ends_takes_its_value_with_it() {
    // Database app has no reaper (lockext.database names only postgres): whatever deletes
    // a value there is the statement that ended its lease. In postgres the reaper runs,
    // and a planted orphan (an older version's) shows that no sweep ran meanwhile.
    let cluster = Cluster::start(
        "values-end",
        "lockext.database = 'postgres'\nlockext.reap_interval = '100ms'",
    );
    let mut c = cluster.connect();
    c.batch_execute("CREATE DATABASE app").unwrap();
    let mut app = cluster.connect_to("app");
    app.batch_execute("CREATE EXTENSION lockext").unwrap();
    // Each way's orphans, counted apart: every way is tried, and all that leave values are
    // named at the end.
    let mut left_behind = Vec::new();
    let mut seen = std::collections::HashMap::new();
    let mut check = |c: &mut Client, way: &str| {
        let db: String = c
            .query_one("SELECT current_database()::text", &[])
            .unwrap()
            .get(0);
        let now = orphans(c);
        let before = seen.insert(db, now).unwrap_or(0);
        if now != before {
            left_behind.push(format!("{way}: {}", now - before));
        }
    };

    campaign(&mut app, "released", "a", "1 minute", "");
    assert!(app
        .query_one("SELECT lockext.lock_release('released', 'a')", &[])
        .unwrap()
        .get::<_, bool>(0));
    check(&mut app, "lock_release of an exclusive lease");

    campaign(
        &mut app,
        "released-shared",
        "a",
        "1 minute",
        ", mode => 'shared'",
    );
    assert!(app
        .query_one("SELECT lockext.lock_release('released-shared', 'a')", &[])
        .unwrap()
        .get::<_, bool>(0));
    check(&mut app, "lock_release of a shared lease");

    // Take-overs: a dead lease's row replaced in place by a new grant.
    let old = campaign(
        &mut app,
        "taken",
        "a",
        "50 milliseconds",
        ", lock_delay => '0'",
    );
    dead(&mut app, "taken");
    let new: i64 = app
        .query_one(
            "SELECT fence_token FROM lockext.lock_acquire('taken', 'b', '1 minute')",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(new > old && !lease_with(&mut app, "taken", old));
    check(&mut app, "a take-over of an exclusive lease");

    let old = campaign(
        &mut app,
        "taken-shared",
        "a",
        "50 milliseconds",
        ", mode => 'shared', lock_delay => '0'",
    );
    dead(&mut app, "taken-shared");
    app.query_one("SELECT fence_token FROM lockext.lock_acquire('taken-shared', 'a', '1 minute', mode => 'shared')", &[])
        .unwrap();
    assert!(!lease_with(&mut app, "taken-shared", old));
    check(&mut app, "a new grant of a shared lease's own dead row");

    // Dead leases of another kind, or of a permit's slot, deleted before a grant.
    campaign(
        &mut app,
        "cleared-shared",
        "a",
        "50 milliseconds",
        ", mode => 'shared', lock_delay => '0'",
    );
    dead(&mut app, "cleared-shared");
    app.query_one(
        "SELECT fence_token FROM lockext.lock_acquire('cleared-shared', 'b', '1 minute')",
        &[],
    )
    .unwrap();
    check(&mut app, "an exclusive grant clearing a dead shared lease");

    campaign(
        &mut app,
        "cleared-exclusive",
        "a",
        "50 milliseconds",
        ", lock_delay => '0'",
    );
    dead(&mut app, "cleared-exclusive");
    app.query_one("SELECT fence_token FROM lockext.lock_acquire('cleared-exclusive', 'b', '1 minute', mode => 'shared')", &[])
        .unwrap();
    check(&mut app, "a shared grant clearing a dead exclusive lease");

    campaign(
        &mut app,
        "cleared-slot",
        "a",
        "50 milliseconds",
        ", permits => 1, lock_delay => '0'",
    );
    dead(&mut app, "cleared-slot");
    app.query_one("SELECT fence_token FROM lockext.lock_acquire('cleared-slot', 'b', '1 minute', permits => 1)", &[])
        .unwrap();
    check(&mut app, "a permit clearing a dead permit of its slot");

    // A keep-alive's end: lock_keepalive_revoke.
    let keepalive: i64 = app
        .query_one(
            "SELECT keepalive FROM lockext.lock_keepalive_grant('1 minute')",
            &[],
        )
        .unwrap()
        .get(0);
    for (lock, mode) in [("kept", "exclusive"), ("kept-shared", "shared")] {
        let token: i64 = app
            .query_one(
                "SELECT fence_token FROM lockext.lock_acquire($1, 'a', NULL, mode => $2, keepalive => $3)",
                &[&lock, &mode, &keepalive],
            )
            .unwrap()
            .get(0);
        app.query_one(
            "SELECT lockext.lock_set_value($1, 'a', $2, '\"v\"')",
            &[&lock, &token],
        )
        .unwrap();
    }
    app.query_one("SELECT lockext.lock_keepalive_revoke($1)", &[&keepalive])
        .unwrap();
    check(&mut app, "lock_keepalive_revoke");

    // A session's end: its exit deletes its session-bound leases.
    let mut session = cluster.connect_to("app");
    campaign(
        &mut session,
        "session",
        "a",
        "1 minute",
        ", session_bound => true",
    );
    campaign(
        &mut session,
        "session-shared",
        "a",
        "1 minute",
        ", mode => 'shared', session_bound => true",
    );
    drop(session);
    eventually(
        Duration::from_secs(10),
        "the session's exit ended its leases",
        || {
            let left: i64 = app
                .query_one(
                    "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'session%'",
                    &[],
                )
                .unwrap()
                .get(0);
            let shared: i64 = app
                .query_one(
                    "SELECT count(*) FROM lockext.shared_leases WHERE lock_id LIKE 'session%'",
                    &[],
                )
                .unwrap()
                .get(0);
            (left + shared == 0).then_some(())
        },
    );
    check(&mut app, "a session-bound lease's session exit");

    // The reaper, in postgres: once its first round in the database with lockext (a
    // sweep) has run, an orphan of an older version is planted, which only a sweep deletes.
    // (A round that found no extension yet counts too, with its error.)
    eventually(Duration::from_secs(10), "the first round", || {
        c.query_opt(
            "SELECT FROM lockext.reaper_status() \
              WHERE database = 'postgres' AND rounds >= 1 AND last_error IS NULL",
            &[],
        )
        .unwrap()
    });
    c.batch_execute(
        "INSERT INTO lockext.lease_values VALUES ('canary', 1, 'old', '\"x\"', 1, now(), 10)",
    )
    .unwrap();
    campaign(
        &mut c,
        "reaped",
        "a",
        "50 milliseconds",
        ", lock_delay => '0'",
    );
    campaign(
        &mut c,
        "reaped-shared",
        "a",
        "50 milliseconds",
        ", mode => 'shared', lock_delay => '0'",
    );
    let keepalive: i64 = c
        .query_one(
            "SELECT keepalive FROM lockext.lock_keepalive_grant('100 milliseconds')",
            &[],
        )
        .unwrap()
        .get(0);
    let token: i64 = c
        .query_one(
            "SELECT fence_token FROM lockext.lock_acquire('reaped-attached', 'a', NULL, keepalive => $1)",
            &[&keepalive],
        )
        .unwrap()
        .get(0);
    c.query_one(
        "SELECT lockext.lock_set_value('reaped-attached', 'a', $1, '\"v\"')",
        &[&token],
    )
    .unwrap();
    eventually(
        Duration::from_secs(10),
        "the reaper reaped the leases",
        || {
            let left: i64 = c
            .query_one(
                "SELECT (SELECT count(*) FROM lockext.locks) + (SELECT count(*) FROM lockext.shared_leases)",
                &[],
            )
            .unwrap()
            .get(0);
            (left == 0).then_some(())
        },
    );
    let canary: bool = c
        .query_one(
            "SELECT EXISTS (SELECT FROM lockext.lease_values WHERE lock_id = 'canary')",
            &[],
        )
        .unwrap()
        .get(0);
    check(&mut c, "the reaper's rounds");
    assert!(
        left_behind.is_empty(),
        "values left behind by: {left_behind:#?}"
    );
    assert!(
        canary,
        "a sweep ran: the test proves nothing about the reaper's rounds"
    );
}
