//! The token counter of each database, in shared memory when lockext is preloaded.
//!
//! A token's counter must be above every counter handed out before it, even across a
//! crash (`token.rs`). Without preload each value comes from `nextval` on
//! `lockext.fence_token_seq`, and the WAL is flushed up to the sequence page's LSN once
//! every 32 values. Under load that costs twice: every grant of the database takes the
//! sequence page's exclusive buffer lock, and every grant that comes while one of those
//! flushes runs waits for it (the grant rate stalls on the disk even when commits do not
//! wait for it, `durability = epoch`).
//!
//! Preloaded, the counter lives here, and the sequence keeps only a **reservation**: a
//! value at or above every counter handed out. A counter is handed out only once a
//! reservation at or above it is on disk (`setval`, then a WAL flush). The reservation
//! moves `BLOCK` values ahead at a time, as soon as half of the last one is used, so one
//! grant in `BLOCK / 2` pays a flush and every other one pays a few instructions under an
//! LWLock. After a restart or a crash, shared memory is new: the counter starts again
//! from the sequence, i.e. at the last reservation, above everything handed out (a gap of
//! less than `BLOCK`, as `nextval` leaves up to 32 after a crash). A dump copies the
//! sequence, so a restore starts above the reservation too; a new history gets a new era
//! whatever the counter says (`token.rs`).
//!
//! A slot is keyed by (database, sequence): DROP and CREATE EXTENSION make a new sequence,
//! which starts a slot of its own from its own value. When every slot is in use, the one
//! used least recently is given up; it starts again from its sequence when it comes back,
//! which is at or above everything it handed out.

use pgrx::lwlock::PgLwLock;
use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::spi::SpiClient;
use pgrx::{pg_guard, pg_shmem_init, PGRXSharedMemory};

use crate::backend;
use crate::claims;
use crate::error::LockError;
use crate::statements::Statement;

/// How far ahead of the counter a reservation reaches.
const BLOCK: i64 = 1024;
/// Databases whose counters are kept at once.
const SLOTS: usize = 32;

#[derive(Clone, Copy, Default)]
struct Slot {
    database: u32,
    /// The sequence's oid; 0 for a slot not in use.
    sequence: u32,
    /// The last counter handed out.
    issued: i64,
    /// The reservation on disk: nothing above it has been handed out.
    reserved: i64,
    /// The sequence's MAXVALUE: the last counter there is.
    max: i64,
    /// A backend is moving the reservation ahead.
    reserving: bool,
    /// When the slot was last used, on `Table::clock`.
    last_use: u64,
}

#[derive(Clone, Copy, Default)]
pub struct Table {
    slots: [Slot; SLOTS],
    clock: u64,
}

// Plain numbers only, no pointers: safe to place in shared memory.
unsafe impl PGRXSharedMemory for Table {}

static TABLE: PgLwLock<Table> = unsafe { PgLwLock::new(c"lockext_token_counters") };

