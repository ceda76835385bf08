//! Adoption shared by a server's backends (src/adopted.rs), on real clusters: a new
//! connection's first grant takes the server's record that its database's token evidence
//! was adopted instead of reading every lease again, but only while nothing changed that
//! evidence. Each way something other than lockext's own statements can change it is
//! tested here: a restore stopped in the middle of its transaction (a real `pg_restore`,
//! held at its last table by a lock), one that commits table by table (`-j`), a prepared
//! transaction, a database made again under the oid of a dropped one, a logical
//! replication worker. In each, the first grant of a connection made after the change must
//! be above every token the change wrote; and a connection made while nothing changed must
//! not read the evidence again (`token_evidence_reads` in `lockext.stats`), or the record
//! would be a test that cannot fail. Then the attack pass's findings on the first design,
//! each as it was found: a connection whose own uncommitted delete hid a lease, a trigger a
//! superuser put on a lease table, a table inheriting from one, the schema renamed and back
//! in one transaction, a commit visible before its raise (held there with gdb), and a
//! token of the era in force within the reservation (older than the shared record: the
//! counter was not moved past it).

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use lockext_cluster_tests::checks::*;
use lockext_cluster_tests::crash::*;
use lockext_cluster_tests::gdb::Gdb;
use lockext_cluster_tests::*;

const WITHIN: Duration = Duration::from_secs(60);

/// No reaper: its rounds adopt too, and would make the counts of evidence read by the
/// tests' connections depend on when a round ran.
const NO_REAPER: &str = "lockext.database = ''";

fn evidence_reads(c: &mut Client) -> i64 {
    count(
        c,
        "SELECT coalesce((SELECT value FROM lockext.stats \
         WHERE name = 'token_evidence_reads'), 0)::bigint",
    )
}

/// The first grant of a new connection to `db`: its token, and how many times the server
/// read token evidence while it ran (`watch` is a connection that stays open).
fn first_grant(cluster: &Cluster, db: &str, lock: &str, watch: &mut Client) -> (i64, i64) {
    let before = evidence_reads(watch);
    let mut c = cluster.connect_to(db);
    let token = grant(&mut c, lock, "first");
    drop(c);
    (token, evidence_reads(watch) - before)
}

/// A token from another history, above any this test's clusters hand out on their own:
/// era 9 of the safe layout.
fn foreign_token(counter: i64) -> i64 {
    (9_i64 << 41) + counter
}

/// A row of lockext.locks as a restore or a hand-made INSERT would write it.
fn insert_foreign(c: &mut Client, lock: &str, token: i64) {
    c.execute(
        "INSERT INTO lockext.locks (lock_id, owner, fence_token, holder_role, acquired_at, \
         expires_at) VALUES ($1, 'elsewhere', $2, 10, now(), now() + interval '1 hour')",
        &[&lock, &token],
    )
    .expect("insert a foreign lease");
}

