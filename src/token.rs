//! Fencing tokens: their layout, and what makes a database's tokens safe to hand out.
//!
//! A token is only worth anything if no later grant can ever get a lower or equal one, and
//! only if every client can hold it exactly: a JavaScript `number`, and any JSON parser that
//! reads numbers as doubles, is exact only up to 2^53 - 1. So a token is
//!
//! ```text
//! bit 63 ... 53   52 ....... 41   40 ........................................ 0
//!     0 (unused) |  era (12 bits) |  counter (41 bits)                           |
//! ```
//!
//! and at most 9 007 199 254 740 991. A fresh cluster's first token is 1 (era 0, counter 1).
//!
//! Both parts come from the cluster's **ledger** (`ledger.rs`): one counter for every
//! database of the cluster, reserved on disk before it is handed out, and an era that is
//! the WAL timeline's (it rises by itself at every promotion and point-in-time recovery)
//! plus a base. The ledger travels with the WAL: through crashes, standbys, base backups
//! and archive recovery. A reinstall, a new database or a database copied from a template
//! keeps counting on the same counter, so none of them spends an era.
//!
//! What the ledger cannot know is a database's history that did not happen under it: a
//! dump restored from another cluster, a cluster made by `pg_upgrade`, an installation that
//! handed out tokens before this version (0.2.0's layout, 0.3.0's eras). Each database's
//! tables carry evidence of that history: the epoch row `lockext.token_epoch` (the era in
//! force when the database last started one, its layout and the system it was written on)
//! and the tokens in its tables. Before a backend mints its first token in a database, and
//! in every reaper round, lockext **adopts** that evidence: the ledger is raised (never
//! lowered) so that the next token is above every token the evidence says this database's
//! history can have handed out (`wanted`). Evidence this cluster wrote under its ledger
//! needs nothing. The evidence is read once per server rather than once per backend while
//! nothing but lockext's own statements writes lockext's tables (`adopted.rs`). A row from
//! another cluster can lag its source's era by one (its source
//! may mint in a new era before the row's write commits), so it is passed by two.
//!
//! **Limits.** 2^41 - 1 = 2.2 * 10^12 grants per cluster (the counter is shared by every
//! database and continues across eras): 7 years at a sustained 10 000 grants/s. 4 096 eras
//! (0 to 4095), spent only by timelines and by adopting a history from elsewhere, neither
//! of which a non-superuser can cause. A WARNING from era 3840 on, and an error (2200H) at
//! the end of either, never a wrap.
//!
//! **Installations upgraded from 0.2.0** already handed out tokens above 2^53 (0.2.0 put
//! a 20-bit epoch over a 43-bit counter), and a token must never go backwards, so a cluster
//! that has such an installation mints in that layout (`Layout::Wide`), in every database.
//! A JavaScript client of such a cluster reads tokens as strings or BigInt.

use std::cell::Cell;
use std::ffi::CStr;

use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::adopted;
use crate::backend;
use crate::catalog;
use crate::error::{LockError, OrReport};
use crate::ledger::{self, State};
use crate::settings;
use crate::statements::{Args, Statement};

pub use crate::ledger::Layout;

/// The claim that the writer of the epoch row holds: a lock id cannot contain a NUL, so no
/// lease's claim can be this one.
const EPOCH_CLAIM: &str = "\u{0}lockext token epoch";

// ---- evidence ------------------------------------------------------------------------

// Each read under the newest snapshot (`read_latest`): a restore committed after this
// transaction's snapshot is evidence too.
static READ_ROW: Statement = Statement {
    sql: include_str!("../sql/run/token/read_row.sql"),
    params: &[],
};

// The epoch row of an installation whose SQL is 0.3.0's (no `boot`).
static READ_ROW_0_3: Statement = Statement {
    sql: include_str!("../sql/run/token/read_row_0_3.sql"),
    params: &[],
};

// The epoch row of an installation whose SQL is older than 0.3.0 (no layout column; 0.2.0's
// `boot`): always 0.2.0's layout.
static READ_ROW_0_2: Statement = Statement {
    sql: include_str!("../sql/run/token/read_row_0_2.sql"),
    params: &[],
};

static WRITE_ROW: Statement = Statement {
    sql: include_str!("../sql/run/token/write_row.sql"),
    params: &[
        ("epoch", INT4OID),
        ("layout", INT2OID),
        ("system_identifier", INT8OID),
        ("timeline", INT4OID),
        ("database", OIDOID),
    ],
};

