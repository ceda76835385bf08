//! The token ledger: the cluster's one record of how high tokens have gone, carried by the
//! WAL.
//!
//! A token is an era over a counter (`token.rs`). Both parts are decided here, for the whole
//! cluster, from three numbers and the server's WAL timeline:
//!
//! - `reserved`: the counter's reservation. Every counter this cluster handed out, in any
//!   database, is at or below it. A counter is handed out only once a reservation at or
//!   above it is on disk, so a crash, a restart or a failover never goes back below it.
//! - `base` and `timeline`: the era in force is `layout.floor(current timeline) + base`.
//!   A promotion or a point-in-time recovery moves the cluster to a new, higher timeline,
//!   so the era rises by itself, with nothing to write first: a promoted standby's tokens
//!   are above every token its old primary handed out, however many changes it missed.
//!   `timeline` is the one the ledger was last written on: a ledger that finds itself on a
//!   lower timeline (copied into a new cluster for `pg_upgrade`, which starts at timeline
//!   1) moves `base` up so that the era never goes down.
//! - `layout`: Safe (every token at most 2^53 - 1) or Wide (0.2.0's, above 2^55), once Wide
//!   always Wide.
//!
//! **How it travels.** Every change is a WAL record of lockext's own resource manager
//! (`RegisterCustomRmgr`, id `RMGR_ID`) carrying the whole new state, flushed before any
//! token under it is handed out. A standby, a base backup being restored and an archive
//! recovery replay those records; a crash recovery too. Because WAL before a checkpoint is
//! not replayed again, the state is also kept in `pg_lockext/ledger` in the data directory,
//! rewritten (temporary file, fsync, rename, fsync of the directory) after each record and
//! before a checkpoint can pass the record (`DELAY_CHKPT_START`, as PostgreSQL does for its
//! own state kept outside the WAL), and by the replay of each record. The file is a
//! materialized view of the WAL: a base backup copies it (at least as new as the backup's
//! start checkpoint) and replays the records after. A newer file than the WAL it is
//! replayed with only makes tokens jump higher. Replaying merges (the maximum of each
//! part), so a record replayed twice, or over a newer file, changes nothing.
//!
//! **What it does not carry**: a dump (`pg_dump` never copies it) and `pg_upgrade` (which
//! copies relations only). For those, each database's tables carry evidence of the tokens
//! its history handed out (`token.rs` adopts it: the era goes above it). A copy of the
//! file is carried by hand into a new cluster made by `pg_upgrade` (docs/upgrading.md).
//!
//! The ledger needs lockext preloaded: a resource manager and shared memory exist only when
//! the library is loaded at server start. Without it no token is minted (55000).

use std::ffi::CStr;
use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use pgrx::lwlock::PgLwLock;
use pgrx::pg_sys;
use pgrx::{pg_guard, pg_shmem_init, PGRXSharedMemory};

use crate::backend;
use crate::error::LockError;
use crate::pgversion;
use crate::settings;
use crate::shmem::{self, Table};

/// The highest token any layout hands out to a client that holds it in a double.
pub const MAX_SAFE_TOKEN: i64 = (1 << 53) - 1;

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

    /// The highest counter of an era.
    pub fn max_counter(self) -> i64 {
        (1 << self.counter_bits()) - 1
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

/// lockext's custom WAL resource manager. 128 is reserved for extensions in development;
/// this one is outside the ids listed as taken by other extensions when it was chosen.
const RMGR_ID: u8 = 173;
const RMGR_NAME: &CStr = c"lockext";
/// The one record kind: "the ledger is now at least this". Resource managers own the high
/// four bits of xl_info.
const XLOG_LEDGER_RAISE: u8 = 0x10;

/// How far a new reservation reaches: `BLOCK` counters past the one before (or past the
/// last counter handed out, when that is higher), so one WAL flush and one file rewrite per
/// `BLOCK` grants.
const BLOCK: i64 = 1024;
/// The next reservation is written once fewer than this many counters are left under the
/// one on disk, by the grant that sees it, after that grant has its token and has let go of
/// the ledger's lock: the grants after it take the counters left meanwhile, and wait only
/// if they use them all before the write is done. So the reservation reaches at most
/// `BLOCK + REFILL_AT` past the last counter handed out, the gap a crash can leave.
const REFILL_AT: i64 = BLOCK / 2;

const DIR: &str = "pg_lockext";
const FILE: &str = "ledger";
const HEADER: &str = "lockext-ledger 1";
/// 0.3.0's record of eras (`max LAYOUT ERA` lines): read once, when a cluster upgraded from
/// 0.3.0 has no ledger yet.
const ERAS_0_3: &str = "eras";

/// What the WAL and the file carry.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct State {
    /// `Layout::code`; 0 for a ledger that has never been written.
    pub layout: u8,
    pub base: i64,
    pub reserved: i64,
    /// The WAL timeline the ledger was last written on.
    pub timeline: u32,
}

