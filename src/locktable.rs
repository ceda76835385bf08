//! The server's heavyweight lock table (lmgr), in one place: trying a lock without
//! waiting, waiting for one, and giving one back, for the current transaction; and
//! whether this process can take one now (the schedule explorer's question). Claims,
//! the reaper and the schedule explorer ask here instead of calling `LockAcquire` and
//! `LockRelease` themselves.
//!
//! Why the calls are sound: the tag is a plain value we own for the call (PostgreSQL
//! copies it into its table); the lock is a transaction lock (not a session lock), owned
//! by the current resource owner and released at the transaction's end at the latest.
//! Misuse (outside a transaction, an unknown lock method) raises an ERROR, which pgrx
//! turns into a Rust panic that unwinds safely: never undefined behaviour. Reading
//! `MyDatabaseId` and calling `IsTransactionState` is sound as in `backend.rs` (a plain
//! value of this single-threaded process; a function of no arguments).

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

/// The tag of the advisory lock (`key`, `field4`) in this backend's database, if this
/// process can take a transaction lock now: inside a transaction, connected to a database
/// (the reaper's launcher is connected to none). `MyDatabaseId` is read here, not in
/// `backend.rs`, because the schedule explorer, which asks this, sits below `backend.rs`
/// (whose clock is a pause point).
pub fn advisory_tag_here(key: (u32, u32), field4: u16) -> Option<pg_sys::LOCKTAG> {
    let database = unsafe { pg_sys::MyDatabaseId };
    if !unsafe { pg_sys::IsTransactionState() } || database == pg_sys::InvalidOid {
        return None;
    }
    Some(pg_sys::LOCKTAG {
        locktag_field1: database.to_u32(),
        locktag_field2: key.0,
        locktag_field3: key.1,
        locktag_field4: field4,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    })
}
