//! Claims: transaction-scoped locks in the server's lock table that lockext only ever
//! *tries* to take, so that no lock call waits for another transaction.
//!
//! - The gate of a lock id. Every acquire passes it before it looks at the leases: an
//!   exclusive or semaphore acquire in exclusive mode, a shared acquire in shared mode. It
//!   is kept to the end of the transaction, so two acquires that could both be granted only
//!   if neither saw the other (a writer and a reader, two takers of a semaphore's last
//!   permit) never run at once: the second fails to pass, and is told "not available".
//!   Once the first commits, its lease is visible to whoever passes next.
//! - The claim of a shared lease's row: a row being inserted by an open transaction cannot
//!   be locked, and an INSERT that meets it waits, so its creator claims it first.
//! - The kind of a lock id, claimed by shared and semaphore acquires, so that an id does not
//!   become a lock and a semaphore at once.
//! - The claim of a semaphore's slot: a taker claims one of the n slots, then checks that no
//!   live permit is in it, so two takers never fill one slot and n permits are never
//!   exceeded, while takers of different slots go side by side.
//!
//! Claims use the server's shared lock table, sized by max_locks_per_transaction. One
//! transaction keeps at most half that many. Past that (a bulk load of leases in one
//! transaction), an exclusive acquire by a `lockext_admin` member keeps one claim for the
//! whole database instead, which every shared acquire also tries, and only tests its lock
//! id's gate; any other acquire is refused with an error. (Any member could otherwise
//! refuse everyone's shared leases for as long as it kept a transaction open.)

use std::cell::{Cell, RefCell};

use std::sync::atomic::Ordering;

use pgrx::{
    pg_guard, pg_shmem_init, pg_sys, register_subxact_callback, register_xact_callback,
    PgSubXactCallbackEvent, PgXactCallbackEvent,
};

use crate::backend;
use crate::caller;
use crate::error::LockError;
use crate::locktable::{self, Tried};
use crate::settings;
use crate::shmem::BULK_LOADS;
use crate::text::Text;

/// Lockext's claims among advisory locks in `pg_locks` (objsubid 19531 "LK", 19535 "LO",
/// 19522 "LB", 19539 "LS", 19540 "LT"); the built-in advisory functions use 1 and 2, so they never
/// collide.
const GATE_TAG: u16 = 0x4C4B;
const ROW_TAG: u16 = 0x4C4F;
const BULK_TAG: u16 = 0x4C42;
const SLOT_TAG: u16 = 0x4C53;
const KIND_TAG: u16 = 0x4C54;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Shared,
    Exclusive,
}

impl Mode {
    fn lockmode(self) -> pg_sys::LOCKMODE {
        (match self {
            Mode::Shared => pg_sys::ShareLock,
            Mode::Exclusive => pg_sys::ExclusiveLock,
        }) as pg_sys::LOCKMODE
    }
}

/// A gate passed by this call. `reopen` gives it back when the call is refused after all,
/// unless the transaction held it before.
pub struct Gate {
    tag: pg_sys::LOCKTAG,
    mode: Mode,
    newly_taken: bool,
}

impl Gate {
    pub fn reopen(self) {
        if self.newly_taken {
            locktable::unlock(&self.tag, self.mode.lockmode());
            forget_claim();
        }
    }
}

/// Passes the gate of `lock_id` in `mode`, or None when an acquire that conflicts with this
/// one is in flight.
pub fn try_gate(lock_id: Text<'_>, mode: Mode) -> Result<Option<Gate>, LockError> {
    let tag = tag_of(GATE_TAG, fnv1a(lock_id.bytes()));
    crate::explore::point(|| format!("before the gate of {lock_id}"));
    let Some(newly_taken) = try_lock(&tag, mode) else {
        return Ok(None);
    };
    crate::explore::point(|| format!("past the gate of {lock_id}"));
    // Only once the gate is held: a bulk load that passed this gate before raised its flag
    // while holding it (below), so it is seen now; read before the gate, the flag could be
    // read, then the bulk load pass and insert, then the gate be taken.
    if bulk_load_in_flight() {
        if newly_taken {
            locktable::unlock(&tag, mode.lockmode());
        }
        return Ok(None); // its leases are inserted past gates it does not keep
    }
    if newly_taken && !keep_another_claim() {
        // The database-wide claim refuses every other acquire in the database while this
        // transaction lasts: an operator's bulk load may take it, not any member.
        if mode == Mode::Shared || !caller::is_admin() {
            locktable::unlock(&tag, mode.lockmode());
            return Err(LockError::TooManyClaims);
        }
        // Raised while this id's gate is still held: whoever passes it next, after it is
        // given back, sees the flag and tests the bulk claim (`bulk_load_in_flight`).
        raise_bulk_flag();
        let bulk = try_lock(&tag_of(BULK_TAG, 0), Mode::Exclusive);
        locktable::unlock(&tag, mode.lockmode());
        if bulk.is_none() {
            return Ok(None);
        }
        return Ok(Some(Gate {
            tag,
            mode,
            newly_taken: false,
        }));
    }
    Ok(Some(Gate {
        tag,
        mode,
        newly_taken,
    }))
}

