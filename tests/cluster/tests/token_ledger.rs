//! The token ledger through every way the history of a cluster can change, on real
//! clusters (docs/tokens.md, "The proof", names the test of each row).
//!
//! The contract, tested only through SQL: every token handed out is higher than every
//! token any client saw before it, and at most 2^53 - 1. Each test prints the numbers it
//! compares, checks them all, and then fails with the list of what did not hold. The
//! first three are the third review's findings on 0.3.0: a promoted asynchronous standby,
//! a point-in-time recovery and `pg_resetwal` each handed out tokens again.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use lockext_cluster_tests::checks::*;
use lockext_cluster_tests::crash::*;
use lockext_cluster_tests::*;

const WITHIN: Duration = Duration::from_secs(60);

/// Starts `standby` as a server of its own: no primary to stream from, then promoted.
fn promote_alone(standby: &Cluster) -> Client {
    let auto = standby.data().join("postgresql.auto.conf");
    let text = fs::read_to_string(&auto).unwrap_or_default();
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("primary_conninfo"))
        .collect();
    fs::write(&auto, kept.join("\n") + "\n").expect("rewrite postgresql.auto.conf");
    standby.pg_ctl("start -w -t 60");
    standby.pg_ctl("promote -w -t 60");
    wait_for_primary(standby, WITHIN)
}

/// Finding 1 of the third review, as it was found: the standby replayed `CREATE DATABASE
/// fx; CREATE EXTENSION lockext` and stopped; the primary then granted three leases in
/// fx, acknowledged and durable, and died (kill -9). The promoted standby handed out the
/// same three tokens again. Variants: the standby replayed a reinstall and missed only the
/// first grants after it; a synchronous standby (it missed nothing acknowledged); a
/// cascaded standby (streaming from a standby) that missed the grants.
#[test]
fn a_promoted_standby_that_missed_grants_hands_out_none_of_them_again() {
    let mut checks = Checks::new("Failover, missed grants");
    for variant in ["new database", "reinstall", "synchronous", "cascaded"] {
        let tag = variant.replace(' ', "-");
        let primary = Cluster::start(&format!("ledger-fo-{tag}"), "");
        let mut p = primary.connect();
        sql(&mut p, "CREATE DATABASE app");
        let mut app = primary.connect_to("app");
        sql(&mut app, "CREATE EXTENSION lockext");
        let mut seen = grant_many(&mut app, "app", 1);
        let db = if variant == "reinstall" {
            seen.extend(grant_many(&mut app, "before-reinstall", 2));
            "app"
        } else {
            sql(&mut p, "CREATE DATABASE fx");
            let mut fx = primary.connect_to("fx");
            sql(&mut fx, "CREATE EXTENSION lockext");
            "fx"
        };

        let standby = base_backup(
            &primary,
            &format!("ledger-fo-standby-{tag}"),
            "-R",
            "hot_standby = on",
        );
        standby.pg_ctl("start -w -t 60");
        let mut s = standby.reconnect(WITHIN);
        if variant == "synchronous" {
            // Every commit from here on waits for the standby to have it.
            sql(
                &mut p,
                "ALTER SYSTEM SET synchronous_standby_names = '*'; SELECT pg_reload_conf()",
            );
            eventually(WITHIN, "the standby is synchronous", || {
                p.query_one(
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                    &[],
                )
                .ok()?
                .get::<_, i64>(0)
                .eq(&1)
                .then_some(())
            });
        }
        // The one that will be promoted: the standby, or one streaming from it.
        let cascaded = (variant == "cascaded").then(|| {
            let c = base_backup(
                &standby,
                &format!("ledger-fo-cascaded-{tag}"),
                "-R",
                "hot_standby = on",
            );
            c.pg_ctl("start -w -t 60");
            c
        });
        if variant == "reinstall" {
            sql(&mut app, "DROP EXTENSION lockext; CREATE EXTENSION lockext");
        }
        let lsn: String = p
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .unwrap()
            .get(0);
        wait_for_replay(&mut s, &lsn, WITHIN);
        let target = cascaded.as_ref().unwrap_or(&standby);
        let mut t = target.reconnect(WITHIN);
        wait_for_replay(&mut t, &lsn, WITHIN);
        drop(t);
        drop(s);
        if variant != "synchronous" {
            // Falls behind: it replays nothing more from here on.
            target.pg_ctl("stop -m fast -w -t 60");
        }

        // Acknowledged and durable on the primary (and, synchronous, on the standby).
        let mut c = primary.connect_to(db);
        let missed = grant_many(&mut c, "w", 3);
        drop(c);
        drop(app);
        drop(p);
        kill_server(&primary);

        let mut promoted = if variant == "synchronous" {
            standby.pg_ctl("promote -w -t 60");
            wait_for_primary(&standby, WITHIN)
        } else {
            if cascaded.is_some() {
                standby.pg_ctl("stop -m immediate -w -t 60");
            }
            promote_alone(target)
        };
        let tl = timeline(&mut promoted);
        println!(
            "Failover, {variant}: the promoted server's ledger: {:?}",
            fs::read_to_string(target.data().join("pg_lockext/ledger"))
        );
        let mut on_new = target.connect_to(db);
        // New lock ids: a synchronous standby has the primary's leases, and the same owner
        // asking again for one of them gets that grant back, not a new token.
        let after = grant_many(&mut on_new, "promoted", 3);
        println!(
            "Failover, {variant}: before {seen:?}, then {missed:?} (eras {:?}) on the primary; \
             promoted (timeline {tl}) {after:?} (eras {:?})",
            eras(&missed),
            eras(&after)
        );
        seen.extend(&missed);
        checks.above(
            &format!("{variant}: the promoted standby, against every acknowledged token"),
            &after,
            &seen,
        );
        seen.extend(&after);
        checks.in_range(&format!("{variant}: every token"), &seen);
    }
    checks.finish();
}

