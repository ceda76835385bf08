//! Fencing tokens across changes of history that the attack pass on 0.3.0 found holes in:
//! a standby promoted after its primary started an era it never replayed, a reinstall
//! rolled back after it handed out a token, a dump taken while the first grant's epoch row
//! was still uncommitted, an installation upgraded from 0.2.0 whose database is recreated
//! or restored over, and two branches of history recovered from one WAL archive.
//!
//! The contract, tested only through SQL: every token handed out is higher than every
//! token any client saw before it, and at most 2^53 - 1 (a JavaScript Number holds it
//! exactly) unless the installation keeps 0.2.0's layout. Each test prints the numbers it
//! compares, checks them all, and then fails with the list of what did not hold.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use lockext_cluster_tests::checks::*;
use lockext_cluster_tests::crash::*;
use lockext_cluster_tests::*;

const WITHIN: Duration = Duration::from_secs(30);

/// `lockext.fenced_update(resource, token, data)`: Ok(accepted), or the SQLSTATE and
/// message of its error.
fn fenced_update(c: &mut Client, resource: &str, token: i64) -> Result<bool, String> {
    c.query_one(
        "SELECT lockext.fenced_update($1, $2, '{\"by\": \"test\"}'::jsonb)",
        &[&resource, &token],
    )
    .map(|row| row.get(0))
    .map_err(|e| match e.as_db_error() {
        Some(db) => format!("{} {}", db.code().code(), db.message()),
        None => e.to_string(),
    })
}

/// Finding A. The primary reinstalls lockext (a new token sequence: a new history); its
/// standby replays that, and stops before the primary's first grant of the new era. The
/// standby's copy of the cluster record is the base backup's: it knows nothing of the era
/// the primary then starts. Promoted without its primary, it must still mint above it.
#[test]
fn a_promoted_standby_passes_an_era_its_primary_started_after_the_last_replay() {
    let mut checks = Checks::new("A promoted standby");
    let primary = Cluster::start("hist-a-primary", "");
    let mut p = primary.connect();
    let mut seen = grant_many(&mut p, "before", 3);

    let standby = base_backup(&primary, "hist-a-standby", "-R", "hot_standby = on");
    standby.pg_ctl("start -w -t 60");
    let mut s = standby.reconnect(WITHIN);

    p.batch_execute("DROP EXTENSION lockext; CREATE EXTENSION lockext")
        .expect("reinstall lockext on the primary");
    let lsn: String = p
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .unwrap()
        .get(0);
    wait_for_replay(&mut s, &lsn, WITHIN);
    let on_standby = count(&mut s, "SELECT count(*) FROM lockext.locks");
    checks.check(
        on_standby == 0,
        format!("the standby replayed the reinstall up to {lsn} ({on_standby} leases there)"),
    );
    drop(s);
    standby.pg_ctl("stop -m fast -w -t 60");

    let new_era = grant_many(&mut p, "new-era", 3);
    println!(
        "A promoted standby: primary before the reinstall {:?} (eras {:?}); after it, with the standby stopped, {new_era:?} (eras {:?})",
        seen,
        eras(&seen),
        eras(&new_era)
    );
    checks.above("the primary's reinstall started a new era", &new_era, &seen);
    seen.extend(&new_era);

    // Failover: the standby comes up without its primary and is promoted.
    let auto = standby.data().join("postgresql.auto.conf");
    let text = fs::read_to_string(&auto).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("primary_conninfo"))
        .collect();
    fs::write(&auto, kept.join("\n") + "\n").unwrap();
    standby.pg_ctl("start -w -t 60");
    standby.pg_ctl("promote -w -t 60");
    let mut s = wait_for_primary(&standby, WITHIN);
    let tl = timeline(&mut s);
    let promoted = grant_many(&mut s, "promoted", 5);
    println!(
        "A promoted standby: on timeline {tl}, grants {promoted:?} (eras {:?})",
        eras(&promoted)
    );
    checks.above(
        "the promoted standby, against every token of the primary",
        &promoted,
        &seen,
    );
    let order: Vec<(String, i64)> = promoted
        .iter()
        .map(|&t| ("promoted".to_string(), t))
        .collect();
    checks.increasing("the promoted standby's grants", &order);
    seen.extend(&promoted);
    checks.in_range("every token", &seen);
    checks.finish();
}