/// Whether an adoption may be shared with the server's other backends (`adopted.rs`).
static SHAREABLE: Statement = Statement {
    sql: include_str!("../sql/run/token/shareable.sql"),
    params: &[],
};

/// The highest token in each table of lockext's that holds tokens (a table an older version
/// did not have is skipped): they travel with dumps even when the epoch row does not.
static HIGHEST_KEPT: [(&CStr, Statement); 4] = [
    (
        c"locks",
        Statement {
            sql: include_str!("../sql/run/token/highest_lock.sql"),
            params: &[],
        },
    ),
    (
        c"shared_leases",
        Statement {
            sql: include_str!("../sql/run/token/highest_shared_lease.sql"),
            params: &[],
        },
    ),
    (
        c"resources",
        Statement {
            sql: include_str!("../sql/run/token/highest_resource.sql"),
            params: &[],
        },
    ),
    (
        c"keepalives",
        Statement {
            sql: include_str!("../sql/run/token/highest_keepalive.sql"),
            params: &[],
        },
    ),
];

/// `lockext.token_epoch` as the newest snapshot shows it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Row {
    pub era: i64,
    pub layout: Layout,
    /// Written by this transaction, which may still roll back.
    pub own: bool,
    /// The system identifier of the cluster that wrote it.
    pub system: u64,
}

/// What a database's tables say of the tokens its history handed out.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Evidence {
    pub row: Option<Row>,
    /// The highest token in lockext's tables.
    pub highest_kept: Option<i64>,
}

fn read_row(epoch_table: pg_sys::Oid) -> Option<Row> {
    let has = |column: &CStr| catalog::has_column(epoch_table, column);
    let statement = match (has(c"layout"), has(c"boot")) {
        (true, true) => &READ_ROW,
        (true, false) => &READ_ROW_0_3,
        (false, _) => &READ_ROW_0_2,
    };
    let row = statement.read_latest(Args::new())?;
    let xmin = row.get::<i64>("xmin").unwrap_or(0) as u32;
    let era = row.get::<i64>("epoch").unwrap_or(0);
    // A row of 0.1.0 or 0.2.0 (its `boot` set) is of 0.2.0's layout, whatever a restore put
    // in the layout column; any other row says its layout. A safe-layout row above the era
    // space is not turned into 0.2.0's: adopting it fails with 2200H.
    let layout = match row.get::<i64>("layout").and_then(Layout::from_code) {
        _ if row.get::<i64>("boot").is_some() => Layout::Wide,
        Some(layout) => layout,
        None => Layout::Wide,
    };
    Some(Row {
        era,
        layout,
        own: backend::is_current_transaction(xmin),
        system: row.get::<i64>("system_identifier").unwrap_or(0) as u64,
    })
}

fn read_evidence(epoch_table: pg_sys::Oid) -> Evidence {
    // On a Citus cluster the lease tables hold every node's tokens, which are not a history
    // from elsewhere: each lock id's rise is kept by its highest (`citus.rs`), and adopting
    // them would have each node pass the others' eras, round after round.
    let distributed = crate::citus::distributed().unwrap_or(false);
    let highest_kept = HIGHEST_KEPT
        .iter()
        .filter(|(table, _)| catalog::lockext_relation(table).is_some())
        .filter(|(table, _)| !(distributed && crate::citus::is_distributed(table)))
        .filter_map(|(_, statement)| statement.read_latest(Args::new())?.get::<i64>("highest"))
        .max();
    Evidence {
        row: read_row(epoch_table),
        highest_kept,
    }
}