/// A dump restored into another cluster: that cluster's ledger knows nothing of the
/// dump's history, so it adopts it. Its first tokens are above every token in the dump and
/// above the dumped era, even when the other cluster's ledger is far behind (a fresh
/// cluster) or was never written.
#[test]
fn a_dump_restored_into_another_cluster_starts_above_it() {
    let mut checks = Checks::new("Restore into another cluster");
    let source = Cluster::start("ledger-dump-source", "");
    let s = source.connect();
    // A source in a later era than the target: a second timeline, by a promotion.
    let standby = base_backup(&source, "ledger-dump-source2", "-R", "hot_standby = on");
    drop(s);
    source.pg_ctl("stop -m fast -w -t 60");
    let mut s = promote_alone(&standby);
    sql(&mut s, "CREATE DATABASE app");
    let mut app = standby.connect_to("app");
    sql(&mut app, "CREATE EXTENSION lockext");
    let seen = grant_many(&mut app, "d", 5);
    sql(
        &mut app,
        &format!(
            "SELECT lockext.fence('res', {})",
            seen.last().expect("a token")
        ),
    );
    let file = standby.dir.join("app.dump");
    pg_dump(&standby, "app", &file);
    println!(
        "Restore into another cluster: dumped {seen:?} (eras {:?})",
        eras(&seen)
    );

    let target = Cluster::start("ledger-dump-target", "");
    let mut t = target.connect();
    let before = grant_many(&mut t, "target", 1);
    createdb(&target, "app");
    pg_restore(&target, "app", &file, "");
    let mut ta = target.connect_to("app");
    let after = grant_many(&mut ta, "after", 3);
    let other_db = grant_many(&mut t, "target-after", 1);
    println!(
        "Restore into another cluster: the target had {before:?}; after the restore {after:?} \
         (eras {:?}), in its other database {other_db:?}",
        eras(&after)
    );
    checks.above(
        "the restored database's grants, against the dump's",
        &after,
        &seen,
    );
    checks.above("and against the target's own", &after, &before);
    checks.above(
        "the target's other database, against its own earlier grants",
        &other_db,
        &before,
    );
    let (dumped_era, new_era) = (era_of(seen[0]), era_of(after[0]));
    checks.check(
        new_era >= dumped_era + 2,
        format!("the new era {new_era} passes the dumped era {dumped_era} by two or more"),
    );
    let accepted: bool = ta
        .query_one(
            "SELECT lockext.fenced_update('res', $1, '{}'::jsonb)",
            &[&after[0]],
        )
        .map(|r| r.get(0))
        .unwrap_or(false);
    checks.check(
        accepted,
        "the restored resource accepts the new holder's token".to_string(),
    );
    checks.finish();
}

