//! Fencing tokens against the events that can make a counter repeat itself, through real
//! clients: crashes at a known point (the WAL writer stopped with SIGSTOP, the whole
//! server killed with kill -9), a set whose subtransaction rolled back, a token read in a
//! transaction that never committed, restores over the same database and into a new one,
//! reinstalling the extension, and wrappers that turn `synchronous_commit` off.
//!
//! The contract, tested only through SQL: every token is in 1..=2^53-1 (a JavaScript
//! Number holds it exactly), and every grant after an event is strictly higher than every
//! token any client saw before it. Each test prints the numbers it compares, checks them
//! all, and then fails with the list of what did not hold.

use lockext_cluster_tests::checks::*;
use lockext_cluster_tests::crash::*;
use lockext_cluster_tests::*;

/// After a new boot, a set's first grant records the boot's new epoch
/// in the set's subtransaction, and a later grant of the same set sees that uncommitted
/// record; the set is refused and rolls back, and the record with it. An implementation
/// that trusted what it saw then mints later grants under an epoch that is on disk
/// nowhere, asynchronously (`epoch` durability, `synchronous_commit = off`); after a crash
/// the restart raises to that same epoch again, and the lost counter values repeat.
#[test]
fn an_epoch_recorded_by_a_rolled_back_set_is_not_trusted() {
    let mut checks = Checks::new("rolled-back set");
    let cluster = Cluster::start("tokens-rolled-back-set", CALM_CONF);
    let mut c = cluster.connect();
    // Held by another owner across the restart, so that the set is refused after it, and
    // the set's grants are the first of the new boot.
    let mut seen = vec![grant(&mut c, "zz", "other")];
    seen.extend(grant_many(&mut c, "early", 3));
    drop(c);

    let mut c = restart(&cluster);
    let set = c
        .query(
            "SELECT * FROM lockext.lock_acquire_all(ARRAY['a','b','zz'], 'o', '1 hour')",
            &[],
        )
        .expect("lock_acquire_all");
    checks.check(
        set.is_empty(),
        format!("the set is refused ({} rows)", set.len()),
    );
    let taken = count(
        &mut c,
        "SELECT count(*) FROM lockext.locks WHERE lock_id IN ('a', 'b')",
    );
    checks.check(
        taken == 0,
        format!("nothing of the refused set is held ({taken} leases)"),
    );

    c.batch_execute("SET lockext.durability = epoch; SET synchronous_commit = off")
        .expect("epoch durability, asynchronous commits");
    let _walwriter = stop_walwriter(&cluster);
    let before = grant_many(&mut c, "async", 40);
    seen.extend(&before);
    let wal_at_crash = wal(&mut c);
    println!(
        "rolled-back set: 40 asynchronous grants {}..={} (highest {}); at the crash: {wal_at_crash}",
        before[0],
        before[39],
        before.iter().max().unwrap()
    );
    checks.check(
        wal_at_crash.unwritten() > 0,
        format!(
            "the crash loses WAL ({} bytes not written): the scenario means something",
            wal_at_crash.unwritten()
        ),
    );
    drop(c);

    let mut c = kill_and_restart(&cluster);
    let survivors = count(
        &mut c,
        "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'async-%'",
    );
    println!("rolled-back set: {survivors} of the 40 asynchronous grants survived the crash");
    let after = grant_many(&mut c, "after", 10);
    println!("rolled-back set: grants after the crash {after:?}");
    checks.above("after the crash", &after, &seen);
    seen.extend(&after);
    checks.in_range("every token", &seen);
    checks.finish();
}

/// A client reads a token inside a transaction that it has not committed yet, with
/// `synchronous_commit = off` and the WAL writer stopped: nothing of that transaction is
/// written when the server is killed. The token was seen all the same, so no later grant
/// may get it or anything below it. The grant is the first of its boot (after a clean
/// restart), so its epoch is not recorded yet and the sequence logs anew.
#[test]
fn a_token_seen_in_an_open_transaction_is_never_repeated_after_a_crash() {
    let mut checks = Checks::new("open transaction");
    let cluster = Cluster::start("tokens-open-xact", CALM_CONF);
    let mut c = cluster.connect();
    let mut seen = grant_many(&mut c, "early", 3);
    drop(c);

    let mut c = restart(&cluster);
    c.batch_execute("SET synchronous_commit = off").unwrap();
    let _walwriter = stop_walwriter(&cluster);
    c.batch_execute("BEGIN").unwrap();
    let t = grant(&mut c, "open", "client");
    seen.push(t);
    let wal_at_crash = wal(&mut c);
    println!("open transaction: token {t} read, not committed; at the crash: {wal_at_crash}");
    // The client is killed with the server, its transaction still open.
    kill_server(&cluster);
    drop(c);

    let mut c = restart_after_crash(&cluster);
    let open = count(
        &mut c,
        "SELECT count(*) FROM lockext.locks WHERE lock_id = 'open'",
    );
    println!("open transaction: its lease after the crash: {open} (never committed)");
    let after = grant_many(&mut c, "after", 10);
    println!("open transaction: grants after the crash {after:?}");
    checks.above("after the crash", &after, &[t]);
    checks.above("after the crash, against all seen", &after, &seen);
    seen.extend(&after);
    checks.in_range("every token", &seen);
    checks.finish();
}