/// Finding B. A reinstall inside a transaction starts a new era (on disk, in the cluster
/// record) and hands out a token in it, then rolls back: the old extension, sequence and
/// history are back. A session that was open all along and a new session must then mint
/// in one era, above the rolled-back token, and accept each other's tokens.
#[test]
fn a_rolled_back_reinstall_does_not_leave_two_eras_in_use() {
    let mut checks = Checks::new("B rolled-back reinstall");
    let cluster = Cluster::start("hist-b", "");
    let mut a = cluster.connect();
    let mut order: Vec<(String, i64)> = (0..3)
        .map(|i| {
            (
                "A".to_string(),
                grant(&mut a, &format!("a-before-{i}"), "a"),
            )
        })
        .collect();

    let mut su = cluster.connect();
    su.batch_execute("BEGIN; DROP EXTENSION lockext; CREATE EXTENSION lockext")
        .expect("reinstall lockext in a transaction");
    let t_rb: i64 = su
        .query_one(
            "SELECT (lockext.lock_acquire('r', 'o', '1 minute')).fence_token",
            &[],
        )
        .expect("grant inside the reinstall")
        .get(0);
    su.batch_execute("ROLLBACK")
        .expect("roll the reinstall back");
    order.push(("rolled-back reinstall".to_string(), t_rb));
    let kept = count(
        &mut su,
        "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'a-before-%'",
    );
    checks.check(
        kept == 3,
        format!("the old extension is back after the rollback ({kept} of A's 3 leases)"),
    );
    println!(
        "B rolled-back reinstall: A's grants {:?}, the rolled-back grant t_rb {t_rb} (era {})",
        &order[..3],
        t_rb >> ERA_SHIFT
    );

    let mut n = cluster.connect();
    let mut after = Vec::new();
    let mut last_new = 0;
    let mut last_a = 0;
    for i in 0..4 {
        last_new = grant(&mut n, &format!("new-{i}"), "n");
        order.push(("new session".to_string(), last_new));
        last_a = grant(&mut a, &format!("a-after-{i}"), "a");
        order.push(("A".to_string(), last_a));
        after.extend([last_new, last_a]);
    }
    println!(
        "B rolled-back reinstall: after the rollback, new session and A alternating: {after:?} (eras {:?})",
        eras(&after)
    );
    checks.increasing("A, the rolled-back grant, then new session and A", &order);
    checks.above("after the rollback, against t_rb", &after, &[t_rb]);
    checks.check(
        eras(&after).len() == 1,
        format!(
            "one era in use after the rollback (eras {:?})",
            eras(&after)
        ),
    );

    let in_a = fenced_update(&mut a, "acct", last_new);
    checks.check(
        in_a == Ok(true),
        format!(
            "fenced_update('acct', {last_new}) in A, with the new session's latest token: {in_a:?}"
        ),
    );
    let last_new = grant(&mut n, "new-last", "n");
    let in_new = fenced_update(&mut n, "acct", last_new);
    checks.check(
        in_new == Ok(true),
        format!(
            "fenced_update('acct', {last_new}) in the new session, after A's {last_a}: {in_new:?}"
        ),
    );
    let tokens: Vec<i64> = order.iter().map(|(_, t)| *t).collect();
    checks.in_range("every token", &tokens);
    checks.finish();
}

