//! What a client sees of an error: lockext's message, detail and hint, never a Rust
//! backtrace, whatever `RUST_BACKTRACE` says in the server's environment (an error raised
//! by PostgreSQL inside a lockext call comes back through Rust, and pgrx would add the
//! backtrace it captured on the way to the error's DETAIL).

use std::fs;
use std::os::unix::fs::PermissionsExt;

use lockext_cluster_tests::*;
use postgres::error::{DbError, SqlState};

/// The error `sql` ends with, as the server sent it.
fn error_of(c: &mut Client, sql: &str) -> DbError {
    let e = c.batch_execute(sql).expect_err(sql);
    e.as_db_error()
        .unwrap_or_else(|| panic!("{sql}: not an error of the server: {e}"))
        .clone()
}

/// No line of a Rust backtrace in any field of the error.
fn assert_no_backtrace(e: &DbError, what: &str) {
    let fields = [Some(e.message()), e.detail(), e.hint(), e.where_()];
    for text in fields.into_iter().flatten() {
        assert!(
            !text.contains("   0: ") && !text.contains("std::") && !text.contains("pgrx"),
            "{what}: a Rust backtrace reached the client: {text}"
        );
    }
}

#[test]
fn no_rust_backtrace_reaches_a_client_with_rust_backtrace_set() {
    let cluster = Cluster::start_with_env(
        "errors-detail",
        "",
        &[("RUST_BACKTRACE", "1"), ("RUST_LIB_BACKTRACE", "1")],
    );
    let mut c = cluster.connect();

    // lockext's own error: its message and hint, no detail.
    let e = error_of(&mut c, "SELECT lockext.lock_acquire('x', 'o', '2 days')");
    assert_eq!(e.code(), &SqlState::INVALID_PARAMETER_VALUE);
    assert_eq!(e.detail(), None, "{e:?}");
    assert_no_backtrace(&e, "22023");

    // 58030 raised inside a grant (the token is minted inside the grant's statement): the
    // token ledger's file cannot be understood. A fresh cluster's first grant reads it; the
    // file is removed afterwards (a cluster that never granted a token has none).
    let dir = cluster.data().join("pg_lockext");
    fs::create_dir_all(&dir).unwrap();
    let eras = dir.join("ledger");
    fs::write(&eras, "not a ledger\n").unwrap();
    fs::set_permissions(&eras, fs::Permissions::from_mode(0o644)).unwrap();
    let chown = std::process::Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(chown.success());
    let mut fresh = cluster.connect();
    let e = error_of(
        &mut fresh,
        "SELECT lockext.lock_acquire('first', 'o', '1 minute')",
    );
    assert_eq!(e.code(), &SqlState::IO_ERROR, "{e:?}");
    assert_eq!(e.detail(), None, "58030: {e:?}");
    assert_no_backtrace(&e, "58030");
    fs::remove_file(&eras).unwrap();

    // A statement cancelled while it waits in lock_acquire: PostgreSQL's error, raised
    // inside lockext's wait, as PostgreSQL wrote it.
    c.batch_execute("SELECT lockext.lock_acquire('held', 'a', '1 minute')")
        .unwrap();
    let mut waiter = cluster.connect();
    let e = error_of(
        &mut waiter,
        "SET statement_timeout = '300ms'; \
         SELECT lockext.lock_acquire('held', 'b', '1 minute', wait => '1 minute')",
    );
    assert_eq!(e.code(), &SqlState::QUERY_CANCELED);
    assert_eq!(e.detail(), None, "cancelled: {e:?}");
    assert_no_backtrace(&e, "57014");
}