/// A dump taken after three grants is restored over the same database after three more:
/// the sequence (and every table of lockext) goes back to the dump, in the same database
/// of the same running server. The next grant must beat the three grants the dump does
/// not know of, in a session that was open across the restore and in a new one.
#[test]
fn restore_into_the_same_database_never_repeats_tokens() {
    let mut checks = Checks::new("restore over the same database");
    let cluster = Cluster::start("tokens-restore-same", "");
    let mut c = cluster.connect();
    let mut seen = grant_many(&mut c, "before-dump", 3);
    let dump = cluster.dir.join("d.dump");
    pg_dump(&cluster, "postgres", &dump);
    let newer = grant_many(&mut c, "after-dump", 3);
    println!("restore over the same database: in the dump {seen:?}, after it {newer:?}");
    seen.extend(&newer);

    pg_restore(&cluster, "postgres", &dump, "--clean --if-exists");
    let kept = count(
        &mut c,
        "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'before-dump-%'",
    );
    let gone = count(
        &mut c,
        "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'after-dump-%'",
    );
    checks.check(
        kept == 3 && gone == 0,
        format!(
            "the restore brought back the dump's state ({kept} leases of the dump, {gone} newer)"
        ),
    );

    let same_session = grant(&mut c, "restored-1", "client");
    let mut fresh = cluster.connect();
    let new_session = grant(&mut fresh, "restored-2", "client");
    println!(
        "restore over the same database: next grant {same_session} (open session), then {new_session} (new session)"
    );
    checks.above("next grant, open session", &[same_session], &seen);
    seen.push(same_session);
    checks.above("next grant, new session", &[new_session], &seen);
    seen.push(new_session);
    checks.in_range("every token", &seen);
    checks.finish();
}

/// DROP EXTENSION and CREATE EXTENSION start lockext's tables and sequence afresh, on a
/// server that has been minting all along. Twice over.
#[test]
fn reinstalling_the_extension_never_repeats_tokens() {
    let mut checks = Checks::new("reinstall");
    let cluster = Cluster::start("tokens-reinstall", "");
    let mut c = cluster.connect();
    let mut seen = grant_many(&mut c, "first", 3);
    for round in 1..=2 {
        c.batch_execute("DROP EXTENSION lockext CASCADE; CREATE EXTENSION lockext")
            .expect("reinstall lockext");
        let same_session = grant(&mut c, &format!("round{round}-a"), "client");
        let mut fresh = cluster.connect();
        let new_session = grant(&mut fresh, &format!("round{round}-b"), "client");
        let more = grant_many(&mut fresh, &format!("round{round}-more"), 3);
        println!(
            "reinstall {round}: highest before {}, next grant {same_session} (open session), \
             {new_session} (new session), then {more:?}",
            seen.iter().max().unwrap()
        );
        checks.above(
            &format!("reinstall {round}, open session"),
            &[same_session],
            &seen,
        );
        seen.push(same_session);
        checks.above(
            &format!("reinstall {round}, new session"),
            &[new_session],
            &seen,
        );
        seen.push(new_session);
        checks.above(&format!("reinstall {round}, later grants"), &more, &seen);
        seen.extend(&more);
    }
    checks.in_range("every token", &seen);
    checks.finish();
}