/// A real `pg_restore --single-transaction --section=data` of a dump from another cluster,
/// held at its last table (`lockext.token_floor`, locked here in SHARE mode) after it wrote
/// the leases and the epoch row. The installation was adopted before the data came, empty
/// (`lockext.check_token`, which adopts and writes nothing, as the reaper's rounds do), and
/// that adoption is recorded; the restore commits, and the first grant of the next new
/// connection must be above every dumped token. Then the same restore run in parallel
/// (`-j 2`, each table committing on its own), held the same way: the first grant once the
/// leases' table committed, before the restore ends, must already be above them.
#[test]
fn a_restore_stopped_midway_is_adopted_by_the_first_grant_after_its_commit() {
    let mut checks = Checks::new("Restore stopped mid-way");
    let source = Cluster::start("adopt-restore-source", "");
    let mut s = source.connect();
    sql(&mut s, "CREATE DATABASE app");
    let mut app = source.connect_to("app");
    sql(&mut app, "CREATE EXTENSION lockext");
    // A source further along than the target: its tokens are above the target's.
    let dumped = grant_many(&mut app, "dumped", 40);
    drop(app);
    let file = source.dir.join("app.dump");
    pg_dump(&source, "app", &file);

    let target = Cluster::start("adopt-restore-target", NO_REAPER);
    let mut watch = target.connect();
    let (mine, _) = first_grant(&target, "postgres", "mine", &mut watch);
    for (variant, db, args) in [
        ("single transaction", "app_s", "--single-transaction"),
        ("parallel", "app_j", "-j 2"),
    ] {
        createdb(&target, db);
        // The schema and the extension first (committed), so that the data's last table
        // can be locked before the data is restored.
        pg_restore(&target, db, &file, "--section=pre-data");
        let adopt_empty = |watch: &mut Client| {
            let before = evidence_reads(watch);
            let mut c = target.connect_to(db);
            let _ = c.batch_execute("SELECT lockext.check_token(1)");
            drop(c);
            evidence_reads(watch) - before
        };
        let first = adopt_empty(&mut watch);
        let again = adopt_empty(&mut watch);
        checks.check(
            first == 1 && again == 0,
            format!(
                "{variant}: the empty installation's evidence was read {first} time(s) by the \
                 first connection (1), {again} by the next (0)"
            ),
        );
        let mut holder = target.connect_to(db);
        sql(
            &mut holder,
            "BEGIN; LOCK TABLE lockext.token_floor IN SHARE MODE",
        );
        let (port, path, db_name, restore_args) = (
            target.port,
            file.clone(),
            db.to_string(),
            format!("--section=data {args}"),
        );
        let restore = thread::spawn(move || {
            as_postgres(&format!(
                "{PG_BIN}/pg_restore --exit-on-error {restore_args} -h 127.0.0.1 -p {port} -U postgres \
                 -d {db_name} {}",
                path.display()
            ))
        });
        let mut w = target.connect_to(db);
        eventually(WITHIN, "the restore waits for lockext.token_floor", || {
            let waiting = count(
                &mut w,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query ILIKE '%token_floor%'",
            );
            (waiting > 0).then_some(())
        });
        if args.contains("-j") {
            // Each other table commits on its own: once the leases and the epoch row are
            // there for anyone, so are they for the next connection's first grant.
            eventually(
                WITHIN,
                "the dumped leases and epoch row are committed",
                || {
                    let there = count(
                    &mut w,
                    "SELECT (SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'dumped-%') \
                     + (SELECT count(*) FROM lockext.token_epoch)",
                );
                    (there == dumped.len() as i64 + 1).then_some(())
                },
            );
            let (during, reads) = first_grant(&target, db, "during", &mut watch);
            println!("{variant}: during the restore, a new connection got {during} (read the evidence {reads} times)");
            checks.above(
                &format!("{variant}: a grant after the leases' table committed"),
                &[during],
                &dumped,
            );
        }
        sql(&mut holder, "COMMIT");
        restore.join().expect("pg_restore");
        let (after, reads) = first_grant(&target, db, "after", &mut watch);
        println!(
            "{variant}: after the restore {after} (read the evidence {reads} times); the \
             target's own {mine}; dumped {:?}..{:?}",
            dumped.first(),
            dumped.last()
        );
        checks.above(
            &format!("{variant}: the first grant after the restore"),
            &[after],
            &dumped,
        );
        checks.check(
            reads == 1,
            format!("{variant}: it read the evidence {reads} time(s) (1: the restore changed it)"),
        );
        checks.above(
            &format!("{variant}: and the target's own"),
            &[after],
            &[mine],
        );
        let (_, reads) = first_grant(&target, db, "settled", &mut watch);
        checks.check(
            reads == 0,
            format!(
                "{variant}: once adopted, a new connection read the evidence {reads} times (0)"
            ),
        );
    }
    checks.finish();
}

/// A transaction that wrote a lease with a higher token is prepared: it becomes visible at
/// its `COMMIT PREPARED`, which no commit of that transaction's own announces. A new
/// connection while it is prepared must not record an adoption that the commit would
/// make stale.
#[test]
fn a_prepared_write_is_adopted_by_the_first_grant_after_commit_prepared() {
    let mut checks = Checks::new("Prepared write");
    let cluster = Cluster::start(
        "adopt-prepared",
        &format!("{NO_REAPER}\nmax_prepared_transactions = 4"),
    );
    let mut watch = cluster.connect();
    let (before, _) = first_grant(&cluster, "postgres", "before", &mut watch);
    let (_, reads) = first_grant(&cluster, "postgres", "unchanged", &mut watch);
    checks.check(
        reads == 0,
        format!("with nothing changed, a new connection read the evidence {reads} times (0)"),
    );
    let mut writer = cluster.connect();
    sql(&mut writer, "BEGIN");
    let theirs = foreign_token(77);
    insert_foreign(&mut writer, "prepared", theirs);
    sql(&mut writer, "PREPARE TRANSACTION 'restore'");
    let (during, during_reads) = first_grant(&cluster, "postgres", "during", &mut watch);
    sql(&mut writer, "COMMIT PREPARED 'restore'");
    let (after, _) = first_grant(&cluster, "postgres", "after", &mut watch);
    println!("before {before}, during {during}, after COMMIT PREPARED {after}; theirs {theirs}");
    checks.above("the first grant after COMMIT PREPARED", &[after], &[theirs]);
    checks.check(
        during_reads == 1,
        format!("while prepared, a new connection read the evidence {during_reads} time(s) (1)"),
    );
    checks.finish();
}

