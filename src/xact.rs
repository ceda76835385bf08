//! Transactions and subtransactions that lockext runs itself.

use std::panic::AssertUnwindSafe;

use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;

use pgrx::spi::{SpiClient, SpiTupleTable};

use crate::backend;
use crate::error::LockError;
use crate::statements::{Args, Statement};

/// Ends whatever transaction is open, rolled back (an exit hook's first step: the backend
/// may exit in the middle of one). Sound at any point a backend can exit.
pub fn abort_any() {
    unsafe { pg_sys::AbortOutOfAnyTransaction() };
}

/// Runs `body` in a transaction of its own: committed when it returns Ok, rolled back when
/// it returns Err or raises an ERROR. The ERROR is caught and returned as a message, so one
/// bad round never takes a worker down (and an exiting backend still exits cleanly).
pub fn in_transaction<R>(body: impl FnOnce() -> Result<R, LockError>) -> Result<R, String> {
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let body = AssertUnwindSafe(body);
    PgTryBuilder::new(move || {
        let body = body;
        let result = (body.0)().map_err(|e| e.to_string());
        unsafe {
            pg_sys::PopActiveSnapshot();
            if result.is_ok() {
                pg_sys::CommitTransactionCommand();
            } else {
                pg_sys::AbortCurrentTransaction();
            }
        }
        result
    })
    .catch_others(|caught| {
        unsafe { pg_sys::AbortCurrentTransaction() };
        Err(caught_message(&caught))
    })
    .execute()
}

fn caught_message(caught: &CaughtError) -> String {
    match caught {
        CaughtError::PostgresError(report)
        | CaughtError::ErrorReport(report)
        | CaughtError::RustPanic {
            ereport: report, ..
        } => report.message().to_string(),
    }
}

/// Runs `body` in a subtransaction that is kept only when `body` returns Ok(Some): what it
/// did is undone when it comes back with nothing or an error. An ERROR raised inside (a
/// cancel, `statement_timeout`, a failed statement) rolls the subtransaction back too, and
/// is then raised again in the caller's transaction: the subtransaction never outlives
/// this call, whatever happens in it.
pub fn all_or_nothing<T>(
    body: impl FnOnce() -> Result<Option<T>, LockError>,
) -> Result<Option<T>, LockError> {
    let (context, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
    let back_to_caller = move || unsafe {
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
    };
    unsafe {
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        // Results belong to the caller, not to the subtransaction's memory.
        pg_sys::MemoryContextSwitchTo(context);
    }
    let body = AssertUnwindSafe(body);
    PgTryBuilder::new(move || {
        let body = body;
        let result = (body.0)();
        unsafe {
            if matches!(result, Ok(Some(_))) {
                pg_sys::ReleaseCurrentSubTransaction();
            } else {
                pg_sys::RollbackAndReleaseCurrentSubTransaction();
            }
        }
        back_to_caller();
        result
    })
    .catch_others(move |caught| {
        unsafe { pg_sys::RollbackAndReleaseCurrentSubTransaction() };
        back_to_caller();
        caught.rethrow()
    })
    .execute()
}

/// Runs one statement that locks rows `FOR UPDATE SKIP LOCKED` (or `ON CONFLICT`, or `FOR
/// SHARE`) and may change none of them, so that it keeps no lock on a row it did not
/// change: PostgreSQL keeps the lock of a row that fails the recheck of `FOR UPDATE` (the
/// row changed after the statement's snapshot) to the end of the transaction.
///
/// Always in a subtransaction that is rolled back when the statement found nothing
/// (`all_or_nothing`), outside a transaction block too: the transaction goes on after this
/// call whenever anything else runs after it before the transaction ends (a `DO` block, a
/// function, a procedure, `SELECT f(), pg_sleep(10)`), and nothing here can know that it
/// will not. The cost: a subtransaction that changed something is kept, with its own
/// transaction id (a call that writes takes two), and more than 64 kept ones in one
/// transaction overflow the backend's cache of subtransaction ids, which makes every
/// snapshot in the cluster dearer while that transaction lasts.
pub fn kept_if_found<T>(
    statement: impl FnOnce() -> Result<Option<T>, LockError>,
) -> Result<Option<T>, LockError> {
    all_or_nothing(statement)
}

/// Runs `statements` in order, each kept only if it found something (`kept_if_found`: a
/// refused one keeps no row locked), until one does; each takes the arguments `args`
/// gives, and `read` says what it found. A renewal's or a release's statements (one per
/// lease table); a fenced write's UPDATE, then its upsert.
pub fn first_found<'a, T>(
    client: &mut SpiClient<'_>,
    statements: &'static [Statement],
    args: impl Fn() -> Args<'a>,
    read: impl Fn(SpiTupleTable<'_>) -> Result<Option<T>, LockError>,
) -> Result<Option<T>, LockError> {
    for statement in statements {
        let found = kept_if_found(|| read(statement.run(client, args())?))?;
        if found.is_some() {
            return Ok(found);
        }
    }
    Ok(None)
}

/// Runs a renewal or a release (`attempt`), and again while it found nothing although
/// `still_held` says the caller's live lease or keep-alive is there: its row was locked for
/// a moment by someone else, such as the reaper or a grant, which keeps the lock of a row it
/// looked at as expired and found renewed (PostgreSQL keeps the lock of a row that fails
/// the recheck of `FOR UPDATE`) until its short transaction commits. A holder must not be
/// told "not yours" for that. Bounded: after 100 ms the answer stands (a row a long
/// transaction keeps locked is not available to change).
pub fn while_briefly_locked<T>(
    mut attempt: impl FnMut() -> Result<Option<T>, LockError>,
    still_held: impl Fn() -> bool,
) -> Result<Option<T>, LockError> {
    for _ in 0..100 {
        if let Some(done) = attempt()? {
            return Ok(Some(done));
        }
        if !still_held() {
            return Ok(None);
        }
        backend::sleep_us(1000);
        pg_sys::check_for_interrupts!();
    }
    attempt()
}