/// Claims `key` for this transaction in exclusive mode, outside the claims budget (so never
/// replaced by the database-wide claim): false when another transaction holds it. For the
/// one claim lockext itself takes per transaction at most (the epoch row's writer).
pub fn try_claim_alone(key: &str) -> bool {
    try_lock(&tag_of(GATE_TAG, fnv1a(key.as_bytes())), Mode::Exclusive).is_some()
}

/// Claims the creation of `owner`'s shared-lease row for `lock_id`; false when another
/// transaction is creating or changing it right now. Past the budget, refused (53200) as
/// the other claims are: a row created without its claim kept is an uncommitted row that
/// a rival creating the same row would wait for.
pub fn try_claim_row(lock_id: Text<'_>, owner: Text<'_>) -> Result<bool, LockError> {
    let key = fnv1a(owner.bytes()) ^ fnv1a(lock_id.bytes()).rotate_left(29);
    let tag = tag_of(ROW_TAG, key);
    match try_lock(&tag, Mode::Exclusive) {
        None => Ok(false),
        Some(true) if !keep_another_claim() => {
            locktable::unlock(&tag, Mode::Exclusive.lockmode());
            Err(LockError::TooManyClaims)
        }
        Some(_) => Ok(true),
    }
}

/// Claims the kind of lock id `lock_id` for this transaction, after its gate was passed in
/// shared mode: shared leases with each other, or permits with each other, never both. So
/// two first acquires of an id cannot make it a lock and a semaphore at once. False when
/// an acquire of the other kind is in flight.
pub fn try_kind(lock_id: Text<'_>, semaphore: bool) -> Result<bool, LockError> {
    let tag = tag_of(KIND_TAG, fnv1a(lock_id.bytes()));
    // Each mode is compatible with itself and conflicts with the other.
    let mode = if semaphore {
        pg_sys::ShareLock
    } else {
        pg_sys::RowExclusiveLock
    } as pg_sys::LOCKMODE;
    match locktable::try_lock(&tag, mode) {
        Tried::NotAvailable => Ok(false),
        Tried::Taken if !keep_another_claim() => {
            locktable::unlock(&tag, mode);
            Err(LockError::TooManyClaims)
        }
        _ => Ok(true),
    }
}

/// A semaphore slot claimed by this call; `give_back` when the slot turns out taken.
pub struct SlotClaim(pg_sys::LOCKTAG, bool);

impl SlotClaim {
    pub fn give_back(self) {
        if self.1 {
            locktable::unlock(&self.0, Mode::Exclusive.lockmode());
            forget_claim();
        }
    }
}