/// A database dropped and made again from the same template under the same oid (`CREATE
/// DATABASE ... OID`, which pg_upgrade uses) has the same epoch table oid: the server's
/// record of the dropped one must not serve the new one, whose template was written since.
#[test]
fn a_database_made_again_under_a_dropped_ones_oid_reads_its_evidence() {
    let mut checks = Checks::new("Database oid reused");
    let cluster = Cluster::start("adopt-oid", NO_REAPER);
    let mut c = cluster.connect();
    sql(&mut c, "CREATE DATABASE tpl");
    let mut t = cluster.connect_to("tpl");
    sql(&mut t, "CREATE EXTENSION lockext");
    drop(t);
    sql(
        &mut c,
        "ALTER DATABASE tpl IS_TEMPLATE true ALLOW_CONNECTIONS true",
    );
    let tpl_oid = count(
        &mut c,
        "SELECT oid::bigint FROM pg_database WHERE datname = 'tpl'",
    );
    // An oid whose generation is not the template's (they share one per oid modulo 64).
    let oid = 70_000 + i64::from((tpl_oid % 64) == (70_000 % 64));
    sql(&mut c, &format!("CREATE DATABASE a OID {oid} TEMPLATE tpl"));
    let (first, _) = first_grant(&cluster, "a", "first", &mut c);
    let (_, reads) = first_grant(&cluster, "a", "unchanged", &mut c);
    checks.check(
        reads == 0,
        format!("with nothing changed, a new connection read the evidence {reads} times (0)"),
    );
    sql(&mut c, "DROP DATABASE a WITH (FORCE)");
    let mut t = cluster.connect_to("tpl");
    let theirs = foreign_token(5);
    insert_foreign(&mut t, "in-the-template", theirs);
    drop(t);
    sql(&mut c, &format!("CREATE DATABASE b OID {oid} TEMPLATE tpl"));
    let (after, reads) = first_grant(&cluster, "b", "after", &mut c);
    println!(
        "database oid {oid}: first {first}; made again from the written template: {after} (read \
         the evidence {reads} times); theirs {theirs}"
    );
    checks.above(
        "the first grant in the database made again",
        &[after],
        &[theirs],
    );
    checks.finish();
}

/// A logical replication worker writes leases that another database published: it runs no
/// statement of the executor that lockext could see, so its commits change the evidence.
#[test]
fn leases_written_by_logical_replication_are_adopted_by_the_next_first_grant() {
    let mut checks = Checks::new("Logical replication");
    let cluster = Cluster::start(
        "adopt-logical",
        &format!("{NO_REAPER}\nwal_level = logical"),
    );
    let mut c = cluster.connect();
    sql(&mut c, "CREATE DATABASE pub; CREATE DATABASE sub");
    let mut p = cluster.connect_to("pub");
    sql(
        &mut p,
        "CREATE EXTENSION lockext;
         CREATE PUBLICATION leases FOR TABLE lockext.locks;
         SELECT pg_create_logical_replication_slot('leases', 'pgoutput')",
    );
    let mut s = cluster.connect_to("sub");
    sql(&mut s, "CREATE EXTENSION lockext");
    let (before, _) = first_grant(&cluster, "sub", "before", &mut c);
    let (_, reads) = first_grant(&cluster, "sub", "unchanged", &mut c);
    checks.check(
        reads == 0,
        format!("with nothing changed, a new connection read the evidence {reads} times (0)"),
    );
    sql(
        &mut s,
        &format!(
            "CREATE SUBSCRIPTION leases CONNECTION 'host=127.0.0.1 port={} user=postgres \
             dbname=pub' PUBLICATION leases WITH (create_slot = false, slot_name = 'leases', \
             copy_data = false)",
            cluster.port
        ),
    );
    eventually(WITHIN, "the subscription streams", || {
        let streaming = count(
            &mut c,
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'leases' AND active",
        );
        (streaming > 0).then_some(())
    });
    let theirs = foreign_token(321);
    insert_foreign(&mut p, "replicated", theirs);
    eventually(WITHIN, "the lease reaches the subscriber", || {
        let there = count(
            &mut s,
            "SELECT count(*) FROM lockext.locks WHERE lock_id = 'replicated'",
        );
        (there > 0).then_some(())
    });
    let (after, reads) = first_grant(&cluster, "sub", "after", &mut c);
    println!(
        "before {before}; after the replicated lease {after} (read the evidence {reads} times); \
         theirs {theirs}"
    );
    checks.above(
        "the first grant after the replicated lease",
        &[after],
        &[theirs],
    );
    checks.finish();
}

