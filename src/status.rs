//! What the reapers report: one slot per database in shared memory, read by
//! `lockext.reaper_status()`. Shared memory exists only when lockext is preloaded; without
//! it there is no reaper, and the function returns no rows.

use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory};

use crate::backend;

/// Reapers that can report at once; more databases than this still get reaped.
const SLOTS: usize = 16;
const ERROR_BYTES: usize = 240;

#[derive(Clone, Copy)]
pub struct ReaperSlot {
    database: u32, // oid; 0 = free slot
    pid: i32,
    last_run: i64, // TimestampTz; 0 = no round finished yet
    rounds: u64,
    reaped_total: u64,
    reaped_last_round: u64,
    error_len: usize,
    error: [u8; ERROR_BYTES],
}

impl Default for ReaperSlot {
    fn default() -> Self {
        ReaperSlot {
            database: 0,
            pid: 0,
            last_run: 0,
            rounds: 0,
            reaped_total: 0,
            reaped_last_round: 0,
            error_len: 0,
            error: [0; ERROR_BYTES],
        }
    }
}

#[derive(Clone, Copy, Default)]
pub struct Board {
    slots: [ReaperSlot; SLOTS],
}

// Plain old data with no pointers: safe to place in shared memory.
unsafe impl PGRXSharedMemory for Board {}

static BOARD: PgLwLock<Board> = unsafe { PgLwLock::new(c"lockext_reaper_status") };

pub fn init_shared_memory() {
    pg_shmem_init!(BOARD);
}

/// A reaper's handle on its slot, found or claimed by database oid.
pub struct Reporter {
    index: Option<usize>,
}

impl Reporter {
    pub fn claim(database: pg_sys::Oid, pid: i32) -> Reporter {
        let db = database.to_u32();
        let mut board = BOARD.exclusive();
        let index = board
            .slots
            .iter()
            .position(|s| s.database == db)
            .or_else(|| board.slots.iter().position(|s| s.database == 0));
        if let Some(i) = index {
            let slot = &mut board.slots[i];
            slot.database = db;
            slot.pid = pid;
        }
        Reporter { index }
    }

    /// Counts one batch as soon as it commits, so the totals are right even mid-round.
    pub fn batch(&self, reaped: u64) {
        self.update(|slot| slot.reaped_total += reaped);
    }

    pub fn round_done(&self, reaped: u64, error: Option<&str>) {
        let now = backend::clock();
        self.update(|slot| {
            slot.rounds += 1;
            slot.last_run = now;
            slot.reaped_last_round = reaped;
            let msg = error.unwrap_or("").as_bytes();
            let len = floor_char_boundary(msg, ERROR_BYTES);
            slot.error[..len].copy_from_slice(&msg[..len]);
            slot.error_len = len;
        });
    }

    fn update(&self, f: impl FnOnce(&mut ReaperSlot)) {
        if let Some(i) = self.index {
            f(&mut BOARD.exclusive().slots[i]);
        }
    }
}

/// Frees the slot of `database`, whose reaper was let go (lockext dropped there, the
/// database dropped, or no longer in `lockext.database`): reaper_status stops showing it,
/// and another database may report in its place.
pub fn forget(database: pg_sys::Oid) {
    let db = database.to_u32();
    let mut board = BOARD.exclusive();
    for slot in board.slots.iter_mut().filter(|s| s.database == db) {
        *slot = ReaperSlot::default();
    }
}

/// The longest prefix of `bytes` (UTF-8) no longer than `max` that ends on a character.
fn floor_char_boundary(bytes: &[u8], max: usize) -> usize {
    let mut len = bytes.len().min(max);
    while len > 0 && len < bytes.len() && (bytes[len] & 0b1100_0000) == 0b1000_0000 {
        len -= 1;
    }
    len
}

/// One row per database that the reaper serves: the process of its last round, when that
/// round ended, its counts.
// The row type is spelled out where pgrx reads its column names.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
#[search_path(pg_catalog, pg_temp)]
fn reaper_status() -> TableIterator<
    'static,
    (
        name!(database, Option<String>),
        name!(pid, i32),
        name!(last_run, Option<TimestampWithTimeZone>),
        name!(rounds, i64),
        name!(reaped_total, i64),
        name!(reaped_last_round, i64),
        name!(last_error, Option<String>),
    ),
> {
    if !crate::settings::preloaded() {
        return TableIterator::new(Vec::new());
    }
    let slots: Vec<ReaperSlot> = BOARD
        .share()
        .slots
        .iter()
        .copied()
        .filter(|s| s.database != 0)
        .collect();
    TableIterator::new(slots.into_iter().map(|s| {
        let error = String::from_utf8_lossy(&s.error[..s.error_len]).into_owned();
        (
            database_name(s.database),
            s.pid,
            (s.last_run != 0)
                .then(|| TimestampWithTimeZone::try_from(s.last_run).ok())
                .flatten(),
            s.rounds as i64,
            s.reaped_total as i64,
            s.reaped_last_round as i64,
            (!error.is_empty()).then_some(error),
        )
    }))
}

fn database_name(oid: u32) -> Option<String> {
    unsafe {
        let name = pg_sys::get_database_name(pg_sys::Oid::from(oid));
        if name.is_null() {
            return None;
        }
        Some(
            std::ffi::CStr::from_ptr(name)
                .to_string_lossy()
                .into_owned(),
        )
    }
}