impl State {
    pub fn layout(&self) -> Layout {
        Layout::from_code(i64::from(self.layout)).unwrap_or(Layout::Safe)
    }

    /// The era in force on `timeline`.
    pub fn era(&self, timeline: u32) -> i64 {
        self.layout().floor(timeline).max(0) + self.base
    }

    /// The same era on `timeline` as this state has on the one it was written on, or a
    /// higher one: a timeline lower than the ledger's (a new cluster) must not lower it.
    pub fn moved_to(self, timeline: u32) -> State {
        if timeline >= self.timeline {
            return self;
        }
        let layout = self.layout();
        let lost = layout.floor(self.timeline).max(0) - layout.floor(timeline).max(0);
        State {
            base: self.base + lost + 1,
            timeline,
            ..self
        }
    }

    /// The state at least as high as both: Wide beats Safe (every Wide token is above every
    /// Safe one), else the higher era and the higher reservation.
    pub fn merge(self, other: State, timeline: u32) -> State {
        let (a, b) = (self.moved_to(timeline), other.moved_to(timeline));
        if a.layout == 0 {
            return b;
        }
        if b.layout == 0 {
            return a;
        }
        if a.layout != b.layout {
            // The era base is the Wide one's; the counter is one for both layouts, so its
            // reservation is the higher one.
            let wide = if a.layout() == Layout::Wide { a } else { b };
            return State {
                reserved: a.reserved.max(b.reserved),
                timeline: a.timeline.max(b.timeline),
                ..wide
            };
        }
        State {
            layout: a.layout,
            base: a.base.max(b.base),
            reserved: a.reserved.max(b.reserved),
            timeline: a.timeline.max(b.timeline),
        }
    }

    fn encode(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        out[0] = self.layout;
        out[4..8].copy_from_slice(&self.timeline.to_le_bytes());
        out[8..16].copy_from_slice(&self.base.to_le_bytes());
        out[16..24].copy_from_slice(&self.reserved.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<State> {
        let b: &[u8; 24] = bytes.get(..24)?.try_into().ok()?;
        Some(State {
            layout: b[0],
            timeline: u32::from_le_bytes(b[4..8].try_into().ok()?),
            base: i64::from_le_bytes(b[8..16].try_into().ok()?),
            reserved: i64::from_le_bytes(b[16..24].try_into().ok()?),
        })
    }

    pub fn render(&self) -> String {
        format!(
            "{HEADER}\nlayout {}\nbase {}\nreserved {}\ntimeline {}\n",
            self.layout, self.base, self.reserved, self.timeline
        )
    }

    pub fn parse(text: &str) -> Result<State, String> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(format!("the first line is not \"{HEADER}\""));
        }
        let mut state = State::default();
        let mut seen = 0;
        for line in lines.filter(|l| !l.trim().is_empty()) {
            let bad = || format!("line not understood: {line:?}");
            let (key, value) = line.split_once(' ').ok_or_else(bad)?;
            match key {
                "layout" => state.layout = value.parse().map_err(|_| bad())?,
                "base" => state.base = value.parse().map_err(|_| bad())?,
                "reserved" => state.reserved = value.parse().map_err(|_| bad())?,
                "timeline" => state.timeline = value.parse().map_err(|_| bad())?,
                _ => return Err(bad()),
            }
            seen += 1;
        }
        let valid = seen == 4
            && Layout::from_code(i64::from(state.layout)).is_some()
            && (0..1 << 20).contains(&state.base)
            && state.reserved >= 0
            && state.timeline >= 1;
        if !valid {
            return Err("a value is missing or out of range".into());
        }
        Ok(state)
    }
}