pub fn init_shared_memory() {
    pg_shmem_init!(TABLE);
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Key {
    database: u32,
    sequence: u32,
}

impl Key {
    /// `sequence`'s counter in this database.
    fn of(sequence: pg_sys::Oid) -> Key {
        Key {
            database: backend::database().to_u32(),
            sequence: sequence.to_u32(),
        }
    }
}

impl Slot {
    fn is(&self, key: Key) -> bool {
        self.sequence == key.sequence && self.database == key.database
    }
}

enum Taken {
    /// A counter, and whether this backend should move the reservation ahead now.
    Value(i64, bool),
    /// The reservation is used up, or this database has no slot yet.
    Reserve,
}

/// The next counter of `sequence` in this database, at or below a reservation on disk.
pub fn next(client: &mut SpiClient<'_>, sequence: pg_sys::Oid) -> Result<i64, LockError> {
    let key = Key::of(sequence);
    loop {
        match take(key) {
            Taken::Value(value, reserve_ahead) => {
                if reserve_ahead {
                    // Best effort: a backend reserving already does it for everyone.
                    if let Some(lock) = claims::try_lock_counter() {
                        reserve(client, key, sequence)?;
                        lock.release();
                    } else {
                        clear_reserving(key);
                    }
                }
                return Ok(value);
            }
            Taken::Reserve => {
                // Waits for a reservation in flight (one flush), then makes sure one is.
                let lock = claims::lock_counter();
                let room = reserve(client, key, sequence)?;
                lock.release();
                if !room {
                    return Err(LockError::TokensExhausted { what: "counter" });
                }
            }
        }
    }
}

/// The last counter handed out in this database, if its slot is in shared memory.
pub fn issued(sequence: pg_sys::Oid) -> Option<i64> {
    let key = Key::of(sequence);
    let table = TABLE.share();
    table.slots.iter().find(|s| s.is(key)).map(|s| s.issued)
}

fn take(key: Key) -> Taken {
    let mut table = TABLE.exclusive();
    table.clock += 1;
    let now = table.clock;
    let Some(slot) = table.slots.iter_mut().find(|s| s.is(key)) else {
        return Taken::Reserve;
    };
    slot.last_use = now;
    if slot.issued >= slot.reserved {
        return Taken::Reserve;
    }
    slot.issued += 1;
    let ahead =
        !slot.reserving && slot.reserved - slot.issued < BLOCK / 2 && slot.reserved < slot.max;
    if ahead {
        slot.reserving = true;
    }
    Taken::Value(slot.issued, ahead)
}

fn clear_reserving(key: Key) {
    let mut table = TABLE.exclusive();
    if let Some(slot) = table.slots.iter_mut().find(|s| s.is(key)) {
        slot.reserving = false;
    }
}

static READ_SEQUENCE: Statement = Statement {
    sql: include_str!("../sql/run/counter/read_sequence.sql"),
    params: &[OIDOID],
};

static MOVE_RESERVATION: Statement = Statement {
    sql: include_str!("../sql/run/counter/move_reservation.sql"),
    params: &[OIDOID, INT8OID],
};

/// Moves the reservation of `key` `BLOCK` values past what is handed out, on disk before it
/// counts, unless another backend just did; starts the slot from the sequence first if it
/// has none. Call with the counter lock held: the sequence is read and written by one
/// backend at a time, and each write is flushed before the lock is given back, so the
/// value a slot starts from is a reservation on disk. False when the counter is at the
/// sequence's MAXVALUE.
fn reserve(client: &mut SpiClient<'_>, key: Key, sequence: pg_sys::Oid) -> Result<bool, LockError> {
    let slot = {
        let table = TABLE.share();
        table.slots.iter().find(|s| s.is(key)).copied()
    };
    let slot = match slot {
        Some(slot) => slot,
        None => start_slot(client, key, sequence)?,
    };
    let target = (slot.reserved.max(slot.issued) + BLOCK).min(slot.max);
    let needed = slot.reserved - slot.issued < BLOCK / 2 && target > slot.reserved;
    if needed {
        MOVE_RESERVATION.run(client, &[sequence.into(), target.into()])?;
        unsafe { pg_sys::XLogFlush(pg_sys::XactLastRecEnd) };
    }
    let mut table = TABLE.exclusive();
    let Some(slot) = table.slots.iter_mut().find(|s| s.is(key)) else {
        return Ok(true); // given up meanwhile: the next take starts it again
    };
    if needed {
        slot.reserved = slot.reserved.max(target);
    }
    slot.reserving = false;
    Ok(slot.reserved > slot.issued)
}

/// A slot for `key`, its counter and reservation at the sequence's value (at or above
/// everything handed out: see `reserve`), in place of the slot used least recently.
fn start_slot(
    client: &mut SpiClient<'_>,
    key: Key,
    sequence: pg_sys::Oid,
) -> Result<Slot, LockError> {
    let row = READ_SEQUENCE.run(client, &[sequence.into()])?.first();
    let value = row.get_by_name::<i64, _>("counter")?.unwrap_or(0);
    let max = row.get_by_name::<i64, _>("max")?.unwrap_or(0);
    let mut table = TABLE.exclusive();
    let now = table.clock;
    let slot = Slot {
        database: key.database,
        sequence: key.sequence,
        issued: value,
        reserved: value,
        max,
        reserving: false,
        last_use: now,
    };
    if let Some(kept) = table.slots.iter_mut().find(|s| s.is(key)) {
        return Ok(*kept);
    }
    let victim = table
        .slots
        .iter_mut()
        .min_by_key(|s| (s.sequence != 0, s.last_use))
        .expect("SLOTS > 0");
    *victim = slot;
    Ok(slot)
}