/// Finding C. The first grant of a fresh cluster writes the epoch row in its own
/// transaction, which stays open; meanwhile another role's grants and fenced write commit.
/// A dump taken then has their leases and the resource's mark, but no epoch row (and 0.3.0
/// does not dump the sequence). Restored into a new cluster, the next grant must still be
/// above every token of the source, and the restored resource must accept it.
#[test]
fn a_dump_taken_while_the_first_grant_is_open_still_restores_above_its_tokens() {
    let mut checks = Checks::new("C dump with the first grant open");
    let source = Cluster::start("hist-c-source", "");
    let mut admin = source.connect();
    admin
        .batch_execute("CREATE ROLE app LOGIN; GRANT lockext_user TO app")
        .expect("create role app");
    let mut first = source.connect();
    first.batch_execute("BEGIN").unwrap();
    let t0 = grant(&mut first, "first", "first-client");

    let app_url = source.url("postgres").replace("user=postgres", "user=app");
    let mut app = Client::connect(&app_url, NoTls).expect("connect as app");
    let ks: Vec<i64> = (1..=5)
        .map(|i| grant(&mut app, &format!("k{i}"), "app"))
        .collect();
    let t5 = ks[4];
    let wrote = fenced_update(&mut app, "acct", t5);
    checks.check(
        wrote == Ok(true),
        format!("fenced_update('acct', t5 = {t5}) by app: {wrote:?}"),
    );
    let rows = count(&mut admin, "SELECT count(*) FROM lockext.token_epoch");
    checks.check(
        rows == 0,
        format!("the epoch row is not committed when the dump is taken ({rows} rows visible): the scenario means something"),
    );
    let dump = source.dir.join("c.dump");
    pg_dump(&source, "postgres", &dump);
    let still_open: bool = first
        .query_one("SELECT txid_current_if_assigned() IS NOT NULL", &[])
        .unwrap()
        .get(0);
    checks.check(
        still_open,
        "the first grant's transaction was still open during the dump".to_string(),
    );
    let mut seen = vec![t0];
    seen.extend(&ks);
    println!("C dump with the first grant open: first grant {t0} (open), app's k1..k5 {ks:?}");

    let target = Cluster::start("hist-c-target", "");
    createdb(&target, "restored");
    pg_restore(&target, "restored", &dump, "");
    let mut r = target.connect_to("restored");
    let restored = count(
        &mut r,
        "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'k_'",
    );
    let mark: Option<i64> = r
        .query_one(
            "SELECT max(fence_token) FROM lockext.resources WHERE resource_id = 'acct'",
            &[],
        )
        .unwrap()
        .get(0);
    checks.check(
        restored == 5 && mark == Some(t5),
        format!("the restore brought k1..k5 ({restored}) and acct's mark ({mark:?}) over"),
    );
    let next = grant(&mut r, "after-restore", "client");
    println!(
        "C dump with the first grant open: next grant in the new cluster {next} (era {})",
        next >> ERA_SHIFT
    );
    checks.above("next grant after the restore", &[next], &seen);
    let accepted = fenced_update(&mut r, "acct", next);
    checks.check(
        accepted == Ok(true),
        format!("fenced_update('acct', {next}) in the restored database: {accepted:?}"),
    );
    seen.push(next);
    let more = grant_many(&mut r, "more", 3);
    checks.above("later grants after the restore", &more, &seen);
    seen.extend(&more);
    checks.in_range("every token", &seen);
    first.batch_execute("COMMIT").unwrap();
    checks.finish();
}

/// The token 99_upgrade.sql gives the lease and resource of an emulated 0.2.0 installation.
const OLD_WIDE_TOKEN: i64 = (4096 << WIDE_ERA_SHIFT) | 41;