/// The entry of `db`'s installation is recorded and in use: a first connection reads the
/// evidence, the next reads nothing.
fn recorded(cluster: &Cluster, db: &str, watch: &mut Client, checks: &mut Checks, what: &str) {
    let (_, first) = first_grant(cluster, db, &format!("{what}-record"), watch);
    let (_, next) = first_grant(cluster, db, &format!("{what}-use"), watch);
    checks.check(
        next == 0,
        format!("{what}: before it, a new connection read the evidence {next} times (0; the one before {first})"),
    );
}

/// Attack pass, finding 1: a connection whose first grant ran after its own transaction
/// deleted a lease (uncommitted, then rolled back) read evidence without that lease. Its
/// adoption must not be recorded for others.
#[test]
fn a_connection_whose_own_changes_hide_a_lease_records_nothing() {
    let mut checks = Checks::new("Own changes");
    let cluster = Cluster::start("adopt-own", NO_REAPER);
    let mut watch = cluster.connect();
    let theirs = foreign_token(11);
    insert_foreign(&mut watch, "hidden", theirs);
    let mut x = cluster.connect();
    sql(
        &mut x,
        "BEGIN; DELETE FROM lockext.locks WHERE lock_id = 'hidden'",
    );
    let mine = grant(&mut x, "inside", "x");
    sql(&mut x, "ROLLBACK");
    drop(x);
    let (after, _) = first_grant(&cluster, "postgres", "after", &mut watch);
    println!(
        "inside the deleting transaction {mine}; the next connection {after}; theirs {theirs}"
    );
    checks.above("the next connection's first grant", &[after], &[theirs]);
    checks.finish();
}