#[derive(Clone, Copy, Default)]
pub struct Shared {
    /// The file has been read into `state` since the server started.
    loaded: bool,
    state: State,
    /// The last counter handed out, once this server has handed out one since it started
    /// (or since the last replayed record); before that the counter starts at `reserved`.
    issued: Option<i64>,
}

// Plain numbers only, no pointers: safe to place in shared memory.
unsafe impl PGRXSharedMemory for Shared {}

static LEDGER: PgLwLock<Shared> = unsafe { PgLwLock::new(c"lockext_token_ledger") };

/// Held by whoever writes the ledger (a record, its flush, the file), for as long as it
/// writes: writes follow one another in the order of the states they carry, while grants
/// under the reservation already on disk go on, under `LEDGER` alone. Taken before
/// `LEDGER`, never after it.
static WRITING: Table<(), ()> = Table::new(c"lockext_token_ledger_write", || 0, |_| (), (), ());

pub fn init_shared_memory() {
    pg_shmem_init!(LEDGER);
    WRITING.request();
}

/// The writer's lock, waited for; Err without shared memory (lockext not preloaded).
fn writing() -> Result<shmem::Write<(), ()>, LockError> {
    WRITING.write().ok_or(LockError::LedgerNeedsPreload)
}

/// Registers the resource manager: only while shared_preload_libraries is processed.
pub fn register_rmgr() {
    // In the postmaster's memory, which every server process inherits.
    let rmgr = Box::leak(Box::new(pg_sys::RmgrData {
        rm_name: RMGR_NAME.as_ptr(),
        rm_redo: Some(ledger_redo),
        rm_desc: Some(ledger_desc),
        rm_identify: Some(ledger_identify),
        rm_startup: None,
        rm_cleanup: None,
        rm_mask: None,
        rm_decode: None,
    }));
    unsafe { pg_sys::RegisterCustomRmgr(RMGR_ID, rmgr) };
}

fn failed(what: &str, e: impl std::fmt::Display) -> LockError {
    LockError::EraRecord {
        detail: format!("{what}: {e}"),
    }
}

fn dir() -> PathBuf {
    backend::data_dir().join(DIR)
}

/// The timeline this server writes WAL on. Refused during recovery (a hot standby's
/// backends read 0 there, which would move the ledger): only the redo function touches the
/// ledger then, with its record's timeline.
fn timeline_now() -> Result<u32, LockError> {
    backend::writable_server()?;
    let timeline = backend::wal_timeline();
    if timeline == 0 {
        return Err(LockError::ReadOnlyServer);
    }
    Ok(timeline)
}

