//! Fencing tokens: where they come from, and what makes them safe to hand out.
//!
//! A token is only worth anything if no later grant can ever get a lower or equal one, and
//! only if every client can hold it exactly: a JavaScript `number`, and any JSON parser that
//! reads numbers as doubles, is exact only up to 2^53 - 1. So a token is
//!
//! ```text
//! bit 63 ... 53   52 ....... 41   40 ........................................ 0
//!     0 (unused) |  era (12 bits) |  counter (41 bits, lockext.fence_token_seq)  |
//! ```
//!
//! and at most 9 007 199 254 740 991. A fresh cluster's first token is 1 (era 0, counter 1).
//!
//! **The counter never goes backwards, even through a crash.** A sequence WAL-logs values
//! ahead of use, and a value handed out before that WAL reaches the disk could come again
//! after a crash, whether its transaction committed asynchronously or never committed at
//! all (a client can read a token inside an open transaction). So after taking a value,
//! `next_counter` flushes the WAL up to the sequence page's LSN whenever the disk is
//! behind it: once every 32 grants (`SEQ_LOG_VALS`), and never otherwise. Every token
//! handed out is then at or below what recovery restores the sequence to.
//!
//! **The era changes when the history does**: another system (a restore into another
//! cluster), another WAL timeline (a failover, a point-in-time recovery), another database
//! (a restore into another database), or another token sequence (DROP and CREATE
//! EXTENSION, `pg_restore --clean`, which recreate it and its counter). A restart or a
//! crash is the same history: the counter continues, and no era is spent. The new era is
//! above every era that could have been used before:
//!
//! - above the highest era this cluster has used in any database, from the cluster's own
//!   record (`eras.rs`, a file that pg_dump does not copy and DROP EXTENSION does not
//!   remove): so a restore of any dump, however old, and a reinstall continue above;
//! - above the era in `lockext.token_epoch`, which travels with dumps: so a dump restored
//!   into another cluster continues above its source's era (and so above every token the
//!   source handed out while that era was in force);
//! - at least the timeline number less one: two branches of history recovered from one
//!   archive get different timelines and so different eras.
//!
//! The cluster record is flushed before the first token of the new era is handed out; the
//! era is trusted from that file only, never from a table row that its transaction (or a
//! subtransaction) could still roll back. The row is written too, for dumps, and a
//! backend stops rewriting it once it has read it back committed by another transaction.
//!
//! An old primary left running after a failover keeps its era and only counts up within
//! it: every token it mints stays below the promoted server's new era.
//!
//! **Limits.** 2^41 - 1 = 2.2 * 10^12 grants in all (the counter continues across eras):
//! 7 years at a sustained 10 000 grants/s, 70 years at 1 000/s. 4 096 eras (0 to 4095),
//! spent only by history changes, never by restarts. Both ends are an error (2200H), never
//! a wrap.
//!
//! **Installations upgraded from 0.2.0** already handed out tokens above 2^53 (0.2.0 put
//! a 20-bit epoch over a 43-bit counter), and a token must never go backwards, so they
//! keep that layout (`Layout::Wide`): the same rules, with the 20-bit epoch as the era.
//! A JavaScript client of such an installation reads tokens as strings or BigInt.

use std::cell::Cell;

use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::backend;
use crate::eras::{self, Current, Record};
use crate::error::LockError;
use crate::settings::{self, Durability};
use crate::statements::{first_value, Statement};

/// The highest token any layout hands out to a client that holds it in a double.
pub const MAX_SAFE_TOKEN: i64 = (1 << 53) - 1;

/// The claim that the writer of the epoch row holds: a lock id cannot contain a NUL, so no
/// lease's claim can be this one.
const EPOCH_CLAIM: &str = "\u{0}lockext token epoch";

/// How a token is laid out: era over counter.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Layout {
    /// 0.2.0's: a 20-bit epoch over a 43-bit counter; kept by installations upgraded from it.
    Wide,
    /// A 12-bit era over a 41-bit counter: every token fits in a double.
    Safe,
}

impl Layout {
    pub fn code(self) -> u8 {
        match self {
            Layout::Wide => 1,
            Layout::Safe => 2,
        }
    }

    pub fn from_code(code: i64) -> Option<Layout> {
        match code {
            1 => Some(Layout::Wide),
            2 => Some(Layout::Safe),
            _ => None,
        }
    }