/// Attack pass, finding 3: a trigger a superuser put on lockext.locks, which writes a higher
/// token into lockext.resources whenever lockext's own statement inserts a lease. While the
/// trigger's function is not lockext's, schema lockext is not as the extension made it and
/// no record serves anyone; once a superuser adds the function to the extension, the
/// record is used again, and the trigger's write, inside lockext's statement, is still
/// seen as not lockext's (only the statement's first permission check is its own).
#[test]
fn a_trigger_on_a_lease_table_writes_as_itself_not_as_lockext() {
    let mut checks = Checks::new("Trigger on a lease table");
    let cluster = Cluster::start("adopt-trigger", NO_REAPER);
    let mut watch = cluster.connect();
    recorded(&cluster, "postgres", &mut watch, &mut checks, "trigger");
    let theirs = foreign_token(22);
    watch
        .batch_execute(&format!(
            "CREATE FUNCTION public.evil() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             INSERT INTO lockext.resources (resource_id, fence_token, updated_at) \
             VALUES ('evil-' || NEW.lock_id, {theirs}, now()); RETURN NULL; END $$; \
             CREATE TRIGGER evil AFTER INSERT ON lockext.locks FOR EACH ROW \
             EXECUTE FUNCTION public.evil()"
        ))
        .expect("create the trigger");
    let (_, unmade) = first_grant(&cluster, "postgres", "unmade", &mut watch);
    let (_, unmade_next) = first_grant(&cluster, "postgres", "unmade-next", &mut watch);
    checks.check(
        unmade == 1 && unmade_next == 1,
        format!("with a trigger of another function on a lease table, every new connection reads the evidence ({unmade}, {unmade_next}; 1 each)"),
    );
    let (after_unmade, _) = first_grant(&cluster, "postgres", "after-unmade", &mut watch);
    checks.above(
        "the first grant after that trigger's writes",
        &[after_unmade],
        &[theirs],
    );
    // Above what the reads so far adopted, so that only a read after its write passes it.
    let theirs_now = (20_i64 << 41) + 22;
    watch
        .batch_execute(&format!(
            "ALTER EXTENSION lockext ADD FUNCTION public.evil(); \
             CREATE OR REPLACE FUNCTION public.evil() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN INSERT INTO lockext.resources (resource_id, fence_token, updated_at) \
             VALUES ('evil-' || NEW.lock_id, {theirs_now}, now()); RETURN NULL; END $$"
        ))
        .expect("make the function the extension's");
    // Adopted again by a connection that writes nothing: the grant that fires the trigger
    // then uses the record, and only the trigger's write can make it stale.
    let mut c = cluster.connect();
    let _ = c.batch_execute("SELECT lockext.check_token(1)");
    drop(c);
    let (fired, fired_reads) = first_grant(&cluster, "postgres", "fires", &mut watch);
    checks.check(
        fired_reads == 0,
        format!("the function the extension's now: the grant that fired the trigger used the record (read {fired_reads} times, 0)"),
    );
    let written = count(
        &mut watch,
        "SELECT count(*) FROM lockext.resources WHERE resource_id = 'evil-fires'",
    );
    checks.check(
        written == 1,
        format!("the trigger wrote its row ({written})"),
    );
    let (after, reads) = first_grant(&cluster, "postgres", "after", &mut watch);
    println!("the grant that fired it {fired}; the next {after} (read {reads} times); theirs {theirs_now}");
    checks.above(
        "the first grant after the trigger's write",
        &[after],
        &[theirs_now],
    );
    checks.check(
        reads == 1,
        format!("it read the evidence {reads} time(s) (1)"),
    );
    checks.finish();
}

/// Second attack pass: a relation put in place of an evidence table by a superuser, whose
/// rows are written through another relation (a view over a table of another schema), or
/// by no statement at all (`CREATE TABLE ... AS`), after the installation's adoption was
/// recorded.
#[test]
fn a_relation_put_in_place_of_a_lease_table_is_not_the_extensions() {
    let mut checks = Checks::new("Replaced evidence table");
    for variant in ["view", "table as"] {
        let cluster = Cluster::start(
            &format!("adopt-replaced-{}", variant.replace(' ', "-")),
            NO_REAPER,
        );
        let mut watch = cluster.connect();
        recorded(&cluster, "postgres", &mut watch, &mut checks, variant);
        let theirs = foreign_token(66);
        if variant == "view" {
            sql(
                &mut watch,
                "BEGIN; ALTER EXTENSION lockext DROP TABLE lockext.keepalives;
                 ALTER TABLE lockext.keepalives RENAME TO keepalives_old;
                 CREATE TABLE public.evil (keepalive bigint);
                 CREATE VIEW lockext.keepalives AS SELECT keepalive FROM public.evil; COMMIT",
            );
            recorded_or_not(&cluster, &mut watch, &mut checks, variant);
            watch
                .execute("INSERT INTO public.evil VALUES ($1)", &[&theirs])
                .expect("write through the other relation");
        } else {
            sql(
                &mut watch,
                "BEGIN; ALTER EXTENSION lockext DROP TABLE lockext.keepalives;
                 ALTER TABLE lockext.keepalives RENAME TO keepalives_old; COMMIT",
            );
            recorded_or_not(&cluster, &mut watch, &mut checks, variant);
            sql(
                &mut watch,
                &format!("CREATE TABLE lockext.keepalives AS SELECT {theirs}::bigint AS keepalive"),
            );
        }
        let (after, reads) = first_grant(&cluster, "postgres", "after", &mut watch);
        println!("{variant}: after {after} (read {reads} times); theirs {theirs}");
        checks.above(
            &format!("{variant}: the first grant after the write"),
            &[after],
            &[theirs],
        );
    }
    checks.finish();
}

/// Two new connections after a superuser's change to schema lockext: each reads the
/// evidence (the change was DDL, which made the record unusable, and the schema is not as
/// the extension made it, so no record is made again).
fn recorded_or_not(cluster: &Cluster, watch: &mut Client, checks: &mut Checks, what: &str) {
    let (_, first) = first_grant(cluster, "postgres", &format!("{what}-1"), watch);
    let (_, next) = first_grant(cluster, "postgres", &format!("{what}-2"), watch);
    checks.check(
        first == 1 && next == 1,
        format!("{what}: each new connection read the evidence ({first}, {next}; 1 each)"),
    );
}

