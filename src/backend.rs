//! This backend, as PostgreSQL's globals describe it, read in one place: its process, its
//! database, its start, its role, its transaction, and the server's clock. Everything else
//! asks here instead of reading `pg_sys` globals itself.

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::error::LockError;
use crate::pgversion;

/// This backend's process id.
pub fn pid() -> i32 {
    unsafe { pg_sys::MyProcPid }
}

/// This backend's slot in the server's process array (what a latch is set through).
pub fn procno() -> i32 {
    pgversion::procno()
}

/// The database this backend is connected to.
pub fn database() -> pg_sys::Oid {
    unsafe { pg_sys::MyDatabaseId }
}

/// When this backend started: with the pid, the name of one backend (pids are reused).
pub fn started() -> Result<TimestampWithTimeZone, LockError> {
    TimestampWithTimeZone::try_from(unsafe { pg_sys::MyStartTimestamp })
        .map_err(|_| LockError::ClockOutOfRange)
}

/// The current user: the role whose code is running now.
pub fn current_user() -> pg_sys::Oid {
    unsafe { pg_sys::GetUserId() }
}

/// This backend's number for its current transaction (not a transaction id: every
/// transaction has one, writing or not).
pub fn local_transaction() -> pg_sys::LocalTransactionId {
    pgversion::local_transaction()
}

/// Whether the transaction reads one snapshot throughout (REPEATABLE READ, SERIALIZABLE).
pub fn snapshot_per_transaction() -> bool {
    (unsafe { pg_sys::XactIsoLevel }) > pg_sys::XACT_READ_COMMITTED as i32
}

/// Whether the server is a hot standby (or still replaying WAL at start-up).
pub fn in_recovery() -> bool {
    unsafe { pg_sys::RecoveryInProgress() }
}

/// lockext writes on every call but lock_check-style reads; a standby cannot take writes,
/// and would otherwise fail deep inside with a message that names no lease.
pub fn writable_server() -> Result<(), LockError> {
    if in_recovery() {
        return Err(LockError::ReadOnlyServer);
    }
    Ok(())
}

/// The server's clock now, in PostgreSQL's microseconds: what `clock_timestamp()` reads.
pub fn clock() -> pg_sys::TimestampTz {
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// The server's clock now, as a timestamptz. Never the transaction's start (`now()`), which
/// inside a long transaction would make leases look younger than they are.
pub fn now() -> Result<TimestampWithTimeZone, LockError> {
    let now = TimestampWithTimeZone::try_from(clock()).map_err(|_| LockError::ClockOutOfRange);
    crate::explore::point(|| "after reading the clock".into());
    now
}