/// The ledger file as it is on disk; None if there is none.
pub fn read_file() -> Result<Option<State>, LockError> {
    let path = dir().join(FILE);
    match fs::read_to_string(&path) {
        Ok(text) => State::parse(&text)
            .map(Some)
            .map_err(|e| failed(&path.display().to_string(), e)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(failed(&format!("cannot read {}", path.display()), e)),
    }
}

/// 0.3.0's record of eras, as the ledger it implies: an era above every era 0.3.0 used in
/// this cluster, in the highest layout it used.
fn from_eras_0_3(timeline: u32) -> Result<Option<State>, LockError> {
    let path = dir().join(ERAS_0_3);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(failed(&format!("cannot read {}", path.display()), e)),
    };
    if text.lines().next() != Some("lockext-eras 1") {
        return Err(failed(
            &path.display().to_string(),
            "the first line is not \"lockext-eras 1\"",
        ));
    }
    let mut highest: Option<(Layout, i64)> = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_ascii_whitespace().collect();
        if let ["max", layout, era] = words[..] {
            let bad = || failed(&path.display().to_string(), format!("bad line {line:?}"));
            let layout = layout
                .parse::<i64>()
                .ok()
                .and_then(Layout::from_code)
                .ok_or_else(bad)?;
            let era = era.parse::<i64>().map_err(|_| bad())?;
            highest = match highest {
                Some((Layout::Wide, _)) if layout == Layout::Safe => highest,
                Some((l, e)) if l == layout => Some((l, e.max(era))),
                _ => Some((layout, era)),
            };
        }
    }
    Ok(highest.map(|(layout, era)| State {
        layout: layout.code(),
        base: (era + 1 - layout.floor(timeline).max(0)).max(0),
        reserved: 0,
        timeline,
    }))
}

/// Reads the file into shared memory once per server start (and merges, since a replayed
/// record may already be there).
fn load(shared: &mut Shared, timeline: u32) -> Result<(), LockError> {
    if shared.loaded {
        return Ok(());
    }
    let on_disk = match read_file()? {
        Some(state) => Some(state),
        None => from_eras_0_3(timeline)?,
    };
    if let Some(state) = on_disk {
        shared.state = shared.state.merge(state, timeline);
    }
    shared.loaded = true;
    Ok(())
}