/// What the ledger must be raised to so that the next token is above every token that
/// `evidence` says this database's history can have handed out; None when it already is.
/// A pure function of its arguments, so it can be tested on its own.
///
/// Every jump is a **base**, never an era on this timeline: passing an era `E` sets the base
/// to at least `E + 1`, so the era is `E + 1` plus the timeline's floor, here and on every
/// later timeline. A fork of this cluster from before the adoption (a standby that had
/// replayed the restore but not the adoption, a recovery to a point between them) adopts
/// the same evidence on its own, later timeline, and so lands above every token this
/// server hands out after adopting. Whether to jump is decided on the base too, for the
/// same reason: a fork whose timeline alone puts its era above `E` still takes the base.
pub fn wanted(evidence: &Evidence, ledger: State, timeline: u32, system: u64) -> Option<State> {
    let in_force = (ledger.layout != 0).then(|| (ledger.layout(), ledger.era(timeline)));
    // Era `era` of `layout` must be passed: a base of at least `era + 1`.
    let above = |layout: Layout, era: i64| -> Option<State> {
        match in_force {
            Some((l, _)) if l == layout && ledger.base > era => None,
            Some((Layout::Wide, _)) if layout == Layout::Safe => None,
            _ => Some(State {
                layout: layout.code(),
                base: era.saturating_add(1),
                reserved: 0,
                timeline,
            }),
        }
    };
    let mut want: Option<State> = None;
    let mut add = |s: Option<State>| {
        if let Some(s) = s {
            want = Some(match want {
                Some(w) => w.merge(s, timeline),
                None => s,
            });
        }
    };
    if let Some(row) = evidence.row {
        // Written under this ledger: its era was in force then, and tokens since came from
        // the ledger (a fork that has the row has the ledger record before it: the row is
        // written after the raise that its era needed is flushed). Anything else (another
        // cluster, a history before the ledger) is passed, and a row from another cluster
        // by one more.
        let ours = matches!(in_force, Some((l, e)) if l == row.layout && row.era <= e)
            && row.system == system;
        if !ours {
            let lag = i64::from(row.system != system);
            add(above(row.layout, row.era.saturating_add(lag)));
        }
    }
    if let Some(token) = evidence.highest_kept {
        let layout = Layout::of(token);
        let (era, counter) = layout.split(token);
        match in_force {
            // Same era: only the counter has to go past it.
            Some((l, e)) if l == layout && e == era && counter > ledger.reserved => {
                add(Some(State {
                    reserved: counter,
                    timeline,
                    ..ledger
                }))
            }
            // Below the era in force (or in it): this ledger is already above it, and so is
            // every fork's (the era of a later timeline is higher).
            Some((l, e)) if l == layout && e >= era => {}
            Some((Layout::Wide, _)) if layout == Layout::Safe => {}
            _ => add(above(layout, era)),
        }
    }
    want
}

thread_local! {
    // The installation whose evidence this backend adopted last: (database, the oid of its
    // lockext.token_epoch). A reinstall or a restore makes a new table, so a new key. The
    // ledger only rises, so evidence once adopted stays adopted.
    static ADOPTED: Cell<Option<(u32, u32)>> = const { Cell::new(None) };
    // The era whose epoch row this backend knows is committed, in this installation.
    static ROW_CONFIRMED: Cell<Option<(u32, u32, i64, u8)>> = const { Cell::new(None) };
}

/// Raises the ledger above this database's evidence, once per installation per backend,
/// and without reading the evidence when the server's record says it was adopted since it
/// last changed (`adopted.rs`). Returns the oid of lockext.token_epoch.
pub fn adopt() -> Result<pg_sys::Oid, LockError> {
    // A hot standby's ledger is its primary's, replayed: nothing to adopt there.
    backend::writable_server()?;
    let Some(epoch_table) = catalog::lockext_relation(c"token_epoch") else {
        return Err(LockError::EraRecord {
            detail: "lockext.token_epoch is missing".into(),
        });
    };
    let database = backend::database();
    let key = (database.to_u32(), epoch_table.to_u32());
    if ADOPTED.with(|a| a.get()) == Some(key) {
        return Ok(epoch_table);
    }
    // The generation first, then every snapshot the check and the evidence are read under
    // (the order the argument in adopted.rs needs).
    let generation = match adopted::known(database, epoch_table) {
        adopted::Known::Adopted => {
            ADOPTED.with(|a| a.set(Some(key)));
            return Ok(epoch_table);
        }
        adopted::Known::Unknown(generation) => generation,
    };
    // Recorded for others only if the record can see every write, and not from what this
    // transaction's own changes hide or show (a rollback takes them back, raising nothing).
    let shared = generation.filter(|_| {
        !backend::transaction_has_written()
            && SHAREABLE.read_latest(Args::new()).is_some_and(|row| {
                row.get::<bool>("as_made") == Some(true)
                    && row.get::<bool>("unprepared") == Some(true)
            })
    });
    let evidence = read_evidence(epoch_table);
    crate::stats::count(crate::stats::Counter::TokenEvidenceReads);
    let ledger = ledger::state()?;
    let timeline = backend::wal_timeline();
    let system = backend::system_identifier();
    if let Some(want) = wanted(&evidence, ledger, timeline, system) {
        let now = ledger::raise(want)?;
        if now.base != ledger.base || now.layout != ledger.layout {
            // The one change of history a fork from before it cannot see (docs/tokens.md,
            // argument 2): the operator's cue to take a new base backup.
            pgrx::log!(
                "lockext: adopted a token history that did not happen under this cluster's \
                 ledger (database oid {}): the era is now {}; standbys that have not replayed \
                 this far and backups taken before it do not know of it, so take a new base \
                 backup",
                database.to_u32(),
                now.era(timeline)
            );
        }
    }
    pass_in_era(evidence.highest_kept, timeline)?;
    if let Some(generation) = shared {
        adopted::remember(database, epoch_table, generation);
    }
    ADOPTED.with(|a| a.set(Some(key)));
    Ok(epoch_table)
}

