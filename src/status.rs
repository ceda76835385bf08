//! What the reapers report, and when each database next needs a round: one entry per
//! database the reaper serves, in shared memory sized at server start by
//! `lockext.reaper_databases`, read by `lockext.reaper_status()` and by the launcher.
//! Shared memory exists only when lockext is preloaded; without it there is no reaper, and
//! the function returns no rows.
//!
//! Each entry's **due** is the earliest time anything in its database can become reapable,
//! or later never (`NEVER`). A round publishes the true one when it ends (`Reporter::due`);
//! a transaction that writes an expiry publishes min(due, that expiry) when it commits
//! (`publish`). A round's snapshot may miss a transaction that commits while it computes,
//! so every publication is also kept in `since`, which the round resets before it computes
//! and takes the minimum with after: a publication is never lost to a round's overwrite.

use std::cell::Cell;
use std::collections::HashMap;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::backend;
use crate::catalog;
use crate::settings;
use crate::shmem::{self, Table};

const ERROR_BYTES: usize = 240;
/// A due time that never comes: timestamptz's infinity.
pub const NEVER: i64 = i64::MAX;
const NAME: &std::ffi::CStr = c"lockext_reaper_board";

#[repr(C)]
#[derive(Clone, Copy)]
struct Entry {
    database: u32, // oid; 0 = free entry
    pid: i32,
    last_run: i64, // TimestampTz; 0 = no round finished yet
    rounds: u64,
    reaped_total: u64,
    reaped_last_round: u64,
    /// TimestampTz: when the database next needs a round.
    due: i64,
    /// The earliest time published since the running round began computing `due`.
    since: i64,
    error_len: usize,
    error: [u8; ERROR_BYTES],
}

const FREE: Entry = Entry {
    database: 0,
    pid: 0,
    last_run: 0,
    rounds: 0,
    reaped_total: 0,
    reaped_last_round: 0,
    due: NEVER,
    since: NEVER,
    error_len: 0,
    error: [0; ERROR_BYTES],
};

/// The board's header; `capacity` entries follow it.
#[repr(C)]
#[derive(Clone, Copy)]
struct Header {
    capacity: usize,
    /// Whether the WARNING about a full board was given (once per server start).
    warned: bool,
}

shmem::plain!(Entry {
    database,
    pid,
    last_run,
    rounds,
    reaped_total,
    reaped_last_round,
    due,
    since,
    error_len,
    error,
});
shmem::plain!(Header { capacity, warned });

/// The board: its header, then an entry per database, `lockext.reaper_databases` of them.
static BOARD: Table<Header, Entry> = Table::new(NAME, capacity_setting, new_board, FREE, ());

fn capacity_setting() -> usize {
    settings::REAPER_DATABASES.get().max(1) as usize
}

fn new_board(capacity: usize) -> Header {
    Header {
        capacity,
        warned: false,
    }
}

/// Asks for the board's memory and lock (at preload: the size is a postmaster setting).
pub fn init_shared_memory() {
    BOARD.request();
}

/// The board under its lock, released when dropped. Nothing under it may raise an error.
struct Locked {
    board: shmem::Write<Header, Entry, ()>,
}

impl Locked {
    fn exclusive() -> Option<Locked> {
        BOARD.write().map(|board| Locked { board })
    }

    fn header(&mut self) -> &mut Header {
        self.board.parts().0
    }

    fn entries(&mut self) -> &mut [Entry] {
        self.board.parts().1
    }

    fn find(&mut self, db: u32) -> Option<usize> {
        self.entries().iter().position(|e| e.database == db)
    }
}

/// A round's handle on its database's entry, found or claimed by database oid.
pub struct Reporter {
    database: u32,
    index: Option<usize>,
}

impl Reporter {
    /// Finds or claims the entry of `database`. With every entry taken the round still
    /// reaps, unseen: counted in lockext.stats (`reaper_databases_unseen`), with a WARNING
    /// once per server start; the launcher then serves the database every
    /// `lockext.reap_interval`, as it has no due time for it.
    pub fn claim(database: pg_sys::Oid, pid: i32) -> Reporter {
        let db = database.to_u32();
        let (index, warn, capacity) = match Locked::exclusive() {
            None => (None, false, 0),
            Some(mut board) => {
                let index = board.find(db).or_else(|| board.find(0));
                if let Some(i) = index {
                    let entry = &mut board.entries()[i];
                    if entry.database != db {
                        *entry = FREE;
                        entry.database = db;
                    }
                    entry.pid = pid;
                }
                let header = board.header();
                let warn = index.is_none() && !header.warned;
                if warn {
                    header.warned = true;
                }
                (index, warn, header.capacity)
            }
        };
        if index.is_none() {
            crate::stats::count(crate::stats::Counter::ReaperDatabasesUnseen);
        }
        if warn {
            warning!(
                "lockext: reaper_status has no room for more databases \
                 (lockext.reaper_databases = {capacity}); the databases without a row are \
                 reaped every lockext.reap_interval, idle or not, and not shown"
            );
        }
        Reporter {
            database: db,
            index,
        }
    }

    /// Counts one batch as soon as it commits, so the totals are right even mid-round.
    pub fn batch(&self, reaped: u64) {
        self.update(|entry| entry.reaped_total += reaped);
    }