/// Writes the state durably: a temporary file, fsync, rename, fsync of the directory (and
/// of the data directory, the first time the directory is made).
fn write_file(state: &State) -> Result<(), LockError> {
    let dir = dir();
    let made = !dir.exists();
    let path = dir.join(FILE);
    let write = || -> std::io::Result<()> {
        if made {
            fs::create_dir_all(&dir)?;
        }
        let tmp = dir.join(format!("{FILE}.tmp"));
        let mut f = File::create(&tmp)?;
        f.write_all(state.render().as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        File::open(&dir)?.sync_all()?;
        if made {
            File::open(dir.parent().unwrap_or(Path::new(".")))?.sync_all()?;
        }
        Ok(())
    };
    write().map_err(|e| failed(&format!("cannot write {}", path.display()), e))
}

/// Clears `DELAY_CHKPT_START` when dropped, on every path out.
struct CheckpointHeld;

impl CheckpointHeld {
    fn new() -> CheckpointHeld {
        backend::delay_checkpoint_start(true);
        CheckpointHeld
    }
}

impl Drop for CheckpointHeld {
    fn drop(&mut self) {
        backend::delay_checkpoint_start(false);
    }
}

/// Puts `next` on disk: a WAL record, flushed, then the file, both before a checkpoint can
/// complete past the record. Call holding `WRITING`; shared memory is the caller's to set.
fn write_out(next: &State) -> Result<(), LockError> {
    let bytes = next.encode();
    let _held = CheckpointHeld::new();
    unsafe {
        pg_sys::XLogBeginInsert();
        pgversion::wal_register(&bytes);
        let lsn = pg_sys::XLogInsert(RMGR_ID, XLOG_LEDGER_RAISE);
        pg_sys::XLogFlush(lsn);
    }
    write_file(next)
}

/// The ledger's state now, read from the file if this server has not yet.
pub fn state() -> Result<State, LockError> {
    require_preloaded()?;
    let timeline = timeline_now()?;
    {
        let shared = LEDGER.share();
        if shared.loaded {
            return Ok(shared.state);
        }
    }
    let mut shared = LEDGER.exclusive();
    load(&mut shared, timeline)?;
    Ok(shared.state)
}

fn require_preloaded() -> Result<(), LockError> {
    if !settings::preloaded() {
        return Err(LockError::LedgerNeedsPreload);
    }
    Ok(())
}

/// The state read from disk only, for a backend of a server that did not preload lockext
/// (fence checks still need to know what was issued).
pub fn state_unpreloaded() -> Result<Option<State>, LockError> {
    let timeline = timeline_now()?;
    Ok(match read_file()? {
        Some(state) => Some(state.moved_to(timeline)),
        None => from_eras_0_3(timeline)?,
    })
}

/// Raises the ledger to at least `wanted` (merged, never lowered), on disk before it
/// returns. Returns the state in force.
pub fn raise(wanted: State) -> Result<State, LockError> {
    require_preloaded()?;
    let timeline = timeline_now()?;
    let _writing = writing()?;
    // The ledger stays locked while the raise is written: no token may be handed out under
    // the state it replaces once evidence of a higher history is known (rare: an adoption).
    let mut shared = LEDGER.exclusive();
    load(&mut shared, timeline)?;
    let current = shared.state;
    let next = current.merge(wanted, timeline);
    if next != current {
        let next = State { timeline, ..next };
        check_era(&next, timeline)?;
        write_out(&next)?;
        shared.state = next;
        if next.reserved > current.reserved {
            // Counters below a raised reservation may have been handed out elsewhere.
            shared.issued = None;
        }
    }
    Ok(shared.state)
}

/// Makes the next token this server hands out higher than `token`, a token handed out by
/// another server's ledger for a lock id that now lives here (a shard moved on a Citus
/// cluster: `citus.rs`). Exact, not a margin: the era in force becomes the token's era if
/// that is higher, and the counter goes past the token's; a write (flushed before it
/// returns) only when the reservation on disk does not already cover it. Nothing when the
/// next token is already higher.
pub fn raise_past(token: i64) -> Result<(), LockError> {
    require_preloaded()?;
    let timeline = timeline_now()?;
    let layout = Layout::of(token);
    let (era, counter) = layout.split(token);
    // Whether the next token is above `token` already, or can be by skipping counters the
    // reservation on disk covers (a gap); None when a write must come first.
    let covered = |shared: &mut Shared| -> Option<()> {
        let state = shared.state;
        if state.layout == 0 || state.timeline != timeline {
            return None;
        }
        match (state.layout(), layout) {
            (Layout::Wide, Layout::Safe) => return Some(()),
            (a, b) if a != b => return None,
            _ => {}
        }
        let now = state.era(timeline);
        if era < now {
            return Some(());
        }
        let issued = shared.issued.unwrap_or(state.reserved);
        if era == now && (issued >= counter || counter <= state.reserved) {
            shared.issued = Some(issued.max(counter));
            return Some(());
        }
        None
    };
    {
        let mut shared = LEDGER.exclusive();
        load(&mut shared, timeline)?;
        if covered(&mut shared).is_some() {
            return Ok(());
        }
    }
    let _writing = writing()?;
    // As in `raise`: no token under the state being replaced while it is written.
    let mut shared = LEDGER.exclusive();
    load(&mut shared, timeline)?;
    if covered(&mut shared).is_some() {
        return Ok(());
    }
    let state = shared.state;
    if state.layout != 0 && state.layout() != layout {
        // A Safe ledger below a Wide token: never on Citus, which lockext serves only
        // in layout 2 (PostgreSQL 16 and later, never upgraded from 0.2.0).
        return Err(LockError::TokensExhausted { what: "era" });
    }
    let floor = layout.floor(timeline).max(0);
    let now = if state.layout == 0 {
        floor
    } else {
        state.era(timeline)
    };
    let base = if state.layout == 0 { 0 } else { state.base };
    let issued = shared.issued.unwrap_or(state.reserved).max(counter);
    let next = State {
        layout: layout.code(),
        base: base + (era - now).max(0),
        reserved: (state.reserved.max(counter) + BLOCK).min(layout.max_counter()),
        timeline,
    };
    check_era(&next, timeline)?;
    write_out(&next)?;
    shared.state = next;
    shared.issued = Some(issued);
    Ok(())
}

fn check_era(state: &State, timeline: u32) -> Result<(), LockError> {
    if state.era(timeline) >= state.layout().era_limit() {
        return Err(LockError::TokensExhausted { what: "era" });
    }
    Ok(())
}

/// The next token: the era in force over the next counter, the counter on disk first.
///
/// The ledger's lock is held only while a counter is taken from the reservation on disk,
/// never across a write: a grant that finds the reservation running low writes the next
/// one after it has its token (`REFILL_AT`), under `WRITING`, while the grants after it
/// take what is left; one that finds nothing left (or a new timeline, or a cluster's first
/// token) waits for `WRITING` and writes, or finds the write done, and looks again.
pub fn next_token() -> Result<Minted, LockError> {
    require_preloaded()?;
    let timeline = timeline_now()?;
    loop {
        let taken = {
            let mut shared = LEDGER.exclusive();
            load(&mut shared, timeline)?;
            take_reserved(&mut shared, timeline)?
        };
        match taken {
            Some((token, running_low)) => {
                // Only one grant writes ahead; the others, finding the lock taken, go on.
                if running_low {
                    if let Some(_writing) = WRITING.try_write() {
                        reserve(timeline, Need::Ahead)?;
                    }
                }
                return Ok(token);
            }
            None => {
                let _writing = writing()?;
                reserve(timeline, Need::Now)?;
            }
        }
    }
}

/// A token as `next_token` answers it: its layout, its era, the token.
type Minted = (Layout, i64, i64);

/// A counter under the reservation on disk, and whether the reservation is running low;
/// None when a write must come first (no counter left, the timeline moved, no token yet).
fn take_reserved(shared: &mut Shared, timeline: u32) -> Result<Option<(Minted, bool)>, LockError> {
    if shared.state.layout == 0 || shared.state.timeline != timeline {
        return Ok(None);
    }
    let layout = shared.state.layout();
    let max_counter = layout.max_counter();
    let issued = shared.issued.unwrap_or(shared.state.reserved);
    if issued >= max_counter {
        return Err(LockError::TokensExhausted { what: "counter" });
    }
    let counter = issued + 1;
    if counter > shared.state.reserved {
        return Ok(None);
    }
    let era = shared.state.era(timeline);
    let token = layout.compose(era, counter)?;
    shared.issued = Some(counter);
    let low = running_low(shared.state.reserved, counter, max_counter);
    Ok(Some(((layout, era, token), low)))
}

/// Fewer than `REFILL_AT` counters left under `reserved` past `issued`, and more to reserve.
fn running_low(reserved: i64, issued: i64, max_counter: i64) -> bool {
    reserved - issued < REFILL_AT && reserved < max_counter
}

/// Why `reserve` is called: a grant cannot go on without a write (`Now`), or the
/// reservation is running low (`Ahead`).
#[derive(Clone, Copy, PartialEq)]
enum Need {
    Now,
    Ahead,
}

/// Writes the next reservation, if it is still needed once `WRITING` is held (the caller
/// holds it): another writer may have written it meanwhile. The ledger's lock is held only
/// to read the state and to publish the new one, never while it is written out, so grants
/// under the reservation on disk go on; no other process changes the state meanwhile,
/// since every write holds `WRITING` (a standby's replay hands out no token).
fn reserve(timeline: u32, need: Need) -> Result<(), LockError> {
    let (next, issued) = {
        let mut shared = LEDGER.exclusive();
        load(&mut shared, timeline)?;
        let state = shared.state;
        let fresh = state.layout == 0;
        let layout = if fresh { Layout::Safe } else { state.layout() };
        let max_counter = layout.max_counter();
        let issued = shared.issued.unwrap_or(state.reserved);
        let needed = match need {
            Need::Now => fresh || state.timeline != timeline || issued >= state.reserved,
            Need::Ahead => running_low(state.reserved, issued, max_counter),
        };
        if !needed || (state.reserved >= max_counter && !fresh && state.timeline == timeline) {
            return Ok(());
        }
        // A fresh cluster's first state (Safe, era from the timeline, base 0) is written
        // with its first reservation; a timeline change is written too, so that the file
        // says which timeline its era was last in force on.
        let next = State {
            layout: layout.code(),
            reserved: (state.reserved.max(issued) + BLOCK).min(max_counter),
            timeline,
            ..state
        };
        check_era(&next, timeline)?;
        (next, issued)
    };
    write_out(&next)?;
    let mut shared = LEDGER.exclusive();
    shared.state = next;
    // A server that has handed out nothing since it started (or since a raise) goes on
    // from the reservation it found: counters up to it may have been handed out before.
    if shared.issued.is_none() {
        shared.issued = Some(issued);
    }
    Ok(())
}

/// The highest token this cluster can have handed out: the era in force over the last
/// counter handed out (the reservation, before this server has handed out any).
pub fn highest_issued() -> Result<Option<i64>, LockError> {
    let timeline = timeline_now()?;
    let (state, issued) = if settings::preloaded() {
        let state = state()?;
        let issued = LEDGER.share().issued;
        (Some(state), issued)
    } else {
        (state_unpreloaded()?, None)
    };
    let Some(state) = state.filter(|s| s.layout != 0) else {
        return Ok(None);
    };
    let layout = state.layout();
    let counter = issued.unwrap_or(state.reserved).min(layout.max_counter());
    let era = state.era(timeline).min(layout.era_limit() - 1);
    layout.compose(era, counter).map(Some)
}

// ---- the resource manager's callbacks -------------------------------------------------

/// The record's data: `XLogRecGetData`, which pgrx does not bind (a macro).
unsafe fn record_data(record: *mut pg_sys::XLogReaderState) -> &'static [u8] {
    unsafe {
        let decoded = (*record).record;
        if decoded.is_null() || (*decoded).main_data.is_null() {
            return &[];
        }
        std::slice::from_raw_parts(
            (*decoded).main_data as *const u8,
            (*decoded).main_data_len as usize,
        )
    }
}