/// The attack pass on 0.4.0's first design: a dump from another cluster restored here, a
/// restore point after the restore and before lockext adopted the dump's history (its
/// first grant; the reaper here serves another database only, to hold that point open),
/// then grants in the adopted era and a restart (the counter starts again at its
/// reservation). Recovered to that point, the new server adopts the same history on its
/// later timeline: it must land above the old timeline's grants, not in the same era with
/// the same counters. 0.4.0's first design raised the era to the dump's plus two on the
/// current timeline, and the recovered server, one timeline later, took the same era.
#[test]
fn a_recovery_between_a_restore_and_its_adoption_lands_above_the_adopted_era() {
    let mut checks = Checks::new("PITR between a restore and its adoption");
    let source = Cluster::start("ledger-adopt-source", "");
    let mut s = source.connect();
    sql(&mut s, "CREATE DATABASE app");
    let mut sa = source.connect_to("app");
    sql(&mut sa, "CREATE EXTENSION lockext");
    let mut seen = grant_many(&mut sa, "source", 3);
    let file = source.dir.join("app.dump");
    pg_dump(&source, "app", &file);
    drop((s, sa));
    source.pg_ctl("stop -m fast -w -t 60");

    let arch = PathBuf::from(format!(
        "/tmp/lockext-tests/ledger-adopt-archive-{}",
        std::process::id()
    ));
    postgres_dir(&arch);
    let _arch_guard = RemoveOnDrop(arch.clone());
    let conf = format!(
        "archive_mode = on\narchive_command = 'test ! -f {0}/%f && cp %p {0}/%f'\n\
         lockext.database = 'postgres'\n",
        arch.display()
    );
    let target = Cluster::start("ledger-adopt-target", &conf);
    let mut t = target.connect();
    seen.extend(grant_many(&mut t, "target", 2));
    let backup = base_backup(&target, "ledger-adopt-base", "", "");
    createdb(&target, "app");
    pg_restore(&target, "app", &file, "");
    sql(&mut t, "SELECT pg_create_restore_point('restored')");
    let mut ta = target.connect_to("app");
    seen.extend(grant_many(&mut ta, "adopted", 3));
    drop((t, ta));
    let mut t = restart(&target);
    let mut ta = target.connect_to("app");
    seen.extend(grant_many(&mut ta, "after-restart", 3));
    seen.extend(grant_many(&mut t, "other-db", 2));
    let segment: String = t
        .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
        .unwrap()
        .get(0);
    eventually(WITHIN, &format!("the target archives {segment}"), || {
        t.query_one(
            "SELECT coalesce(last_archived_wal >= $1, false) FROM pg_stat_archiver",
            &[&segment],
        )
        .ok()?
        .get::<_, bool>(0)
        .then_some(())
    });
    println!("Adoption: tokens {seen:?} (eras {:?})", eras(&seen));
    drop((t, ta));
    target.pg_ctl("stop -m fast -w -t 60");

    let copy = copy_of(
        &backup,
        "ledger-adopt-pitr",
        &format!(
            "restore_command = 'cp {}/%f %p'\nrecovery_target_name = 'restored'\n\
             recovery_target_action = 'promote'\n",
            arch.display()
        ),
    );
    as_postgres(&format!("touch {}/recovery.signal", copy.data().display()));
    copy.pg_ctl("start -w -t 60");
    let mut c = wait_for_primary(&copy, WITHIN);
    let tl = timeline(&mut c);
    let mut ca = copy.connect_to("app");
    let mut after = grant_many(&mut ca, "recovered-app", 3);
    after.extend(grant_many(&mut c, "recovered-other", 2));
    println!(
        "Recovered to the restore point (timeline {tl}): {after:?} (eras {:?})",
        eras(&after)
    );
    checks.above(
        "recovered between the restore and its adoption, against every token before",
        &after,
        &seen,
    );
    checks.in_range("recovered", &after);
    checks.finish();
}

/// A copy of the base backup `backup` (not started), as a cluster of its own.
fn copy_of(backup: &Cluster, name: &str, extra_conf: &str) -> Cluster {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
        l.local_addr().expect("local addr").port()
    };
    let dir = PathBuf::from(format!("/tmp/lockext-tests/{name}-{port}"));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create the copy's dir");
    std::process::Command::new("cp")
        .args(["-a"])
        .arg(backup.data())
        .arg(dir.join("data"))
        .status()
        .expect("cp -a");
    std::process::Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(&dir)
        .status()
        .expect("chown");
    let conf = dir.join("data/postgresql.conf");
    let mut text = fs::read_to_string(&conf).expect("read postgresql.conf");
    text.push_str(&format!(
        "\n# {name}\nport = {port}\nunix_socket_directories = '{}'\n{extra_conf}\n",
        dir.display()
    ));
    fs::write(&conf, text).expect("write postgresql.conf");
    Cluster {
        name: name.to_string(),
        port,
        dir,
    }
}