/// Second attack pass: code a superuser put on lockext.locks that runs inside lockext's own
/// statements without a statement of its own: a BEFORE trigger that changes the token of
/// the row lockext inserts, and an index expression whose function writes while lockext's
/// read-only statement is planned (before its permission check); each put there after the
/// installation's adoption was recorded.
#[test]
fn code_on_a_lease_table_that_runs_inside_lockexts_statements_keeps_adoption_unshared() {
    let mut checks = Checks::new("Code inside lockext's statements");
    for variant in ["before trigger", "index expression"] {
        let cluster = Cluster::start(
            &format!("adopt-code-{}", variant.replace(' ', "-")),
            NO_REAPER,
        );
        let mut watch = cluster.connect();
        recorded(&cluster, "postgres", &mut watch, &mut checks, variant);
        let theirs = foreign_token(77);
        if variant == "before trigger" {
            watch
                .batch_execute(&format!(
                    "CREATE FUNCTION public.bump() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                     IF NEW.lock_id = 'bumped' THEN NEW.fence_token := {theirs}; END IF; \
                     RETURN NEW; END $$; \
                     CREATE TRIGGER bump BEFORE INSERT OR UPDATE ON lockext.locks \
                     FOR EACH ROW EXECUTE FUNCTION public.bump()"
                ))
                .expect("create the trigger");
            recorded_or_not(&cluster, &mut watch, &mut checks, variant);
            let mut c = cluster.connect();
            let got = grant(&mut c, "bumped", "x");
            checks.check(
                got == theirs,
                format!("{variant}: the trigger set the token ({got})"),
            );
        } else {
            watch
                .batch_execute(&format!(
                    "CREATE FUNCTION public.g() RETURNS int LANGUAGE plpgsql VOLATILE AS $$ BEGIN \
                     INSERT INTO lockext.resources (resource_id, fence_token, updated_at) \
                     VALUES ('planned-' || clock_timestamp(), {theirs}, now()); RETURN 0; END $$; \
                     CREATE FUNCTION public.f(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$ \
                     DECLARE y int; BEGIN \
                     IF current_setting('adopt.arm', true) = 'on' THEN \
                     PERFORM set_config('adopt.arm', 'off', false); y := public.g(); END IF; \
                     RETURN $1; END $$; \
                     CREATE INDEX planned ON lockext.locks ((fence_token + public.f(1)))"
                ))
                .expect("create the index");
            recorded_or_not(&cluster, &mut watch, &mut checks, variant);
            let mut c = cluster.connect();
            let _ = c.batch_execute(
                "SET adopt.arm = 'on'; SELECT count(*) FROM lockext.lock_holders('zz')",
            );
            drop(c);
            let planned = count(
                &mut watch,
                "SELECT count(*) FROM lockext.resources WHERE resource_id LIKE 'planned-%'",
            );
            checks.check(
                planned == 1,
                format!("{variant}: the function wrote while lockext's statement was planned ({planned})"),
            );
        }
        let (after, reads) = first_grant(&cluster, "postgres", "after", &mut watch);
        println!("{variant}: after {after} (read {reads} times); theirs {theirs}");
        checks.above(
            &format!("{variant}: the first grant after it"),
            &[after],
            &[theirs],
        );
    }
    checks.finish();
}

/// Attack pass, finding 3: a table inheriting from lockext.locks, whose rows the evidence
/// reads (no ONLY), written by plain INSERTs into the child, which name only the child.
#[test]
fn a_table_inheriting_from_a_lease_table_keeps_adoption_unshared() {
    let mut checks = Checks::new("Inheritance");
    let cluster = Cluster::start("adopt-inherits", NO_REAPER);
    let mut watch = cluster.connect();
    recorded(&cluster, "postgres", &mut watch, &mut checks, "inherits");
    sql(
        &mut watch,
        "CREATE TABLE public.kid () INHERITS (lockext.locks)",
    );
    let (between, _) = first_grant(&cluster, "postgres", "between", &mut watch);
    let theirs = foreign_token(33);
    watch
        .execute(
            "INSERT INTO public.kid (lock_id, owner, fence_token, holder_role, acquired_at, \
             expires_at) VALUES ('kid', 'elsewhere', $1, 10, now(), now() + interval '1 hour')",
            &[&theirs],
        )
        .expect("insert into the child");
    let (after, reads) = first_grant(&cluster, "postgres", "after", &mut watch);
    println!(
        "between {between}; after the child's row {after} (read {reads} times); theirs {theirs}"
    );
    checks.above("the first grant after the child's row", &[after], &[theirs]);
    checks.check(
        reads == 1,
        format!("it read the evidence {reads} time(s) (1)"),
    );
    checks.finish();
}