/// The highest kept token, when it is of the era in force: the next token goes past it.
/// `wanted` raises the reservation above a counter beyond it, but a running server hands
/// out counters from below its reservation, so a token of another history restored without
/// its epoch row, in the same era, can be within it (the attack pass on the shared
/// adoption found one handed out again).
fn pass_in_era(highest_kept: Option<i64>, timeline: u32) -> Result<(), LockError> {
    let Some(token) = highest_kept else {
        return Ok(());
    };
    let state = ledger::state()?;
    let layout = Layout::of(token);
    if state.layout != 0 && state.layout() == layout && layout.split(token).0 == state.era(timeline)
    {
        ledger::raise_past(token)?;
    }
    Ok(())
}

/// Makes `lockext.token_epoch` record the era in force, for dumps and `pg_upgrade`: a
/// history restored elsewhere then starts above it. Only one transaction writes it at a
/// time (the others try again at their next grant); it counts as recorded once read back
/// committed by another.
fn record_row(
    client: &mut SpiClient<'_>,
    epoch_table: pg_sys::Oid,
    layout: Layout,
    era: i64,
) -> Result<(), LockError> {
    if era >= layout.era_limit() {
        return Err(LockError::TokensExhausted { what: "era" });
    }
    let key = (
        backend::database().to_u32(),
        epoch_table.to_u32(),
        era,
        layout.code(),
    );
    if ROW_CONFIRMED.with(|c| c.get()) == Some(key) {
        return Ok(());
    }
    if let Some(row) = read_row(epoch_table) {
        if row.era >= era && row.layout == layout {
            if !row.own {
                ROW_CONFIRMED.with(|c| c.set(Some(key)));
            }
            return Ok(());
        }
    }
    if crate::claims::try_claim_alone(EPOCH_CLAIM) {
        let era = i32::try_from(era).map_err(|_| LockError::TokensExhausted { what: "era" })?;
        let args = Args::with_capacity(5)
            .set("epoch", era)
            .set("layout", i16::from(layout.code()))
            .set("system_identifier", backend::system_identifier() as i64)
            .set("timeline", backend::wal_timeline() as i32)
            .set("database", backend::database());
        WRITE_ROW.run(client, args)?;
    }
    Ok(())
}

/// The era from which a WARNING says that eras are running out.
const ERA_WARNING: i64 = 3840;

// ---- minting ---------------------------------------------------------------------------

/// Mints one token for a grant, and returns it. Call only once the grant is decided (past
/// the lock id's gate, the lock found free, or inside the statement that grants:
/// `grant_token`): a token minted and not used is only a gap. How the transaction then
/// commits is its caller's commit step's to decide (`commit::after_minting`), told by
/// `minted`.
pub fn mint(client: &mut SpiClient<'_>) -> Result<i64, LockError> {
    let epoch_table = adopt()?;
    let (layout, era, token) = ledger::next_token()?;
    if layout == Layout::Safe && era >= ERA_WARNING {
        warn_eras_running_out(era);
    }
    record_row(client, epoch_table, layout, era)?;
    MINTED.with(|m| m.set(m.get().wrapping_add(1)));
    Ok(token)
}

thread_local! {
    /// How many tokens this backend minted: a call compares it before and after itself.
    static MINTED: Cell<u64> = const { Cell::new(0) };
}

