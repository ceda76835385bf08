//! The server's heavyweight lock table (lmgr), in one place: trying a lock without
//! waiting, waiting for one, and giving one back, for the current transaction. Claims,
//! the reaper and the schedule explorer ask here instead of calling `LockAcquire` and
//! `LockRelease` themselves.
//!
//! Why the calls are sound: the tag is a plain value we own for the call (PostgreSQL
//! copies it into its table); the lock is a transaction lock (not a session lock), owned
//! by the current resource owner and released at the transaction's end at the latest.
//! Misuse (outside a transaction, an unknown lock method) raises an ERROR, which pgrx
//! turns into a Rust panic that unwinds safely: never undefined behaviour.

use pgrx::pg_sys;

/// What trying a lock found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Tried {
    /// Another transaction holds it in a conflicting mode.
    NotAvailable,
    /// Taken now, by this call.
    Taken,
    /// This transaction held it already (in this mode).
    AlreadyHeld,
}

/// Tries to take `tag` in `mode` for this transaction, without waiting.
pub fn try_lock(tag: &pg_sys::LOCKTAG, mode: pg_sys::LOCKMODE) -> Tried {
    match unsafe { pg_sys::LockAcquire(tag, mode, false, true) } {
        pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL => Tried::NotAvailable,
        pg_sys::LockAcquireResult::LOCKACQUIRE_OK => Tried::Taken,
        _ => Tried::AlreadyHeld,
    }
}

/// Takes `tag` in `mode` for this transaction, waiting as long as it takes (cancellable,
/// and part of deadlock detection).
pub fn lock(tag: &pg_sys::LOCKTAG, mode: pg_sys::LOCKMODE) {
    unsafe { pg_sys::LockAcquire(tag, mode, false, false) };
}

/// Gives back one hold of `tag` in `mode` by this transaction (a warning, nothing else,
/// when it holds none).
pub fn unlock(tag: &pg_sys::LOCKTAG, mode: pg_sys::LOCKMODE) {
    unsafe { pg_sys::LockRelease(tag, mode, false) };
}