/// Replays a raise: shared memory and the file become at least the record's state. Run by
/// the startup process (crash recovery, a standby, an archive recovery).
#[pg_guard]
unsafe extern "C-unwind" fn ledger_redo(record: *mut pg_sys::XLogReaderState) {
    let Some(state) = (unsafe { State::decode(record_data(record)) }) else {
        pgrx::error!("lockext: a ledger record of the wrong size");
    };
    let mut shared = LEDGER.exclusive();
    // Replay runs along one line of history: a record of an earlier timeline (replayed
    // again after a crash that followed a promotion) meets a file written on a later one.
    // Merged at the later timeline, nothing moves: only a ledger that comes from another
    // cluster, met by a running server on a lower timeline, is moved up (`moved_to`).
    let on_disk = match read_file() {
        Ok(state) => state,
        Err(e) => pgrx::error!("lockext: {e}"),
    };
    let timeline = state
        .timeline
        .max(shared.state.timeline)
        .max(on_disk.map(|s| s.timeline).unwrap_or(0));
    if let Err(e) = load(&mut shared, timeline) {
        pgrx::error!("lockext: {e}");
    }
    let next = shared.state.merge(state, timeline);
    if next != shared.state {
        if let Err(e) = write_file(&next) {
            pgrx::error!("lockext: {e}");
        }
        shared.state = next;
    }
    // Nothing replayed was handed out by this server: its counter starts at the reservation.
    shared.issued = None;
}

#[pg_guard]
unsafe extern "C-unwind" fn ledger_desc(
    buf: pg_sys::StringInfo,
    record: *mut pg_sys::XLogReaderState,
) {
    if let Some(state) = unsafe { State::decode(record_data(record)) } {
        let text = format!(
            "layout {} base {} reserved {} timeline {}",
            state.layout, state.base, state.reserved, state.timeline
        );
        if let Ok(text) = std::ffi::CString::new(text) {
            unsafe { pg_sys::appendStringInfoString(buf, text.as_ptr()) };
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn ledger_identify(info: u8) -> *const std::os::raw::c_char {
    if info & !(pg_sys::XLR_INFO_MASK as u8) == XLOG_LEDGER_RAISE {
        c"RAISE".as_ptr()
    } else {
        std::ptr::null()
    }
}