/// Emulates, in database `db`, an installation upgraded from 0.2.0 the way
/// tests/pg_regress/sql/99_upgrade.sql does: 0.1.0 with an epoch row (epoch 4096), a used
/// counter and a lease and resource at (4096 << 43) | 41, then ALTER EXTENSION UPDATE.
/// Returns the upgraded version.
fn emulate_upgrade(c: &mut Client) -> String {
    for sql in [
        "CREATE EXTENSION lockext VERSION '0.1.0'",
        "INSERT INTO lockext.token_epoch \
         SELECT true, 4096, system_identifier, timeline_id, \
                (SELECT oid FROM pg_database WHERE datname = current_database()), 0, now() \
           FROM pg_control_system(), pg_control_checkpoint()",
        "SELECT setval('lockext.fence_token_seq', 41)",
        "INSERT INTO lockext.locks VALUES ('kept-lease', 'worker-1', (4096::bigint << 43) | 41, \
                'postgres'::regrole, now(), now() + interval '1 hour')",
        "INSERT INTO lockext.resources VALUES ('kept-resource', (4096::bigint << 43) | 41, \
                '{\"v\": 1}', now())",
        "ALTER EXTENSION lockext UPDATE",
    ] {
        c.batch_execute(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    c.query_one(
        "SELECT extversion FROM pg_extension WHERE extname = 'lockext'",
        &[],
    )
    .unwrap()
    .get(0)
}

/// Finding E. An installation upgraded from 0.2.0 handed out tokens above 2^53 and keeps
/// that layout. (1) Its database dropped and created again under the same name, with a
/// fresh CREATE EXTENSION: the cluster record is all that remembers those tokens. (2) A
/// dump of a fresh, never-upgraded database of another cluster restored with
/// `pg_restore --clean` over an upgraded database: the dump knows only small tokens. In
/// both the next token must be above the old wide ones.
#[test]
fn an_upgraded_cluster_never_goes_below_its_wide_tokens() {
    let mut checks = Checks::new("E upgraded from 0.2.0");

    // (1) DROP DATABASE and CREATE DATABASE with the same name.
    let old = Cluster::start("hist-e-upgraded", "");
    createdb(&old, "up");
    let mut u = old.connect_to("up");
    let version = emulate_upgrade(&mut u);
    let mut seen = vec![OLD_WIDE_TOKEN];
    let g = grant(&mut u, "after-upgrade", "client");
    println!(
        "E upgraded from 0.2.0: updated to {version}; 0.2.0's token {OLD_WIDE_TOKEN} (epoch {}), first grant after the update {g} (era {})",
        OLD_WIDE_TOKEN >> WIDE_ERA_SHIFT,
        g >> WIDE_ERA_SHIFT
    );
    checks.above("(1) first grant after the update", &[g], &seen);
    seen.push(g);
    drop(u);
    let mut pg = old.connect();
    pg.batch_execute("DROP DATABASE up WITH (FORCE)")
        .expect("drop database up");
    pg.batch_execute("CREATE DATABASE up")
        .expect("create database up");
    let mut u = old.connect_to("up");
    u.batch_execute("CREATE EXTENSION lockext")
        .expect("create extension in the new database up");
    let recreated = grant_many(&mut u, "recreated", 3);
    println!(
        "E upgraded from 0.2.0: (1) after DROP/CREATE DATABASE up: {recreated:?} (wide eras {:?})",
        eras(&recreated)
    );
    checks.above(
        "(1) the recreated database, against the upgraded one's tokens",
        &recreated,
        &seen,
    );
    seen.extend(&recreated);

    // (2) A fresh database's dump restored with --clean over an upgraded database.
    let fresh = Cluster::start("hist-e-fresh", "");
    let mut f = fresh.connect();
    let small = grant_many(&mut f, "fresh", 3);
    let dump = fresh.dir.join("fresh.dump");
    pg_dump(&fresh, "postgres", &dump);
    checks.in_range("the fresh cluster's tokens", &small);

    let old2 = Cluster::start("hist-e-upgraded-2", "");
    createdb(&old2, "up");
    let mut u2 = old2.connect_to("up");
    emulate_upgrade(&mut u2);
    let mut seen2 = vec![OLD_WIDE_TOKEN];
    let g2 = grant(&mut u2, "after-upgrade", "client");
    checks.above("(2) first grant after the update", &[g2], &seen2);
    seen2.push(g2);
    drop(u2);
    pg_restore(&old2, "up", &dump, "--clean --if-exists");
    let mut u2 = old2.connect_to("up");
    let from_dump = count(
        &mut u2,
        "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'fresh-%'",
    );
    let wide_left = count(
        &mut u2,
        "SELECT count(*) FROM lockext.locks WHERE fence_token > 9007199254740991",
    );
    checks.check(
        from_dump == 3 && wide_left == 0,
        format!("the fresh dump replaced the upgraded state ({from_dump} leases of the dump, {wide_left} wide ones left)"),
    );
    let restored = grant_many(&mut u2, "restored", 3);
    println!(
        "E upgraded from 0.2.0: (2) fresh tokens {small:?}; upgraded {seen2:?}; after pg_restore --clean of the fresh dump: {restored:?}"
    );
    checks.above(
        "(2) after restoring the fresh dump over the upgraded database",
        &restored,
        &seen2,
    );
    checks.above(
        "(2) ... and against the dump's own tokens",
        &restored,
        &small,
    );
    checks.finish();
}

/// Finding E, before any grant. The upgrade itself must tell the cluster record that
/// 0.2.0's layout was used here: with no grant after ALTER EXTENSION UPDATE, nothing else
/// would. (1) The database dropped and created again under the same name, with a fresh
/// CREATE EXTENSION; (2) in another cluster, DROP EXTENSION lockext CASCADE and CREATE
/// EXTENSION right after the update. In both the first grant must be above 0.2.0's token.
#[test]
fn an_upgraded_database_dropped_before_any_grant_still_goes_on_above_its_wide_tokens() {
    let mut checks = Checks::new("E upgraded, no grant");
    let seen = vec![OLD_WIDE_TOKEN];

    // (1) DROP DATABASE and CREATE DATABASE with the same name.
    let old = Cluster::start("hist-e0-dropdb", "");
    createdb(&old, "up");
    let mut u = old.connect_to("up");
    let version = emulate_upgrade(&mut u);
    let leases = count(&mut u, "SELECT count(*) FROM lockext.locks");
    checks.check(
        leases == 1,
        format!("(1) updated to {version} with no grant after it ({leases} lease: 0.2.0's)"),
    );
    drop(u);
    let mut pg = old.connect();
    pg.batch_execute("DROP DATABASE up WITH (FORCE)")
        .expect("drop database up");
    pg.batch_execute("CREATE DATABASE up")
        .expect("create database up");
    let mut u = old.connect_to("up");
    u.batch_execute("CREATE EXTENSION lockext")
        .expect("create extension in the new database up");
    let recreated = grant_many(&mut u, "recreated", 3);
    println!(
        "E upgraded, no grant: 0.2.0's token {OLD_WIDE_TOKEN} (epoch {}); (1) after DROP/CREATE DATABASE up: {recreated:?} (eras {:?})",
        OLD_WIDE_TOKEN >> WIDE_ERA_SHIFT,
        eras(&recreated)
    );
    checks.above(
        "(1) the recreated database, against 0.2.0's token",
        &recreated,
        &seen,
    );

    // (2) DROP EXTENSION CASCADE and CREATE EXTENSION, in another cluster.
    let old2 = Cluster::start("hist-e0-reinstall", "");
    createdb(&old2, "up");
    let mut u2 = old2.connect_to("up");
    let version2 = emulate_upgrade(&mut u2);
    let leases2 = count(&mut u2, "SELECT count(*) FROM lockext.locks");
    checks.check(
        leases2 == 1,
        format!("(2) updated to {version2} with no grant after it ({leases2} lease: 0.2.0's)"),
    );
    u2.batch_execute("DROP EXTENSION lockext CASCADE; CREATE EXTENSION lockext")
        .expect("reinstall lockext right after the update");
    let reinstalled = grant_many(&mut u2, "reinstalled", 3);
    println!(
        "E upgraded, no grant: (2) after DROP EXTENSION CASCADE/CREATE EXTENSION: {reinstalled:?} (eras {:?})",
        eras(&reinstalled)
    );
    checks.above(
        "(2) the reinstalled extension, against 0.2.0's token",
        &reinstalled,
        &seen,
    );
    checks.finish();
}

/// Finding F. One primary archives its WAL; two base backups of it are recovered from that
/// archive (recovery.signal, restore_command), one after the other, both to the end of
/// the archive: b1 comes up on timeline 2, and b2, told to stay on the backup's timeline
/// (recovery_target_timeline = 'current', since timeline 2 is not in its history), on
/// timeline 3. Both start from the same copy of the cluster record and the same replayed
/// state, so only the timeline tells them apart: their tokens must be in different eras,
/// and above every token the primary handed out.
#[test]
fn two_recovery_branches_from_one_archive_get_different_eras() {
    let mut checks = Checks::new("F two recovery branches");
    let arch = PathBuf::from(format!(
        "/tmp/lockext-tests/hist-f-archive-{}",
        std::process::id()
    ));
    postgres_dir(&arch);
    let _arch_guard = RemoveOnDrop(arch.clone());
    let archive_conf = format!(
        "archive_mode = on\narchive_command = 'test ! -f {0}/%f && cp %p {0}/%f'\n",
        arch.display()
    );
    let primary = Cluster::start("hist-f-primary", &archive_conf);
    let mut p = primary.connect();
    let mut seen = grant_many(&mut p, "g0", 3);
    let recovery_conf = format!("restore_command = 'cp {}/%f %p'\n", arch.display());
    let b1 = base_backup(&primary, "hist-f-b1", "", &recovery_conf);
    seen.extend(grant_many(&mut p, "g-mid", 3));
    let b2 = base_backup(
        &primary,
        "hist-f-b2",
        "",
        &format!("{recovery_conf}recovery_target_timeline = 'current'\n"),
    );
    seen.extend(grant_many(&mut p, "g-late", 3));
    // Everything so far reaches the archive; what follows stays in the primary's current
    // segment, which nothing switches (no archive_timeout), so neither branch sees it.
    let segment: String = p
        .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
        .unwrap()
        .get(0);
    eventually(WITHIN, &format!("the primary archives {segment}"), || {
        p.query_one(
            "SELECT coalesce(last_archived_wal >= $1, false) FROM pg_stat_archiver",
            &[&segment],
        )
        .ok()?
        .get::<_, bool>(0)
        .then_some(())
    });
    let unarchived = grant_many(&mut p, "g-unarchived", 3);
    seen.extend(&unarchived);
    println!(
        "F two recovery branches: the primary's tokens {seen:?} (eras {:?}); archived up to {segment}",
        eras(&seen)
    );

    for b in [&b1, &b2] {
        as_postgres(&format!("touch {}/recovery.signal", b.data().display()));
    }
    b1.pg_ctl("start -w -t 60");
    let mut c1 = wait_for_primary(&b1, WITHIN);
    // b1's archiver publishes timeline 2's history before b2 recovers: then b2 must take 3.
    let done = b1
        .data()
        .join("pg_wal/archive_status/00000002.history.done");
    eventually(WITHIN, "b1 archives 00000002.history", || {
        done.exists().then_some(())
    });
    b2.pg_ctl("start -w -t 60");
    let mut c2 = wait_for_primary(&b2, WITHIN);
    let (tl1, tl2) = (timeline(&mut c1), timeline(&mut c2));
    checks.check(
        tl1 == 2 && tl2 == 3,
        format!("b1 is on timeline {tl1}, b2 on timeline {tl2} (expected 2 and 3)"),
    );
    let replayed1 = count(
        &mut c1,
        "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'g-late-%'",
    );
    let replayed2 = count(
        &mut c2,
        "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'g-late-%'",
    );
    let lost1 = count(
        &mut c1,
        "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'g-unarchived-%'",
    );
    checks.check(
        replayed1 == 3 && replayed2 == 3 && lost1 == 0,
        format!(
            "both branches replayed the archive to its end (g-late leases: b1 {replayed1}, b2 {replayed2}; unarchived ones on b1: {lost1})"
        ),
    );

    let mut on_b1 = grant_many(&mut c1, "b1", 5);
    let on_b2 = grant_many(&mut c2, "b2", 5);
    on_b1.extend(grant_many(&mut c1, "b1-more", 5));
    println!(
        "F two recovery branches: b1 (timeline {tl1}) {on_b1:?} (eras {:?}); b2 (timeline {tl2}) {on_b2:?} (eras {:?})",
        eras(&on_b1),
        eras(&on_b2)
    );
    let (e1, e2) = (eras(&on_b1), eras(&on_b2));
    checks.check(
        e1.iter().all(|e| !e2.contains(e)),
        format!("b1's eras {e1:?} and b2's eras {e2:?} are disjoint"),
    );
    let shared: Vec<i64> = on_b1
        .iter()
        .copied()
        .filter(|t| on_b2.contains(t))
        .collect();
    checks.check(
        shared.is_empty(),
        format!("no token is handed out by both branches (shared: {shared:?})"),
    );
    checks.above("b1, against the primary's tokens", &on_b1, &seen);
    checks.above("b2, against the primary's tokens", &on_b2, &seen);
    seen.extend(&on_b1);
    seen.extend(&on_b2);
    checks.in_range("every token", &seen);
    checks.finish();
}
