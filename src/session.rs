//! Session-bound leases (ZooKeeper's ephemeral nodes): a lease that also ends when the
//! backend that took it exits, whatever the reason, with its TTL still the upper bound.
//!
//! A session-bound lease records its backend as the pid and the backend's start time (pids
//! are reused). Two things end it:
//! - the backend itself, on its way out (`before_shmem_exit`, as PostgreSQL drops a
//!   session's temporary tables): a normal close, `pg_terminate_backend`, a client that
//!   died (the backend reads end-of-file from the socket) all come through here;
//! - the reaper, for a backend that could not (it crashed, and with it the server's
//!   shared memory): each round it deletes session-bound leases whose backend is gone.
//!
//! Behind a transaction-pooling PgBouncer a server session serves many clients and outlives
//! them, so "the session" means nothing; `lockext.session_leases = off` refuses them there.

use std::cell::Cell;
use std::ffi::c_int;

use pgrx::pg_sys::BuiltinOid::*;
use pgrx::prelude::*;

use crate::backend;
use crate::error::LockError;
use crate::settings;
use crate::statements::Statement;
use crate::text::TextBuf;
use crate::xact::in_transaction;

static END_MINE: Statement = Statement {
    sql: include_str!("../sql/run/session/end_mine.sql"),
    params: &[INT4OID, TIMESTAMPTZOID, BOOLOID],
};

static EXIT_SETTINGS: Statement = Statement {
    sql: include_str!("../sql/run/session/exit_settings.sql"),
    params: &[],
};

thread_local! {
    // Whether this backend has taken a session-bound lease (and so has its exit hook).
    static BOUND: Cell<bool> = const { Cell::new(false) };
}

/// The session a lease asked to be bound to: this backend's start time, to be recorded with
/// its pid. Only a check: nothing changes until a bound lease is granted (`bind`).
pub fn this_session() -> Result<TimestampWithTimeZone, LockError> {
    if !settings::SESSION_LEASES.get() {
        return Err(LockError::SessionLeasesOff);
    }
    backend::started()
}

/// Makes sure this backend ends its session-bound leases when it exits: call once a bound
/// lease is granted.
pub fn bind() {
    if !BOUND.get() {
        unsafe { pg_sys::before_shmem_exit(Some(end_at_exit), pg_sys::Datum::from(0)) };
        BOUND.set(true);
    }
}

/// The exit hook: ends this backend's session-bound leases in a transaction of its own,
/// as the superuser (the session's role may not write lockext's tables). A failure is
/// only logged: the reaper ends what is left.
#[pg_guard]
unsafe extern "C-unwind" fn end_at_exit(_code: c_int, _arg: pg_sys::Datum) {
    unsafe { pg_sys::AbortOutOfAnyTransaction() };
    let ended = in_transaction(|| {
        unsafe {
            pg_sys::SetUserIdAndSecContext(
                pg_sys::Oid::from(pg_sys::BOOTSTRAP_SUPERUSERID),
                pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
            )
        };
        Spi::connect_mut(|client| {
            EXIT_SETTINGS.run(client, &[])?;
            let args = [
                backend::pid().into(),
                backend::started().ok().into(),
                settings::NOTIFY.get().into(),
            ];
            let rows = END_MINE.run(client, &args)?;
            for row in rows {
                if let Some(lock_id) = row.get::<TextBuf>(1)? {
                    crate::wait::wake_head_at_commit(lock_id.as_text());
                }
            }
            Ok(())
        })
    });
    if let Err(message) = ended {
        // Leases whose session is gone are due now (no expiry covers them).
        crate::status::publish(backend::clock());
        warning!(
            "lockext: could not end this session's leases at exit ({message}); the reaper will"
        );
    }
}