    /// The layout a token was minted in: every Wide token is above 2^55 (0.2.0's eras
    /// started at 1), every Safe one at most 2^53 - 1.
    pub fn of(token: i64) -> Layout {
        if token > MAX_SAFE_TOKEN {
            Layout::Wide
        } else {
            Layout::Safe
        }
    }

    pub fn counter_bits(self) -> u32 {
        match self {
            Layout::Wide => 43,
            Layout::Safe => 41,
        }
    }

    /// One past the highest era.
    pub fn era_limit(self) -> i64 {
        match self {
            Layout::Wide => 1 << 20,
            Layout::Safe => 1 << 12,
        }
    }

    /// The lowest era a history on this WAL timeline may use. Wide keeps 0.2.0's rule (its
    /// era, the epoch's high 8 bits, at least the timeline).
    pub fn floor(self, timeline: u32) -> i64 {
        match self {
            Layout::Wide => i64::from(timeline) << 12,
            Layout::Safe => i64::from(timeline) - 1,
        }
    }

    pub fn compose(self, era: i64, counter: i64) -> Result<i64, LockError> {
        if counter >= 1 << self.counter_bits() {
            return Err(LockError::TokensExhausted { what: "counter" });
        }
        if !(0..self.era_limit()).contains(&era) {
            return Err(LockError::TokensExhausted { what: "era" });
        }
        Ok(era << self.counter_bits() | counter)
    }

    pub fn split(self, token: i64) -> (i64, i64) {
        let bits = self.counter_bits();
        (token >> bits, token & ((1 << bits) - 1))
    }
}

/// Which history a token belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct History {
    system: u64,
    timeline: u32,
    database: u32,
    sequence: pg_sys::Oid,
}

impl History {
    fn now() -> Result<History, LockError> {
        Ok(History {
            system: unsafe { pg_sys::GetSystemIdentifier() },
            timeline: unsafe { pg_sys::GetWALInsertionTimeLine() },
            database: backend::database().to_u32(),
            sequence: sequence_oid()?,
        })
    }

    fn matches(&self, c: &Current) -> bool {
        c.system == self.system
            && c.timeline == self.timeline
            && c.sequence == self.sequence.to_u32()
    }
}

/// `lockext.fence_token_seq`, looked up each time (two cache lookups): DROP and CREATE
/// EXTENSION give it a new oid, and that is a new history.
fn sequence_oid() -> Result<pg_sys::Oid, LockError> {
    let oid = unsafe {
        let schema = pg_sys::get_namespace_oid(c"lockext".as_ptr(), true);
        pg_sys::get_relname_relid(c"fence_token_seq".as_ptr(), schema)
    };
    if oid == pg_sys::InvalidOid {
        return Err(LockError::EraRecord {
            detail: "lockext.fence_token_seq is missing".into(),
        });
    }
    Ok(oid)
}

/// The era tokens of this history carry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct InForce {
    history: History,
    layout: Layout,
    era: i64,
    /// Whether `lockext.token_epoch` is known to record this era, committed.
    row_confirmed: bool,
    /// The version of the cluster record this was read from (`eras::version`).
    record: Option<(u64, i64, i64)>,
}

thread_local! {
    // The era in force, as this backend last read it from the cluster record. A history
    // keeps its era as long as the record does; the record is rewritten when any history
    // of the cluster starts an era, and then this backend reads it again before its next
    // grant (a history that came back, such as a reinstall rolled back, may have been
    // given a new era meanwhile, and every backend must mint in the same one).
    static LOCAL: Cell<Option<InForce>> = const { Cell::new(None) };
}

// ---- statements ----------------------------------------------------------------------

// Read under the newest snapshot (`read_latest`).
static READ_ROW: Statement = Statement {
    sql: include_str!("../sql/run/token/read_row.sql"),
    params: &[],
};

static WRITE_ROW: Statement = Statement {
    sql: include_str!("../sql/run/token/write_row.sql"),
    params: &[INT4OID, INT2OID, INT8OID, INT4OID, OIDOID],
};

static LAST_COUNTER: Statement = Statement {
    sql: include_str!("../sql/run/token/last_counter.sql"),
    params: &[],
};

/// `lockext.token_epoch` as the newest snapshot shows it.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub epoch: i64,
    pub layout: Option<Layout>,
    /// Written by this transaction, which may still roll back.
    pub own: bool,
    /// Written in another cluster: the row came with a dump from there.
    pub foreign: bool,
    /// The WAL timeline it was written on.
    pub timeline: u32,
}