/// Every restore point of a history with reinstalls, new databases and a database dropped
/// and made again between them: recovered to each point from one base backup and promoted
/// (as an asynchronous standby that missed everything after that point would be), the new
/// server's tokens are above every token the primary handed out, before the point and
/// after it. The third review found PITR to a point before a new database's first grants
/// handing those tokens out again.
#[test]
fn recovery_to_every_restore_point_hands_out_no_token_again() {
    let mut checks = Checks::new("PITR to every restore point");
    let arch = PathBuf::from(format!(
        "/tmp/lockext-tests/ledger-pitr-archive-{}",
        std::process::id()
    ));
    postgres_dir(&arch);
    let _arch_guard = RemoveOnDrop(arch.clone());
    let archive_conf = format!(
        "archive_mode = on\narchive_command = 'test ! -f {0}/%f && cp %p {0}/%f'\n",
        arch.display()
    );
    let primary = Cluster::start("ledger-pitr-primary", &archive_conf);
    let mut p = primary.connect();
    let mut seen = grant_many(&mut p, "g0", 2);
    let backup = base_backup(&primary, "ledger-pitr-base", "", "");

    // (restore point, what happened before it). Each step's grants are acknowledged.
    let mut points: Vec<(String, Vec<&str>)> = Vec::new();
    let mut point = |p: &mut Client, name: &str, dbs: Vec<&'static str>| {
        sql(p, &format!("SELECT pg_create_restore_point('{name}')"));
        points.push((name.to_string(), dbs));
    };
    point(&mut p, "rp0", vec!["postgres"]);
    seen.extend(grant_many(&mut p, "g1", 2));
    point(&mut p, "rp1", vec!["postgres"]);
    sql(&mut p, "CREATE DATABASE px");
    let mut px = primary.connect_to("px");
    sql(&mut px, "CREATE EXTENSION lockext");
    point(&mut p, "rp2", vec!["postgres", "px"]);
    seen.extend(grant_many(&mut px, "x1", 3));
    point(&mut p, "rp3", vec!["postgres", "px"]);
    sql(&mut p, "DROP EXTENSION lockext; CREATE EXTENSION lockext");
    point(&mut p, "rp4", vec!["postgres", "px"]);
    seen.extend(grant_many(&mut p, "g2", 2));
    point(&mut p, "rp5", vec!["postgres", "px"]);
    drop(px);
    sql(&mut p, "DROP DATABASE px WITH (FORCE); CREATE DATABASE px");
    let mut px = primary.connect_to("px");
    sql(&mut px, "CREATE EXTENSION lockext");
    seen.extend(grant_many(&mut px, "x2", 2));
    point(&mut p, "rp6", vec!["postgres", "px"]);
    seen.extend(grant_many(&mut p, "g3", 3));
    seen.extend(grant_many(&mut px, "x3", 3));
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
    println!(
        "PITR: the primary's tokens {seen:?} (eras {:?})",
        eras(&seen)
    );
    drop(px);
    drop(p);
    primary.pg_ctl("stop -m fast -w -t 60");

    for (name, dbs) in &points {
        let copy = copy_of(
            &backup,
            &format!("ledger-pitr-{name}"),
            &format!(
                "restore_command = 'cp {}/%f %p'\nrecovery_target_name = '{name}'\n\
                 recovery_target_action = 'promote'\n",
                arch.display()
            ),
        );
        as_postgres(&format!("touch {}/recovery.signal", copy.data().display()));
        copy.pg_ctl("start -w -t 60");
        let mut c = wait_for_primary(&copy, WITHIN);
        let tl = timeline(&mut c);
        let mut after = Vec::new();
        for db in dbs {
            let mut d = copy.connect_to(db);
            after.extend(grant_many(&mut d, &format!("after-{name}"), 2));
        }
        println!(
            "PITR to {name} (timeline {tl}): {after:?} (eras {:?})",
            eras(&after)
        );
        checks.above(
            &format!("recovered to {name}, against every token of the primary"),
            &after,
            &seen,
        );
        checks.in_range(&format!("recovered to {name}"), &after);
    }
    checks.finish();
}