/// Claims slot `slot` of semaphore `lock_id`; None when another taker is filling it now.
pub fn try_claim_slot(lock_id: Text<'_>, slot: i32) -> Result<Option<SlotClaim>, LockError> {
    let key = fnv1a(lock_id.bytes()) ^ (slot as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let tag = tag_of(SLOT_TAG, key);
    match try_lock(&tag, Mode::Exclusive) {
        None => Ok(None),
        Some(true) if !keep_another_claim() => {
            locktable::unlock(&tag, Mode::Exclusive.lockmode());
            Err(LockError::TooManyClaims)
        }
        Some(newly_taken) => Ok(Some(SlotClaim(tag, newly_taken))),
    }
}

/// Asks for `BULK_LOADS` (declared in `shmem.rs` with lockext's other shared memory):
/// how many transactions may hold the database-wide claim (in any database) right now:
/// raised by one before it first takes the claim, lowered when it ends (never when it is
/// prepared: a prepared transaction keeps its locks, so the flag stays up for good, which
/// only costs every acquire one more test; and since a prepared one outlives a restart,
/// which this count does not, a server that allows prepared transactions always tests). While it is zero, no acquire needs to test the
/// claim, so the common acquire does not touch that one lock of the server's lock table
/// that every acquire in the database would otherwise share.
pub fn init_shared_memory() {
    pg_shmem_init!(BULK_LOADS);
}

thread_local! {
    // Whether this backend's transaction raised BULK_LOADS (and has not lowered it yet).
    static RAISED: Cell<bool> = const { Cell::new(false) };
}

fn raise_bulk_flag() {
    if !settings::preloaded() || RAISED.with(|r| r.replace(true)) {
        return;
    }
    BULK_LOADS.get().fetch_add(1, Ordering::SeqCst);
    let lower = || {
        if RAISED.with(|r| r.replace(false)) {
            BULK_LOADS.get().fetch_sub(1, Ordering::SeqCst);
        }
    };
    register_xact_callback(PgXactCallbackEvent::Commit, lower);
    register_xact_callback(PgXactCallbackEvent::Abort, lower);
    register_xact_callback(PgXactCallbackEvent::Prepare, || {
        RAISED.with(|r| r.set(false)); // left raised: the prepared transaction keeps the claim
    });
}

/// Whether another transaction keeps the database-wide claim: its exclusive leases are
/// inserted past gates it only tested, so a row of one may be uncommitted, which an insert
/// of the same id would wait for. Tested without being kept: the gate, kept, is what keeps
/// a bulk load from starting under this acquire. Not preloaded, always tested; nor when
/// the server allows prepared transactions: a bulk load prepared before a restart keeps
/// its claim and its rows, and the flag starts again at zero.
fn bulk_load_in_flight() -> bool {
    if settings::preloaded()
        && backend::max_prepared_transactions() == 0
        && BULK_LOADS.get().load(Ordering::SeqCst) == 0
    {
        return false;
    }
    let tag = tag_of(BULK_TAG, 0);
    match try_lock(&tag, Mode::Shared) {
        None => true,
        Some(true) => {
            locktable::unlock(&tag, Mode::Shared.lockmode());
            false
        }
        Some(false) => false,
    }
}

/// Some(true) when newly taken, Some(false) when this transaction held it already, None
/// when another transaction holds it in a conflicting mode.
fn try_lock(tag: &pg_sys::LOCKTAG, mode: Mode) -> Option<bool> {
    match locktable::try_lock(tag, mode.lockmode()) {
        Tried::NotAvailable => None,
        Tried::Taken => Some(true),
        Tried::AlreadyHeld => Some(false),
    }
}

/// An advisory-lock tag in this database. The key is a 64-bit hash of a lock id: a
/// collision only makes two ids contend for their gates, never for ownership.
fn tag_of(kind: u16, key: u64) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        locktag_field1: backend::database().to_u32(),
        locktag_field2: (key >> 32) as u32,
        locktag_field3: key as u32,
        locktag_field4: kind,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

thread_local! {
    // The claims kept in the current transaction, by the subtransaction that took them:
    // (local transaction id, [(subtransaction id, claims)], oldest first). A subtransaction
    // that rolls back gives its claims (and those of its committed children, which are
    // newer) back to the lock manager, so they stop counting too: a PL/pgSQL loop of
    // refused sets, each rolled back, never spends the budget.
    static CLAIMS_KEPT: RefCell<(u32, Vec<(pg_sys::SubTransactionId, i32)>)> =
        const { RefCell::new((0, Vec::new())) };
    // The local transaction id the abort callback is registered for (pgrx forgets its
    // subtransaction callbacks when a transaction ends).
    static WATCHING: Cell<u32> = const { Cell::new(0) };
}

/// This transaction's claims, reset when it is a new transaction.
fn with_kept<R>(f: impl FnOnce(&mut Vec<(pg_sys::SubTransactionId, i32)>) -> R) -> R {
    let lxid = backend::local_transaction();
    CLAIMS_KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.0 != lxid {
            *kept = (lxid, Vec::new());
        }
        f(&mut kept.1)
    })
}

/// Stops counting the claims of a subtransaction that rolls back, once per transaction.
fn watch_subtransactions() {
    let lxid = backend::local_transaction();
    if WATCHING.with(|w| w.replace(lxid)) == lxid {
        return;
    }
    register_subxact_callback(PgSubXactCallbackEvent::AbortSub, |aborted, _parent| {
        with_kept(|kept| kept.retain(|(sub, _)| *sub < aborted));
    });
}

/// Counts a kept claim against this transaction's budget; false when the budget is spent.
fn keep_another_claim() -> bool {
    watch_subtransactions();
    let budget = backend::max_locks_per_transaction() / 2;
    let sub = backend::subtransaction();
    with_kept(|kept| {
        if kept.iter().map(|(_, n)| n).sum::<i32>() >= budget {
            return false;
        }
        match kept.last_mut() {
            Some((s, n)) if *s == sub => *n += 1,
            _ => kept.push((sub, 1)),
        }
        true
    })
}

/// Takes back the count of a claim given back: a waiter tries again and again in one
/// transaction, and only what it keeps counts.
fn forget_claim() {
    with_kept(|kept| {
        if let Some(entry) = kept.iter_mut().rev().find(|(_, n)| *n > 0) {
            entry.1 -= 1;
        }
    });
}

/// FNV-1a, 64 bits: stable across builds and processes, as a lock key shared by backends
/// (possibly running different builds during an upgrade) must be.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