fn read_row() -> Option<Row> {
    let row = READ_ROW.read_latest(&[])?;
    let xmin = row.get::<i64>("xmin").unwrap_or(0) as u32;
    let system = unsafe { pg_sys::GetSystemIdentifier() } as i64;
    Some(Row {
        epoch: row.get::<i64>("epoch").unwrap_or(0),
        layout: row.get::<i64>("layout").and_then(Layout::from_code),
        own: unsafe { pg_sys::TransactionIdIsCurrentTransactionId(xmin.into()) },
        foreign: row.get::<i64>("system_identifier") != Some(system),
        timeline: row.get::<i64>("timeline").unwrap_or(0) as u32,
    })
}

// Read under the newest snapshot (`read_latest`).
static HIGHEST_KEPT: Statement = Statement {
    sql: include_str!("../sql/run/token/highest_kept.sql"),
    params: &[],
};

fn highest_kept() -> Option<i64> {
    HIGHEST_KEPT.read_latest(&[])?.get::<i64>("highest")
}

/// What a new era is chosen from, besides the cluster record.
#[derive(Clone, Copy, Debug, Default)]
pub struct Found {
    /// `lockext.token_epoch`, if any.
    pub row: Option<Row>,
    /// The highest token in lockext's tables, if any.
    pub highest_kept: Option<i64>,
}

// ---- eras ----------------------------------------------------------------------------

/// The layout and era a new history of this database starts with: see the module
/// comment. A pure function of what is recorded, so it can be tested on its own.
pub fn next_era(
    record: &Record,
    database: u32,
    found: Found,
    timeline: u32,
) -> Result<(Layout, i64), LockError> {
    let row = found.row;
    let kept = found.highest_kept.map(|t| (Layout::of(t), t));
    // Layout: 0.2.0's as soon as anything says it was used here (the row, this database's
    // last history, any database of this cluster, a token in the tables), since a token
    // must never go below one of its tokens; else the safe one.
    let wide = row.and_then(|r| r.layout) == Some(Layout::Wide)
        || record.current.get(&database).map(|c| c.layout) == Some(Layout::Wide.code())
        || record.max.contains_key(&Layout::Wide.code())
        || kept.map(|(layout, _)| layout) == Some(Layout::Wide);
    let layout = if wide { Layout::Wide } else { Layout::Safe };
    // The highest era that may have been used before, of this layout.
    let mut base: Option<i64> = record.max.get(&layout.code()).copied();
    if let Some(row) = row.filter(|row| row.layout.unwrap_or(layout) == layout) {
        // The row can lag the era in force by one: its source may have started an era and
        // handed out tokens in it before the row's write committed. A row from another
        // cluster (a dump restored here) is therefore passed by two.
        let lag = i64::from(row.foreign);
        base = base.max(Some(row.epoch + lag));
    }
    if let Some((kept_layout, token)) = kept.filter(|(l, _)| *l == layout) {
        base = base.max(Some(kept_layout.split(token).0));
    }
    let mut era = layout.floor(timeline).max(0);
    if let Some(base) = base {
        // A new timeline (a promotion, a point-in-time recovery) passes the base by one
        // more per timeline it moved on: two branches recovered from one copy of this
        // record get different timelines, so different eras; and a promoted standby also
        // passes one era its old primary may have started without the standby seeing it.
        let last_timeline = record
            .current
            .get(&database)
            .map(|c| c.timeline)
            .or(row.map(|r| r.timeline))
            .unwrap_or(timeline);
        let moved_on = i64::from(timeline.saturating_sub(last_timeline));
        era = era.max(base + 1 + moved_on);
    }
    if era >= layout.era_limit() {
        return Err(LockError::TokensExhausted { what: "era" });
    }
    Ok((layout, era))
}