/// Attack pass, finding 3: schema lockext renamed, a lease written under the other name,
/// the name given back, all in one transaction.
#[test]
fn the_schema_renamed_and_back_in_one_transaction_is_a_change() {
    let mut checks = Checks::new("Schema renamed");
    let cluster = Cluster::start("adopt-rename", NO_REAPER);
    let mut watch = cluster.connect();
    recorded(&cluster, "postgres", &mut watch, &mut checks, "rename");
    let theirs = foreign_token(44);
    sql(&mut watch, "BEGIN; ALTER SCHEMA lockext RENAME TO lx");
    watch
        .execute(
            "INSERT INTO lx.locks (lock_id, owner, fence_token, holder_role, acquired_at, \
             expires_at) VALUES ('renamed', 'elsewhere', $1, 10, now(), now() + interval '1 hour')",
            &[&theirs],
        )
        .expect("insert under the other name");
    sql(&mut watch, "ALTER SCHEMA lx RENAME TO lockext; COMMIT");
    let (after, _) = first_grant(&cluster, "postgres", "after", &mut watch);
    println!("after the round trip {after}; theirs {theirs}");
    checks.above("the first grant after the round trip", &[after], &[theirs]);
    checks.finish();
}

/// Attack pass, finding 2: a writer held with gdb right after its commit became visible
/// (`ProcArrayEndTransaction` returned) and before its transaction callbacks raised the
/// generation. Another session sees its lease; a new connection's first grant then must be
/// above it.
#[test]
fn a_commit_visible_before_its_raise_is_not_missed() {
    let mut checks = Checks::new("Commit visible, not yet raised");
    let cluster = Cluster::start("adopt-window", NO_REAPER);
    let mut watch = cluster.connect();
    recorded(&cluster, "postgres", &mut watch, &mut checks, "window");
    let theirs = foreign_token(55);
    let mut w = cluster.connect();
    sql(&mut w, "BEGIN");
    insert_foreign(&mut w, "window", theirs);
    let pid: i32 = w.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let mut gdb = Gdb::attach_and_break(pid, "ProcArrayEndTransaction");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let done = w.batch_execute("COMMIT").map_err(|e| e.to_string());
        let _ = tx.send(done);
    });
    gdb.wait_for_breakpoint(WITHIN);
    gdb.finish(WITHIN);
    let seen = count(
        &mut watch,
        "SELECT count(*) FROM lockext.locks WHERE lock_id = 'window'",
    );
    let (during, reads) = first_grant(&cluster, "postgres", "during", &mut watch);
    gdb.release();
    let committed = rx
        .recv_timeout(WITHIN)
        .expect("the writer's COMMIT never ended");
    println!("held after its commit became visible (seen: {seen}): a new connection got {during} (read {reads} times); theirs {theirs}");
    checks.check(
        seen == 1,
        format!("another session saw the held commit ({seen})"),
    );
    checks.check(
        committed.is_ok(),
        format!("the COMMIT ended: {committed:?}"),
    );
    checks.above(
        "a new connection's first grant in that window",
        &[during],
        &[theirs],
    );
    checks.finish();
}

/// Attack pass, finding 4 (older than the shared record): a token of the era in force,
/// above what this server handed out but within its reservation, written by hand (a
/// restore of another cluster's leases without their epoch row). The next grant must pass
/// it, not only the reservation.
#[test]
fn a_token_of_the_era_in_force_within_the_reservation_is_passed() {
    let mut checks = Checks::new("Within the reservation");
    let cluster = Cluster::start("adopt-reserved", NO_REAPER);
    let mut watch = cluster.connect();
    let (mine, _) = first_grant(&cluster, "postgres", "mine", &mut watch);
    let theirs = count(&mut watch, "SELECT lockext.highest_issued_token() + 5");
    insert_foreign(&mut watch, "in-era", theirs);
    let mut c = cluster.connect();
    let after = grant_many(&mut c, "after", 3);
    println!("mine {mine}; written {theirs}; then {after:?}");
    checks.check(
        era_of(theirs) == era_of(mine),
        format!(
            "the written token is of the era in force ({} and {})",
            era_of(theirs),
            era_of(mine)
        ),
    );
    checks.above("the grants after it", &after, &[theirs]);
    checks.finish();
}