/// How many tokens this backend has minted so far (`mint`, wherever it was called from,
/// a statement's `grant_token` too).
pub fn minted() -> u64 {
    MINTED.with(|m| m.get())
}

fn warn_eras_running_out(era: i64) {
    thread_local! { static WARNED: Cell<bool> = const { Cell::new(false) }; }
    if !WARNED.with(|w| w.replace(true)) {
        pgrx::warning!(
            "lockext: token era {era} of {} is in force; each promotion or point-in-time \
             recovery spends one, and at the last one grants fail (2200H): see lockext's \
             docs/tokens.md",
            Layout::Safe.era_limit() - 1
        );
    }
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

/// The highest token that can have been handed out: the era in force over the last
/// counter handed out, after adopting this database's evidence (a dump's tokens are
/// issued ones once restored).
pub fn highest_issued() -> Result<i64, LockError> {
    if settings::preloaded() {
        adopt()?;
        return Ok(ledger::highest_issued()?.unwrap_or(0));
    }
    // No ledger in this server: tokens here came from a server that had one (its file),
    // or from an older library still mapped in some sessions, counting on the token
    // sequence in the epoch row's era.
    let from_file = ledger::highest_issued()?.unwrap_or(0);
    Ok(from_file.max(issued_by_older_libraries()))
}

/// The highest token this server's ledger can have handed out, for a superuser:
/// `lockext.citus_distribute()` asks every node of a Citus cluster, once the tables are
/// distributed, and records the highest as the floor every grant after it starts above
/// (`citus.rs`). The ledger's alone: evidence is read from tables, which are distributed by
/// then, and every node adopted its own when it minted. Not granted to anyone.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn highest_issued_token() -> i64 {
    ledger::highest_issued()
        .map(|highest| highest.unwrap_or(0))
        .or_report()
}

static SEQUENCE_LAST: Statement = Statement {
    sql: include_str!("../sql/run/token/sequence_last.sql"),
    params: &[],
};

/// The highest token an older library can have handed out in this database: the epoch
/// row's era over the sequence's last value, or a higher token in the tables.
fn issued_by_older_libraries() -> i64 {
    let Some(epoch_table) = catalog::lockext_relation(c"token_epoch") else {
        return 0;
    };
    let evidence = read_evidence(epoch_table);
    let last = SEQUENCE_LAST
        .read_latest(Args::new())
        .and_then(|row| row.get::<i64>("last"))
        .unwrap_or(0);
    let from_row = evidence
        .row
        .and_then(|row| {
            let max_counter = row.layout.max_counter();
            row.layout.compose(row.era, last.min(max_counter)).ok()
        })
        .unwrap_or(0);
    from_row.max(evidence.highest_kept.unwrap_or(0))
}

/// Refuses a token that lockext never issued: a forged one would raise a resource's
/// high-water mark past every real holder and lock them all out.
pub fn require_issued(_client: &mut SpiClient<'_>, token: i64) -> Result<(), LockError> {
    let highest = highest_issued()?;
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
        let timeline = backend::wal_timeline();
        if !settings::preloaded() {
            // No ledger in this server to adopt into (and no grant either): what the file
            // says, so that an update script calling this still runs.
            let state = ledger::state_unpreloaded()?.filter(|s| s.layout != 0);
            return Ok(match state {
                Some(s) => (i32::from(s.layout().code()), s.era(timeline) as i32),
                None => (i32::from(Layout::Safe.code()), (timeline as i32 - 1).max(0)),
            });
        }
        Spi::connect_mut(|client| {
            let epoch_table = adopt()?;
            let state = ledger::state()?;
            if state.layout == 0 {
                // No token yet in this cluster: the first one's era, nothing to record.
                return Ok::<_, LockError>((
                    i32::from(Layout::Safe.code()),
                    (timeline as i32 - 1).max(0),
                ));
            }
            let era = state.era(timeline);
            if era >= state.layout().era_limit() {
                return Err(LockError::TokensExhausted { what: "era" });
            }
            record_row(client, epoch_table, state.layout(), era)?;
            Ok((i32::from(state.layout().code()), era as i32))
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
    if fence_token <= 0 {
        LockError::TokenNotPositive {
            arg: "fence_token",
            value: fence_token,
        }
        .report();
    }
    let layout = Layout::of(fence_token);
    let (era, counter) = layout.split(fence_token);
    TableIterator::once((i32::from(layout.code()), era as i32, counter))
}