/// The era in force for this history. When none is recorded yet: with `start`, starts one
/// (recording it in the cluster record first); without, says which one would start.
fn in_force(start: bool) -> Result<InForce, LockError> {
    let history = History::now()?;
    let version = eras::version();
    if let Some(cached) = LOCAL
        .with(|l| l.get())
        .filter(|c| c.history == history && c.record == version)
    {
        return Ok(cached);
    }
    let found_in = |record: &Record| {
        record
            .current
            .get(&history.database)
            .filter(|c| history.matches(c))
            .and_then(|c| Some((Layout::from_code(i64::from(c.layout))?, c.era)))
    };
    let record = eras::read()?;
    let found = || Found {
        row: read_row(),
        highest_kept: highest_kept(),
    };
    // The version the cache will be checked against: the one read, or none when this
    // backend rewrote the record just now (the next grant then reads it back once).
    let mut read_version = version;
    let (layout, era) = match found_in(&record) {
        Some(known) => known,
        None if !start => next_era(&record, history.database, found(), history.timeline)?,
        None => {
            read_version = None;
            let found = found();
            eras::update(|record| {
                if let Some(known) = found_in(record) {
                    return Ok(known); // another backend started it first
                }
                let (layout, era) = next_era(record, history.database, found, history.timeline)?;
                let max = record.max.entry(layout.code()).or_insert(era);
                *max = (*max).max(era);
                record.current.insert(
                    history.database,
                    Current {
                        layout: layout.code(),
                        system: history.system,
                        timeline: history.timeline,
                        sequence: history.sequence.to_u32(),
                        era,
                    },
                );
                Ok((layout, era))
            })?
        }
    };
    let in_force = InForce {
        history,
        layout,
        era,
        row_confirmed: false,
        record: read_version,
    };
    if start || found_in(&record).is_some() {
        LOCAL.with(|l| l.set(Some(in_force)));
    }
    Ok(in_force)
}

/// Makes `lockext.token_epoch` record the era in force, for dumps: a restore elsewhere
/// then starts above it. Only one transaction writes it at a time (the others try again
/// at their next grant); it counts as recorded once read back committed by another.
fn record_row(client: &mut SpiClient<'_>, in_force: &InForce) -> Result<(), LockError> {
    let row = read_row();
    if let Some(row) = row {
        if row.epoch >= in_force.era && row.layout == Some(in_force.layout) && !row.own {
            LOCAL.with(|l| {
                l.set(Some(InForce {
                    row_confirmed: true,
                    ..*in_force
                }))
            });
            return Ok(());
        }
        if row.own && row.epoch >= in_force.era {
            return Ok(()); // written by this transaction already
        }
    }
    if crate::claims::try_claim_alone(EPOCH_CLAIM) {
        let h = in_force.history;
        let era =
            i32::try_from(in_force.era).map_err(|_| LockError::TokensExhausted { what: "era" })?;
        WRITE_ROW.run(
            client,
            &[
                era.into(),
                i16::from(in_force.layout.code()).into(),
                (h.system as i64).into(),
                (h.timeline as i32).into(),
                pg_sys::Oid::from(h.database).into(),
            ],
        )?;
    }
    Ok(())
}

// ---- minting ---------------------------------------------------------------------------

/// The next counter value, on disk before it is returned (see the module comment): from
/// shared memory when lockext is preloaded (`counter.rs`), else from the sequence.
fn next_counter(client: &mut SpiClient<'_>, sequence: pg_sys::Oid) -> Result<i64, LockError> {
    if settings::preloaded() {
        return crate::counter::next(client, sequence);
    }
    unsafe {
        // lockext's functions run as the extension's owner: no permission check to make.
        let value = pg_sys::ffi::pg_guard_ffi_boundary(|| nextval_internal(sequence, false));
        let lsn = sequence_page_lsn(sequence);
        if lsn > pg_sys::GetFlushRecPtr(std::ptr::null_mut()) {
            pg_sys::XLogFlush(lsn);
        }
        Ok(value)
    }
}

// commands/sequence.h, which pgrx does not bind; called through pgrx's guard, so that its
// ERROR (2200H at the sequence's MAXVALUE) unwinds as any other.
unsafe extern "C-unwind" {
    fn nextval_internal(relid: pg_sys::Oid, check_permissions: bool) -> i64;
}

/// The LSN of the sequence's page: of the WAL record that covers every value handed out so
/// far, since nextval logs before it hands out a value the last record did not cover.
unsafe fn sequence_page_lsn(sequence: pg_sys::Oid) -> u64 {
    unsafe {
        let rel = pg_sys::relation_open(sequence, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let buffer = pg_sys::ReadBuffer(rel, 0);
        pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_SHARE as i32);
        let header = pg_sys::BufferGetPage(buffer) as *const pg_sys::PageHeaderData;
        let lsn = (u64::from((*header).pd_lsn.xlogid) << 32) | u64::from((*header).pd_lsn.xrecoff);
        pg_sys::UnlockReleaseBuffer(buffer);
        pg_sys::relation_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        lsn
    }
}

/// Mints one token for a grant. Call only once the grant is decided (past the lock id's
/// gate, the lock found free, or inside the statement that grants: `grant_token`): a
/// token minted and not used is only a gap.
pub fn mint(client: &mut SpiClient<'_>) -> Result<i64, LockError> {
    let in_force = in_force(true)?;
    if !in_force.row_confirmed {
        record_row(client, &in_force)?;
    }
    let counter = next_counter(client, in_force.history.sequence)?;
    let token = in_force.layout.compose(in_force.era, counter)?;
    if settings::durability() == Durability::Grant {
        crate::commit::require_flush();
    }
    Ok(token)
}