/// Third attack pass: a superuser gives schema lockext to a role without superuser (so
/// row-level security applies to lockext's statements), turns it on for lockext.locks with
/// a policy that compares through an operator of its own, whose LEAKPROOF function writes
/// a lease: the planner estimates the operator on the column's most common values while
/// lockext's read-only look is planned, before its permission check. A member then plants
/// a token by a grant in a REPEATABLE READ transaction. No record may be made or used.
#[test]
fn a_policy_whose_operator_writes_while_planned_keeps_adoption_unshared() {
    let mut checks = Checks::new("Policy operator");
    let cluster = Cluster::start("adopt-policy", NO_REAPER);
    let mut watch = cluster.connect();
    recorded(&cluster, "postgres", &mut watch, &mut checks, "policy");
    let theirs = foreign_token(88);
    watch
        .batch_execute(&format!(
            "CREATE ROLE lkowner NOLOGIN;
             GRANT ALL ON ALL TABLES IN SCHEMA lockext TO lkowner;
             GRANT ALL ON ALL SEQUENCES IN SCHEMA lockext TO lkowner;
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lockext TO lkowner;
             GRANT USAGE, CREATE ON SCHEMA lockext TO lkowner;
             ALTER SCHEMA lockext OWNER TO lkowner;
             CREATE FUNCTION public.evil_op(text, text) RETURNS boolean LANGUAGE plpgsql
               SECURITY DEFINER LEAKPROOF SET search_path = pg_catalog AS $$
             DECLARE x text; BEGIN
               IF current_setting('adopt.plant', true) = 'on' THEN
                 x := set_config('adopt.plant', 'off', false);
                 INSERT INTO lockext.locks (lock_id, owner, fence_token, holder_role,
                   acquired_at, expires_at)
                 VALUES ('planted', 'o', {theirs}, 10, now(), now() + interval '1 hour');
               END IF;
               RETURN false; END $$;
             CREATE OPERATOR public.<<< (PROCEDURE = public.evil_op, LEFTARG = text,
               RIGHTARG = text, RESTRICT = eqsel);
             ALTER TABLE lockext.locks ENABLE ROW LEVEL SECURITY;
             CREATE POLICY sel ON lockext.locks FOR SELECT
               USING (NOT (owner OPERATOR(public.<<<) 'zz'));
             CREATE POLICY ins ON lockext.locks FOR INSERT WITH CHECK (true);
             CREATE POLICY upd ON lockext.locks FOR UPDATE USING (true);
             CREATE POLICY del ON lockext.locks FOR DELETE USING (true);
             CREATE ROLE atk LOGIN IN ROLE lockext_user"
        ))
        .expect("the superuser's set-up");
    for i in 0..6 {
        grant(&mut watch, &format!("mcv-{i}"), "o");
    }
    sql(&mut watch, "ANALYZE lockext.locks");
    recorded_or_not(&cluster, &mut watch, &mut checks, "policy");
    let mut atk = cluster.connect_as("atk", "postgres");
    let planted = atk.batch_execute(
        "BEGIN ISOLATION LEVEL REPEATABLE READ; SET adopt.plant = 'on'; \
         SELECT lockext.lock_acquire('atk-1', 'o', '10 seconds'); COMMIT",
    );
    drop(atk);
    let there = count(
        &mut watch,
        "SELECT count(*) FROM lockext.locks WHERE lock_id = 'planted'",
    );
    let (after, reads) = first_grant(&cluster, "postgres", "after", &mut watch);
    println!(
        "planted: {planted:?}, rows {there}; after {after} (read {reads} times); theirs {theirs}"
    );
    checks.check(
        there == 1,
        format!("the operator's function wrote its lease ({there})"),
    );
    checks.above(
        "the first grant after the planted lease",
        &[after],
        &[theirs],
    );
    checks.finish();
}
