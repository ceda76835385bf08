//! Durability where safety needs it: a grant's commit is flushed even in a session with
//! synchronous_commit = off; a transaction that only renews or releases commits without
//! waiting for a flush; one that also writes something else commits as the session asked.
//!
//! Observed through the WAL: with the WAL writer stopped (SIGSTOP) and no reaper, a commit
//! that did not flush leaves pg_current_wal_flush_lsn() behind the end of its own WAL. (Only
//! slowed down, the WAL writer still flushed at once when an asynchronous commit woke it
//! from hibernation, and a reaper round's ledger write flushes too: a renewal then looked
//! flushed, once in CI on 18.)

use lockext_cluster_tests::crash::stop_walwriter;
use lockext_cluster_tests::*;

/// Runs `sql` in one transaction on `c`, then reports whether the WAL it wrote was
/// flushed at commit (read from a second session at once). The position is taken inside
/// the transaction, so WAL that background processes write afterwards does not count.
fn flushed_at_commit(c: &mut Client, other: &mut Client, sql: &str) -> bool {
    c.batch_execute("BEGIN").unwrap();
    c.batch_execute(sql).unwrap();
    let written: String = c
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .unwrap()
        .get(0);
    c.batch_execute("COMMIT").unwrap();
    other
        .query_one(
            "SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn",
            &[&written],
        )
        .unwrap()
        .get(0)
}

#[test]
fn grants_flush_renewals_and_releases_alone_do_not() {
    let cluster = Cluster::start(
        "commit",
        "wal_writer_delay = '10s'\nwal_writer_flush_after = 0\nlockext.database = ''",
    );
    let mut c = cluster.connect();
    let mut other = cluster.connect();
    c.batch_execute(
        "CREATE TABLE t (v int); SELECT lockext.lock_acquire('warm-up', 'x', '1 minute')",
    )
    .unwrap();
    let _walwriter = stop_walwriter(&cluster);

    // A grant flushes, even asked not to.
    c.batch_execute("SET synchronous_commit = off").unwrap();
    assert!(flushed_at_commit(
        &mut c,
        &mut other,
        "SELECT lockext.lock_acquire('a', 'w', '1 minute')"
    ));
    // So does every other route that mints a token: the look and an insert (REPEATABLE
    // READ skips the free insert), a shared lease, a permit, a keep-alive.
    for grant in [
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; \
         SELECT lockext.lock_acquire('rr', 'w', '1 minute')",
        "SELECT lockext.lock_acquire('s', 'w', '1 minute', mode => 'shared')",
        "SELECT lockext.lock_acquire('p', 'w', '1 minute', permits => 2)",
        "SELECT lockext.lock_keepalive_grant()",
    ] {
        assert!(flushed_at_commit(&mut c, &mut other, grant), "{grant}");
    }
    c.batch_execute("RESET synchronous_commit").unwrap();
    // Renewals and releases alone do not wait for a flush, even in a synchronous session.
    assert!(!flushed_at_commit(
        &mut c,
        &mut other,
        "SELECT lockext.lock_renew('a', 'w', '1 minute')"
    ));
    assert!(!flushed_at_commit(
        &mut c,
        &mut other,
        "SELECT lockext.lock_release('a', 'w')"
    ));
    // With any other write in the transaction, before or after, the session's setting holds.
    c.batch_execute("SELECT lockext.lock_acquire('b', 'w', '1 minute')")
        .unwrap();
    assert!(flushed_at_commit(
        &mut c,
        &mut other,
        "SELECT lockext.lock_renew('b', 'w', '1 minute'); INSERT INTO t VALUES (1)"
    ));
    assert!(flushed_at_commit(
        &mut c,
        &mut other,
        "INSERT INTO t VALUES (2); SELECT lockext.lock_release('b', 'w')"
    ));
    // A release and a new grant in one transaction: the grant wins, the commit flushes.
    c.batch_execute("SELECT lockext.lock_acquire('c', 'w', '1 minute')")
        .unwrap();
    assert!(flushed_at_commit(
        &mut c,
        &mut other,
        "SELECT lockext.lock_release('c', 'w'); SELECT lockext.lock_acquire('d', 'w', '1 minute')"
    ));
}