thread_local! {
    // Set while this backend runs a statement that calls lockext.grant_token()
    // (`minting_in`): the only place where that function mints.
    static MINTING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `statement`, which may call lockext.grant_token() to mint the token of the grant it
/// makes. Inside a lockext function, whose SET clause pinned search_path.
pub fn minting_in<R>(statement: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            MINTING.with(|m| m.set(self.0));
        }
    }
    let _reset = Reset(MINTING.with(|m| m.replace(true)));
    statement()
}

/// The token of the grant that the calling statement is making: minted inside it, once its
/// checks found the lock id free (sql/run/exclusive/insert_free.sql), so that a statement
/// that grants nothing mints nothing. Not granted to anyone, and refused outside
/// `minting_in`: that is how it needs no SET clause of its own (a GUC saved and restored on
/// every grant), since it runs only inside lock_acquire, which pinned search_path.
#[pg_extern(volatile, parallel_unsafe)]
fn grant_token() -> i64 {
    if !MINTING.with(|m| m.get()) {
        pgrx::error!("lockext.grant_token() mints only inside lockext's own grants");
    }
    Spi::connect_mut(mint).unwrap_or_else(|e| e.report())
}

// ---- issued tokens -------------------------------------------------------------------

/// The highest token that can have been handed out in this database: the era in force
/// over the last counter value.
pub fn highest_issued(client: &mut SpiClient<'_>) -> Result<i64, LockError> {
    let in_force = in_force(false)?;
    // Preloaded, the sequence holds a reservation ahead of the counter: the counter itself
    // says what was handed out, once this server has handed out any (after a restart, the
    // reservation is all there is, and every grant from then on is above it).
    let kept = settings::preloaded()
        .then(|| crate::counter::issued(in_force.history.sequence))
        .flatten();
    let counter = match kept {
        Some(counter) => counter,
        None => first_value::<i64>(LAST_COUNTER.run(client, &[])?)?.unwrap_or(0),
    };
    let max_counter = (1 << in_force.layout.counter_bits()) - 1;
    in_force
        .layout
        .compose(in_force.era, counter.min(max_counter))
}

/// Refuses a token that lockext never issued: a forged one would raise a resource's
/// high-water mark past every real holder and lock them all out.
pub fn require_issued(client: &mut SpiClient<'_>, token: i64) -> Result<(), LockError> {
    let highest = highest_issued(client)?;
    if token > highest {
        crate::stats::count(crate::stats::Counter::FenceForged);
        return Err(LockError::TokenNeverIssued { token, highest });
    }
    Ok(())
}

/// The layout and era this installation's tokens carry now, starting the era (as the next
/// grant would) if this history has none yet: so the cluster's record learns of it before
/// any grant. The upgrade from 0.2.0 calls it, so that a reinstall or a database dropped
/// and created again right after the upgrade still knows 0.2.0's layout was used here.
// SECURITY INVOKER, becoming the tables' owner inside (`caller::as_member`), so that the
// caller's privileges can be checked.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn token_era() -> TableIterator<'static, (name!(layout, i32), name!(era, i32))> {
    crate::caller::as_member(|| {
        crate::backend::writable_server()?;
        Spi::connect_mut(|client| {
            let in_force = in_force(true)?;
            if !in_force.row_confirmed {
                record_row(client, &in_force)?;
            }
            Ok::<_, LockError>((i32::from(in_force.layout.code()), in_force.era as i32))
        })
    })
    .map(TableIterator::once)
    .unwrap_or_else(|e| e.report())
}

/// A token taken apart: the layout it was minted in (2 for every token of an installation
/// made with 0.3.0 or later, 1 for one upgraded from 0.2.0), its era and its counter.
// Its C symbol, token_parts_0_3_wrapper, is one no older library has (compat.rs).
#[pg_extern(immutable, parallel_safe, strict, name = "token_parts")]
#[search_path(pg_catalog, pg_temp)]
fn token_parts_0_3(
    fence_token: i64,
) -> TableIterator<'static, (name!(layout, i32), name!(era, i32), name!(counter, i64))> {
    let layout = Layout::of(fence_token);
    let (era, counter) = layout.split(fence_token);
    TableIterator::once((i32::from(layout.code()), era as i32, counter))
}