/// Finding 5: `pg_resetwal -f` after a crash throws away the WAL after the last
/// checkpoint, with the reservations of the counter in it; 0.3.0 then handed out
/// acknowledged tokens again. The ledger's file is written before any token under a new
/// reservation is handed out, and pg_resetwal leaves it alone.
#[test]
fn pg_resetwal_after_a_crash_hands_out_no_token_again() {
    let mut checks = Checks::new("pg_resetwal");
    let cluster = Cluster::start("ledger-resetwal", CALM_CONF);
    let mut c = cluster.connect();
    sql(&mut c, "CHECKPOINT");
    // Past several reservations, all after the checkpoint.
    let seen: Vec<i64> = c
        .query(
            "SELECT (lockext.lock_acquire('r-' || g, 'o', '1 minute')).fence_token \
               FROM generate_series(1, 3000) g",
            &[],
        )
        .expect("3000 grants")
        .iter()
        .map(|r| r.get(0))
        .collect();
    drop(c);
    kill_server(&cluster);
    // As an operator would after a crash that left the server unable to start: the killed
    // server's lock file goes first.
    as_postgres(&format!(
        "rm -f {0}/postmaster.pid && {PG_BIN}/pg_resetwal -f {0}",
        cluster.data().display()
    ));
    let mut c = restart_after_crash(&cluster);
    let after = grant_many(&mut c, "after", 3);
    println!(
        "pg_resetwal: highest before {:?}, after {after:?}",
        seen.iter().max()
    );
    checks.above(
        "after pg_resetwal -f, against every acknowledged token",
        &after,
        &seen,
    );
    checks.finish();
}

/// Finding 4: a role with CREATEDB spent an era per `CREATE DATABASE` from a template
/// with lockext, until none was left. A database copied from a template is not a new
/// history: it counts on the cluster's counter, in the era in force.
#[test]
fn creating_databases_from_a_template_spends_no_era() {
    let mut checks = Checks::new("CREATEDB");
    let cluster = Cluster::start("ledger-createdb", "");
    let mut c = cluster.connect();
    sql(
        &mut c,
        "CREATE ROLE burner LOGIN CREATEDB;
         GRANT lockext_user TO burner",
    );
    let mut t1 = cluster.connect_to("template1");
    sql(&mut t1, "CREATE EXTENSION lockext");
    drop(t1);
    let first = grant_many(&mut c, "first", 1);
    let era_before: i32 = c
        .query_one("SELECT era FROM lockext.token_era()", &[])
        .unwrap()
        .get(0);
    let mut seen = first.clone();
    let url = |db: &str| {
        format!(
            "host=127.0.0.1 port={} user=burner dbname={db} connect_timeout=10",
            cluster.port
        )
    };
    let mut b = Client::connect(&url("postgres"), NoTls).expect("connect as burner");
    for i in 0..5 {
        let db = format!("burn_{i}");
        sql(&mut b, &format!("CREATE DATABASE {db}"));
        let mut in_db = Client::connect(&url(&db), NoTls).expect("connect to the copy");
        let (layout, era): (i32, i32) = {
            let row = in_db
                .query_one("SELECT layout, era FROM lockext.token_era()", &[])
                .expect("token_era as burner");
            (row.get(0), row.get(1))
        };
        let t = grant_many(&mut in_db, "burn", 1);
        drop(in_db);
        sql(&mut b, &format!("DROP DATABASE {db} WITH (FORCE)"));
        checks.check(
            layout == 2 && era == era_before,
            format!("copy {i}: era {era} (layout {layout}), the era in force is {era_before}"),
        );
        checks.above(&format!("copy {i}'s grant"), &t, &seen);
        seen.extend(t);
    }
    let era_after: i32 = c
        .query_one("SELECT era FROM lockext.token_era()", &[])
        .unwrap()
        .get(0);
    checks.check(
        era_after == era_before,
        format!("the era in force is still {era_before} after five copies ({era_after})"),
    );
    checks.finish();
}

/// Without preload there is no ledger (no WAL resource manager, no shared memory): a grant
/// is refused with 55000 and a hint naming the setting, instead of a token that no WAL
/// carries.
#[test]
fn without_preload_no_token_is_handed_out() {
    let mut checks = Checks::new("No preload");
    let cluster = Cluster::start("ledger-nopreload", "shared_preload_libraries = ''");
    let mut c = cluster.connect();
    let err = c
        .query_one("SELECT lockext.lock_acquire('np', 'o', '1 minute')", &[])
        .expect_err("a grant without preload");
    let db = err.as_db_error().expect("a server error");
    checks.check(
        db.code().code() == "55000" && db.hint().unwrap_or("").contains("shared_preload_libraries"),
        format!(
            "refused with {} {:?} (hint {:?})",
            db.code().code(),
            db.message(),
            db.hint()
        ),
    );
    let left: i64 = count(&mut c, "SELECT count(*) FROM lockext.locks");
    checks.check(left == 0, format!("no lease was written ({left})"));
    checks.finish();
}

