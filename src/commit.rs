//! How lockext's transactions commit: durably where safety needs it, cheaply where not.
//!
//! - Under `lockext.durability = grant`, a transaction that grants a lease flushes its
//!   commit before the client hears of it (`require_flush`), whatever
//!   `synchronous_commit` says when it commits. (Tokens do not depend on this: `token.rs`
//!   puts the counter on disk itself.)
//! - A transaction that only renews or releases leases does not: losing it in a crash only
//!   makes a lease end later (a lost release: the lease runs out, or the reaper clears it)
//!   or earlier (a lost renewal), and fencing makes either harmless. So such a transaction
//!   commits asynchronously (`relax_if_only_leases`), which spares it an fsync. The moment
//!   the transaction writes anything else, before or after, its commit stays as the session
//!   asked: lockext never weakens a write it did not make.

use std::cell::Cell;

use pgrx::pg_sys;
use pgrx::{register_xact_callback, PgXactCallbackEvent};

use crate::backend;
use crate::settings::{self, Durability};

thread_local! {
    /// (local transaction id, end of WAL written by this transaction right after lockext's
    /// last renew/release in it): the commit may be relaxed if nothing was written since.
    static ONLY_LEASES: Cell<Option<(u32, u64)>> = const { Cell::new(None) };
    /// The local transaction id of the last transaction that minted a token.
    static MINTED_IN: Cell<u32> = const { Cell::new(0) };
    /// The local transaction id whose pre-commit check is registered.
    static CHECK_REGISTERED: Cell<u32> = const { Cell::new(0) };
}

fn local_xact() -> u32 {
    backend::local_transaction()
}

fn wal_end() -> u64 {
    unsafe { pg_sys::XactLastRecEnd }
}

/// Makes the current transaction's commit wait for its WAL flush (and, with synchronous
/// replication, what `on` waits for), whatever `synchronous_commit` says by then. The
/// decision is taken at pre-commit, after everything the caller could do in between: a
/// `SET LOCAL synchronous_commit = off` later in the transaction, or a wrapper function
/// declared `SET synchronous_commit = off` (whose setting is undone only when it returns),
/// cannot take it back. Only `off` is raised: `local` and stronger already flush before the
/// client hears back.
pub fn require_flush() {
    MINTED_IN.with(|m| m.set(local_xact()));
    check_at_commit();
}

/// The commit step of a call that minted a token (a grant's, or a keep-alive's id): under
/// `lockext.durability = grant` its transaction's commit is flushed (`require_flush`).
pub fn after_minting() {
    if settings::durability() == Durability::Grant {
        require_flush();
    }
}

/// Call before a renew or release writes: whether the transaction has, so far, written
/// nothing but lockext's renewals and releases.
pub fn only_leases_so_far() -> bool {
    let no_writes_yet =
        unsafe { pg_sys::GetTopTransactionIdIfAny() } == pg_sys::InvalidTransactionId;
    no_writes_yet || ONLY_LEASES.with(|o| o.get()) == Some((local_xact(), wal_end()))
}

/// Call after a renew or release wrote, with what `only_leases_so_far` said before it.
pub fn relax_if_only_leases(only_leases: bool) {
    let lxid = local_xact();
    if !only_leases {
        ONLY_LEASES.with(|o| o.set(None));
        return;
    }
    ONLY_LEASES.with(|o| o.set(Some((lxid, wal_end()))));
    check_at_commit();
}

fn check_at_commit() {
    let lxid = local_xact();
    if CHECK_REGISTERED.with(|c| c.replace(lxid)) != lxid {
        register_xact_callback(PgXactCallbackEvent::PreCommit, at_commit);
    }
}

/// At pre-commit, the last moment before the commit record: a transaction that minted a
/// token flushes; one that wrote nothing since lockext's last renew/release, and minted
/// nothing, may skip the flush.
fn at_commit() {
    crate::explore::point(|| "at pre-commit".into());
    let lxid = local_xact();
    if MINTED_IN.with(|m| m.get()) == lxid {
        if unsafe { pg_sys::synchronous_commit }
            == pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_OFF as i32
        {
            set_synchronous_commit(c"on");
        }
        return;
    }
    if ONLY_LEASES.with(|o| o.get()) == Some((lxid, wal_end())) {
        set_synchronous_commit(c"off");
    }
}

fn set_synchronous_commit(value: &std::ffi::CStr) {
    unsafe {
        pg_sys::set_config_option(
            c"synchronous_commit".as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            0,
            false,
        );
    }
}