    pub fn round_done(&self, reaped: u64, error: Option<&str>) {
        let now = backend::clock();
        self.update(|entry| {
            entry.rounds += 1;
            entry.last_run = now;
            entry.reaped_last_round = reaped;
            let msg = error.unwrap_or("").as_bytes();
            let len = floor_char_boundary(msg, ERROR_BYTES);
            entry.error[..len].copy_from_slice(&msg[..len]);
            entry.error_len = len;
        });
    }

    /// Call before the round reads when its database is next due: publications from now
    /// on are kept apart, for `due`.
    pub fn computing_due(&self) {
        self.update(|entry| entry.since = NEVER);
    }

    /// The round read (under a snapshot taken after `computing_due`) that nothing is
    /// reapable before `at`: the database is due then, or earlier if a transaction
    /// published an earlier time since.
    pub fn due(&self, at: i64) {
        self.update(|entry| entry.due = at.min(entry.since));
    }

    fn update(&self, f: impl FnOnce(&mut Entry)) {
        let Some(i) = self.index else { return };
        if let Some(mut board) = Locked::exclusive() {
            if let Some(entry) = board
                .entries()
                .get_mut(i)
                .filter(|e| e.database == self.database)
            {
                f(entry);
            }
        }
    }
}

thread_local! {
    // Where this backend's database's entry was last found: (database, index).
    static MY_ENTRY: Cell<(u32, usize)> = const { Cell::new((0, usize::MAX)) };
}

/// Makes the current database due no later than `at` (a TimestampTz): for a transaction
/// that wrote a row that becomes reapable then, once it is visible (at commit). One lock
/// of the board, no catalog access. A database without an entry has had no round since
/// the server started (the launcher runs a first round in each, whatever the board
/// says) or is unseen (then reaped every interval): nothing to do.
pub fn publish(at: i64) {
    if !settings::preloaded() {
        return;
    }
    let db = backend::database().to_u32();
    let Some(mut board) = Locked::exclusive() else {
        return;
    };
    let (cached_db, cached) = MY_ENTRY.get();
    let index = if cached_db == db
        && board
            .entries()
            .get(cached)
            .is_some_and(|e| e.database == db)
    {
        Some(cached)
    } else {
        board.find(db)
    };
    if let Some(i) = index {
        let entry = &mut board.entries()[i];
        entry.due = entry.due.min(at);
        entry.since = entry.since.min(at);
        MY_ENTRY.set((db, i));
    }
}

thread_local! {
    /// (local transaction id, the earliest expiry it wrote): published when it commits.
    static DUE_AT_COMMIT: Cell<(pg_sys::LocalTransactionId, pg_sys::TimestampTz)> =
        const { Cell::new((0, NEVER)) };
}

/// Call when this transaction writes a row that becomes reapable at `at` or later (a
/// lease's or keep-alive's expiry): when it commits, its database becomes due no later
/// than that (`publish`, one lock of shared memory; nothing when the reaper
/// already meant to come earlier). At commit, not now: the row must be visible to the
/// round that the time calls. A prepared transaction publishes at PREPARE; one that a
/// round misses then is found by the sweep.
pub fn due_by(at: TimestampWithTimeZone) {
    due_by_micros(pg_sys::TimestampTz::from(at));
}

/// As `due_by`, now: for a statement after which a round must look (DROP EXTENSION).
pub fn due_now() {
    due_by_micros(backend::clock());
}

fn due_by_micros(at: pg_sys::TimestampTz) {
    if !settings::preloaded() {
        return;
    }
    if at == NEVER {
        return;
    }
    let lxid = backend::local_transaction();
    let (xact, earliest) = DUE_AT_COMMIT.get();
    if xact == lxid {
        DUE_AT_COMMIT.set((lxid, earliest.min(at)));
        return;
    }
    DUE_AT_COMMIT.set((lxid, at));
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, publish_due);
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Prepare, publish_due);
}

fn publish_due() {
    let (_, at) = DUE_AT_COMMIT.replace((0, NEVER));
    if at != NEVER {
        publish(at);
    }
}

/// Every database's due time, for the launcher (one pass over the board).
pub fn dues() -> HashMap<u32, i64> {
    let Some(board) = BOARD.read() else {
        return HashMap::new();
    };
    board
        .rows()
        .iter()
        .filter(|e| e.database != 0)
        .map(|e| (e.database, e.due))
        .collect()
}

/// Frees the entry of `database`, whose reaper was let go (lockext dropped there, the
/// database dropped, or no longer in `lockext.database`): reaper_status stops showing it,
/// and another database may report in its place.
pub fn forget(database: pg_sys::Oid) {
    let db = database.to_u32();
    if let Some(mut board) = Locked::exclusive() {
        for entry in board.entries().iter_mut().filter(|e| e.database == db) {
            *entry = FREE;
        }
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

/// One row per database that the reaper serves (up to `lockext.reaper_databases`): the
/// process of its last round, when that round ended, its counts.
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
    if !settings::preloaded() {
        return TableIterator::new(Vec::new());
    }
    let entries: Vec<Entry> = match BOARD.read() {
        Some(board) => board
            .rows()
            .iter()
            .copied()
            .filter(|e| e.database != 0)
            .collect(),
        None => Vec::new(),
    };
    TableIterator::new(entries.into_iter().map(|s| {
        let error = String::from_utf8_lossy(&s.error[..s.error_len]).into_owned();
        (
            catalog::database_name(pg_sys::Oid::from(s.database)),
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