/// A cluster that ran 0.3.0 has `pg_lockext/eras` (its eras, by layout) and no ledger: the
/// first start of this library takes the ledger from it, so that the next token is above
/// every era 0.3.0 used in any database (a database dropped since included).
#[test]
fn a_cluster_upgraded_from_0_3_0_starts_above_its_eras() {
    let mut checks = Checks::new("0.3.0's eras");
    let cluster = Cluster::start("ledger-eras-0-3", "");
    let mut c = cluster.connect();
    let before = grant_many(&mut c, "before", 2);
    drop(c);
    cluster.pg_ctl("stop -m fast -w -t 60");
    // As 0.3.0 left it: no ledger, its record of eras (era 7 used by a database that is
    // gone now).
    let dir = cluster.data().join("pg_lockext");
    fs::remove_file(dir.join("ledger")).expect("remove the ledger");
    fs::write(
        dir.join("eras"),
        "lockext-eras 1\nmax 2 7\ndb 99999 2 1 1 16400 7\n",
    )
    .expect("write 0.3.0's record");
    std::process::Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(&dir)
        .status()
        .expect("chown");
    cluster.pg_ctl("start -w -t 60");
    let mut c = cluster.connect();
    let after = grant_many(&mut c, "after", 2);
    println!(
        "0.3.0's eras: before {before:?}, after {after:?} (eras {:?})",
        eras(&after)
    );
    checks.check(
        era_of(after[0]) == 8,
        format!(
            "the first era above 0.3.0's highest (7): {}",
            era_of(after[0])
        ),
    );
    checks.above("after, against before", &after, &before);
    checks.finish();
}

/// 0.3.0 keyed a history by the oid of the token sequence, and a reused oid (forced with
/// `pg_resetwal -o`) revived an old history. Nothing is keyed by an oid now: a reinstall
/// whose objects take oids from the last one's range (the oid counter set back to where
/// the first installation started) still counts on.
#[test]
fn a_reinstall_with_reused_oids_hands_out_no_token_again() {
    let mut checks = Checks::new("OID reuse");
    let cluster = Cluster::start("ledger-oids", CALM_CONF);
    let mut c = cluster.connect();
    // The next oid the extension's script will take, then the extension made from there.
    sql(&mut c, "DROP EXTENSION lockext");
    let next: u32 = {
        sql(&mut c, "CREATE TABLE probe ()");
        let o: u32 = c
            .query_one("SELECT 'probe'::regclass::oid", &[])
            .unwrap()
            .get(0);
        sql(&mut c, "DROP TABLE probe");
        o + 1
    };
    sql(&mut c, "CREATE EXTENSION lockext");
    // Every oid the first installation's objects had.
    let first_oids: Vec<u32> = c
        .query(
            "SELECT objid FROM pg_depend WHERE deptype = 'e' AND refobjid = \
               (SELECT oid FROM pg_extension WHERE extname = 'lockext')",
            &[],
        )
        .expect("the extension's objects")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let before = grant_many(&mut c, "before", 3);
    sql(&mut c, "DROP EXTENSION lockext; CHECKPOINT");
    drop(c);
    // The oid counter back to where the first installation started.
    cluster.pg_ctl("stop -m fast -w -t 60");
    as_postgres(&format!(
        "{PG_BIN}/pg_resetwal -o {next} {}",
        cluster.data().display()
    ));
    cluster.pg_ctl("start -w -t 60");
    let mut c = cluster.connect();
    sql(&mut c, "CREATE EXTENSION lockext");
    let (epoch_oid, seq_oid): (u32, u32) = {
        let row = c
            .query_one(
                "SELECT 'lockext.token_epoch'::regclass::oid, 'lockext.fence_token_seq'::regclass::oid",
                &[],
            )
            .expect("the new objects' oids");
        (row.get(0), row.get(1))
    };
    let after = grant_many(&mut c, "after", 3);
    let highest_first = first_oids.iter().copied().max().unwrap_or(0);
    println!(
        "OID reuse: the first installation's oids up to {highest_first}; the reinstall's \
         epoch table {epoch_oid}, sequence {seq_oid}; before {before:?}, after {after:?}"
    );
    checks.check(
        epoch_oid <= highest_first && seq_oid <= highest_first,
        format!(
            "the reinstall's epoch table ({epoch_oid}) and sequence ({seq_oid}) took oids in \
             the first installation's range (up to {highest_first}): the scenario means something"
        ),
    );
    checks.above("after the reinstall with reused oids", &after, &before);
    checks.finish();
}