/// A dump D1 of an older state, restored over a database whose history went on past it
/// (the extension reinstalled and more grants made): the dump's epoch record and sequence
/// are behind what was handed out since. Then D1 restored into a new database of the same
/// cluster: its grants must beat every token of the original database too.
#[test]
fn restoring_an_old_dump_over_a_newer_state_never_repeats_tokens() {
    let mut checks = Checks::new("old dump over newer state");
    let cluster = Cluster::start("tokens-old-dump", "");
    let mut c = cluster.connect();
    let mut seen = grant_many(&mut c, "d1", 3);
    let d1 = cluster.dir.join("d1.dump");
    pg_dump(&cluster, "postgres", &d1);

    c.batch_execute("DROP EXTENSION lockext CASCADE; CREATE EXTENSION lockext")
        .expect("reinstall lockext");
    let newer = grant_many(&mut c, "newer", 5);
    println!("old dump: in D1 {seen:?}; the newer history after a reinstall {newer:?}");
    seen.extend(&newer);

    pg_restore(&cluster, "postgres", &d1, "--clean --if-exists");
    let kept = count(
        &mut c,
        "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'd1-%'",
    );
    let gone = count(
        &mut c,
        "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'newer-%'",
    );
    checks.check(
        kept == 3 && gone == 0,
        format!("D1's state is back ({kept} leases of D1, {gone} newer)"),
    );
    let same_session = grant(&mut c, "restored-1", "client");
    let mut fresh = cluster.connect();
    let new_session = grant_many(&mut fresh, "restored-2", 3);
    println!(
        "old dump: after restoring D1 over the newer state: {same_session} (open session), {new_session:?} (new session)"
    );
    checks.above("after restoring D1, open session", &[same_session], &seen);
    seen.push(same_session);
    checks.above("after restoring D1, new session", &new_session, &seen);
    seen.extend(&new_session);

    createdb(&cluster, "newdb");
    pg_restore(&cluster, "newdb", &d1, "");
    let mut n = cluster.connect_to("newdb");
    let in_newdb = grant_many(&mut n, "newdb", 3);
    println!(
        "old dump: D1 restored into newdb: {in_newdb:?}; highest of the original database {}",
        seen.iter().max().unwrap()
    );
    checks.above("D1 restored into a new database", &in_newdb, &seen);
    seen.extend(&in_newdb);
    checks.in_range("every token", &seen);
    checks.finish();
}

/// One way of granting: the lock it takes, what it does, and the call (returns the token).
type Way = (&'static str, &'static str, fn(&mut Client) -> i64);

/// Hole 3. With the default durability (`grant`) every acknowledged grant survives a
/// crash, whatever turns `synchronous_commit` off around it: a function's SET clause
/// (which confines any SET LOCAL made inside the function to the function), or a SET LOCAL
/// after the grant in the same transaction. Each way is one grant, made with the WAL
/// writer stopped, the server killed right after its COMMIT returned.
#[test]
fn a_wrapper_that_turns_synchronous_commit_off_cannot_lose_a_grant() {
    let mut checks = Checks::new("wrapper turns synchronous_commit off");
    let cluster = Cluster::start("tokens-wrapper", CALM_CONF);
    let mut c = cluster.connect();
    c.batch_execute(
        "CREATE FUNCTION public.take(l text) RETURNS bigint LANGUAGE sql \
         SET synchronous_commit = off \
         AS $$ SELECT (lockext.lock_acquire(l, 'o', '1 hour')).fence_token $$",
    )
    .expect("create the wrapper");
    let mut seen = grant_many(&mut c, "early", 3);

    let ways: [Way; 3] = [
        (
            "wrapped-on",
            "SELECT public.take(l) in a session with synchronous_commit = on",
            |c| {
                c.batch_execute("SET synchronous_commit = on").unwrap();
                c.query_one("SELECT public.take('wrapped-on')", &[])
                    .expect("take")
                    .get(0)
            },
        ),
        (
            "wrapped-off",
            "SELECT public.take(l) in a session with synchronous_commit = off",
            |c| {
                c.batch_execute("SET synchronous_commit = off").unwrap();
                c.query_one("SELECT public.take('wrapped-off')", &[])
                    .expect("take")
                    .get(0)
            },
        ),
        (
            "set-local",
            "BEGIN; lock_acquire; SET LOCAL synchronous_commit = off; COMMIT",
            |c| {
                c.batch_execute("SET synchronous_commit = on").unwrap();
                c.batch_execute("BEGIN").unwrap();
                let t: i64 = c
                    .query_one(
                        "SELECT (lockext.lock_acquire('set-local', 'o', '1 hour')).fence_token",
                        &[],
                    )
                    .expect("lock_acquire")
                    .get(0);
                c.batch_execute("SET LOCAL synchronous_commit = off; COMMIT")
                    .unwrap();
                t
            },
        ),
    ];
    for (lock, how, take) in ways {
        let _walwriter = stop_walwriter(&cluster);
        let token = take(&mut c);
        let wal_at_crash = wal(&mut c);
        println!("wrapper: {how}: token {token}; at the crash: {wal_at_crash}");
        seen.push(token);
        drop(c);
        c = kill_and_restart(&cluster);
        let row: Option<i64> = c
            .query_opt(
                "SELECT fence_token FROM lockext.locks WHERE lock_id = $1",
                &[&lock],
            )
            .expect("read the lease")
            .map(|r| r.get(0));
        checks.check(
            row == Some(token),
            format!("{how}: the grant of {lock} survives the crash (row after restart: {row:?}, granted {token})"),
        );
        let next = grant(&mut c, &format!("{lock}-next"), "client");
        checks.above(
            &format!("{how}: next grant after the crash"),
            &[next],
            &seen,
        );
        seen.push(next);
    }
    checks.in_range("every token", &seen);
    checks.finish();
}