/// `pg_upgrade` (here from PostgreSQL 15 to 15: the same steps as between major versions)
/// makes a new cluster: a new system identifier, timeline 1, relations copied, no WAL and
/// no `pg_lockext/ledger`. The old cluster was on a later timeline (a failover, so a
/// higher era). Upgraded twice from the same old cluster: once as docs/upgrading.md says
/// (the ledger's file copied into the new data directory), once without it (each
/// database's evidence adopted). Either way every new token is above every old one.
#[test]
fn pg_upgrade_keeps_every_token_below_the_next() {
    let mut checks = Checks::new("pg_upgrade");
    let first = Cluster::start("ledger-pgup-first", "");
    // A failover first: the old cluster's era is the timeline's (2), above 0.
    let old = base_backup(&first, "ledger-pgup-old", "-R", "");
    drop(first);
    let mut c = promote_alone(&old);
    sql(&mut c, "CREATE DATABASE app");
    let mut app = old.connect_to("app");
    sql(&mut app, "CREATE EXTENSION lockext");
    let mut seen = grant_many(&mut c, "old", 3);
    seen.extend(grant_many(&mut app, "old-app", 3));
    sql(
        &mut app,
        &format!("SELECT lockext.fence('res', {})", seen[5]),
    );
    drop((c, app));
    old.pg_ctl("stop -m fast -w -t 60");
    println!(
        "pg_upgrade: the old cluster's tokens {seen:?} (eras {:?})",
        eras(&seen)
    );

    for copy_ledger in [true, false] {
        let tag = if copy_ledger { "copied" } else { "adopted" };
        let new = Cluster::init_with_env(&format!("ledger-pgup-new-{tag}"), "", &[]);
        pg_upgrade(&old, PG_BIN.path(), &new, copy_ledger);
        new.pg_ctl("start -w -t 60");
        let mut c = new.connect();
        let mut app = new.connect_to("app");
        let tl = timeline(&mut c);
        let after_app = grant_many(&mut app, &format!("new-app-{tag}"), 3);
        let after = grant_many(&mut c, &format!("new-{tag}"), 3);
        println!(
            "pg_upgrade, ledger {tag}: timeline {tl}; app {after_app:?}, postgres {after:?} (eras {:?})",
            eras(&after_app)
        );
        checks.above(
            &format!("ledger {tag}: app, against every old token"),
            &after_app,
            &seen,
        );
        checks.above(
            &format!("ledger {tag}: postgres, against every old token"),
            &after,
            &seen,
        );
        let accepted: bool = app
            .query_one(
                "SELECT lockext.fenced_update('res', $1, '{}'::jsonb)",
                &[&after_app[0]],
            )
            .map(|r| r.get(0))
            .unwrap_or(false);
        checks.check(
            accepted,
            format!("ledger {tag}: the fenced resource takes the new holder's write"),
        );
        let stale = app
            .query_one("SELECT lockext.fence('res', $1)", &[&seen[5]])
            .is_err();
        checks.check(
            stale,
            format!("ledger {tag}: and refuses the old holder's token"),
        );
        checks.in_range(&format!("ledger {tag}"), &after);
    }
    checks.finish();
}

/// The attack pass on the ledger: a hot standby's backends read timeline 0, and a fence
/// check there (refused with 25006) first loaded the ledger on timeline 0, which moved its
/// era base up by the timeline; the next replayed record wrote that into the file, and a
/// standby restarted and checked again and again spent an era each time. Then a promotion
/// after a crash: records of the old timeline replayed over a file of the new one moved the
/// base up by two. Neither may spend an era: only timelines and adoptions do.
#[test]
fn a_standby_and_a_crash_after_a_promotion_spend_no_era() {
    let mut checks = Checks::new("No era spent");
    let primary = Cluster::start("ledger-spend-primary", "");
    let mut p = primary.connect();
    let mut seen = grant_many(&mut p, "first", 1);
    let standby = base_backup(&primary, "ledger-spend-standby", "-R", "hot_standby = on");
    for round in 0..2 {
        // A new server each round: its ledger not yet read when the check comes.
        standby.pg_ctl(if round == 0 {
            "start -w -t 60"
        } else {
            "restart -w -t 60"
        });
        let mut s = standby.reconnect(WITHIN);
        let refused = s.query_one("SELECT lockext.check_token(1)", &[]);
        let code = refused
            .as_ref()
            .err()
            .and_then(|e| e.code())
            .map(|c| c.code().to_string());
        checks.check(
            code.as_deref() == Some("25006"),
            format!("round {round}: a fence check on the standby is refused with 25006 ({code:?})"),
        );
        // Enough grants for a new reservation record, replayed by the standby.
        let more: Vec<i64> = p
            .query(
                "SELECT (lockext.lock_acquire('s' || $1::int || '-' || g, 'o', '1 hour')).fence_token \
                   FROM generate_series(1, 1100) g",
                &[&round],
            )
            .expect("grants")
            .iter()
            .map(|r| r.get(0))
            .collect();
        seen.extend(more);
        let lsn: String = p
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .unwrap()
            .get(0);
        wait_for_replay(&mut s, &lsn, WITHIN);
    }
    let on_standby = ledger_file(&standby);
    checks.check(
        on_standby.contains("\nbase 0\n"),
        format!("the standby's ledger keeps base 0: {on_standby:?}"),
    );
    // Promoted with its checkpointer stopped (no restartpoint past the old timeline's
    // records), a grant on the new timeline, then a crash: the records are replayed again.
    drop(p);
    primary.pg_ctl("stop -m fast -w -t 60");
    {
        let _frozen = freeze(&standby, "checkpointer");
        standby.pg_ctl("promote -w -t 60");
        let mut s = wait_for_primary(&standby, WITHIN);
        seen.extend(grant_many(&mut s, "promoted", 2));
        drop(s);
        kill_server(&standby);
    }
    let mut s = restart_after_crash(&standby);
    let era: i32 = s
        .query_one("SELECT era FROM lockext.token_era()", &[])
        .expect("token_era")
        .get(0);
    let after = grant_many(&mut s, "after-crash", 2);
    println!(
        "No era spent: after the crash era {era}, tokens {after:?}; ledger {:?}",
        ledger_file(&standby)
    );
    checks.check(
        era == 1,
        format!("timeline 2 is era 1 after the crash ({era})"),
    );
    checks.above("after the crash", &after, &seen);
    checks.finish();
}

/// The attack pass: at the end of the era space, a member's `token_era()` recorded era 4096
/// in the epoch row, and adopting that row switched the whole cluster to 0.2.0's layout
/// (tokens above 2^53). The end is an error, 2200H, for a grant and for `token_era()`
/// alike, and nothing is recorded.
#[test]
fn the_end_of_the_era_space_is_an_error_never_a_wider_layout() {
    let mut checks = Checks::new("Era space end");
    let cluster = Cluster::start("ledger-era-end", "");
    let mut c = cluster.connect();
    sql(
        &mut c,
        "CREATE ROLE member LOGIN; GRANT lockext_user TO member",
    );
    grant_many(&mut c, "first", 1);
    drop(c);
    cluster.pg_ctl("stop -m fast -w -t 60");
    // Era 4096 on timeline 1: one past the last.
    set_ledger(&cluster, "base", 4096);
    cluster.pg_ctl("start -w -t 60");
    let member = format!(
        "host=127.0.0.1 port={} user=member dbname=postgres connect_timeout=10",
        cluster.port
    );
    let mut m = Client::connect(&member, NoTls).expect("connect as member");
    for (what, q) in [
        ("token_era()", "SELECT era FROM lockext.token_era()"),
        (
            "a grant",
            "SELECT fence_token FROM lockext.lock_acquire('end', 'o', '1 minute')",
        ),
    ] {
        let code = m
            .query_one(q, &[])
            .err()
            .and_then(|e| e.code().map(|c| c.code().to_string()));
        checks.check(
            code.as_deref() == Some("2200H"),
            format!("{what} at era 4096 fails with 2200H ({code:?})"),
        );
    }
    let mut c = cluster.connect();
    let recorded: Option<i32> = c
        .query_one("SELECT (SELECT epoch FROM lockext.token_epoch)", &[])
        .unwrap()
        .get(0);
    checks.check(
        recorded.is_none_or(|e| e < 4096),
        format!("no era past the end was recorded ({recorded:?})"),
    );
    let file = ledger_file(&cluster);
    checks.check(
        file.contains("\nlayout 2\n"),
        format!("the ledger keeps the safe layout: {file:?}"),
    );
    checks.finish();
}
