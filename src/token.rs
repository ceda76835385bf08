//! Fencing tokens: where they come from, and what makes them safe to hand out.
//!
//! A token is only worth anything if no later grant can ever get a lower or equal one.
//! PostgreSQL breaks that promise in known ways, and each rule below closes one:
//!
//! 1. A sequence logs values ahead of use, so a token a client saw before its WAL was
//!    flushed could be handed out again after a crash. With `lockext.durability = grant`
//!    (the default) the granting transaction commits synchronously whatever the session's
//!    `synchronous_commit`.
//! 2. After a failover to an asynchronous standby, a point-in-time recovery, a restore into
//!    another cluster or database, or (when preloaded) any restart, the sequence may be
//!    behind tokens already handed out. So a token carries an **epoch** in its high bits:
//!
//!    ```text
//!    bit 63     62 ....... 55   54 ........ 43   42 ........................ 0
//!        0    |  era (8 bits) | raise (12 bits) |  counter (43 bits, the sequence) |
//!    ```
//!
//!    The epoch (era and raise, 20 bits) is recorded in `lockext.token_epoch` with the
//!    identity of the history it belongs to: system identifier, WAL timeline, database,
//!    and the boot of the server's shared memory (0 when not preloaded). A token minted
//!    under another identity gets the next epoch: a new era when the timeline, system or
//!    database changed (at least the WAL timeline, so branches of history do not share
//!    eras), the next raise after a restart (a raise past 4095 carries into the era).
//!    Every token of the lost history is then below every new one, whatever the sequence
//!    lost. The next epoch is a function of the recorded row and the identity only, so
//!    every backend that mints before it is recorded picks the same one.
//! 3. A grant minted under an epoch not yet seen committed commits synchronously, whatever
//!    the durability mode: its counter is then on disk, so even if the record of its epoch
//!    is lost, the next raise (recomputed from the same row) continues above it.
//!
//! The counter is the sequence, 43 bits (8.8 * 10^12 grants); its MAXVALUE stops it there
//! with an error (2200H): tokens never wrap. 255 eras, 1 048 575 epochs in all.
//!
//! Once the recorded epoch is seen committed under the current identity, it is cached: in
//! shared memory when preloaded (so other backends skip the table), and in each backend
//! (so the hot path is a compare, with no lock taken).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use pgrx::datum::DatumWithOid;
use pgrx::lwlock::PgLwLock;
use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::{pg_shmem_init, PGRXSharedMemory};

use crate::error::LockError;
use crate::settings::{self, Durability};
use crate::statements::{first_value, Statement};

pub const COUNTER_BITS: u32 = 43;
pub const RAISE_BITS: u32 = 12;
pub const ERA_LIMIT: i64 = 1 << 8;
pub const EPOCH_LIMIT: i64 = 1 << 20;
/// The claim that the recorder of a new epoch holds: a lock id cannot contain a NUL, so no
/// lease's claim can be this one.
const EPOCH_CLAIM: &str = "\u{0}lockext token epoch";

/// The SQL expression that mints one token, for lease statements to embed; `$6` is the
/// epoch from `prepare_to_mint`.
macro_rules! mint_sql {
    () => {
        "(($6::bigint << 43) | nextval('lockext.fence_token_seq'::regclass))"
    };
}
pub(crate) use mint_sql;

/// Which history a token belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
struct Identity {
    system: i64,
    timeline: i32,
    database: u32,
    boot: i64,
}

impl Identity {
    fn now() -> Identity {
        unsafe {
            Identity {
                system: pg_sys::GetSystemIdentifier() as i64,
                timeline: pg_sys::GetWALInsertionTimeLine() as i32,
                database: pg_sys::MyDatabaseId.to_u32(),
                boot: boot_id(),
            }
        }
    }

    fn args(&self) -> [DatumWithOid<'static>; 4] {
        [
            self.system.into(),
            self.timeline.into(),
            pg_sys::Oid::from(self.database).into(),
            self.boot.into(),
        ]
    }
}

// ---- the confirmed-epoch cache -------------------------------------------------------

#[derive(Clone, Copy, Default)]
struct Confirmed {
    identity: Identity,
    epoch: i64,
}

const SLOTS: usize = 32;

#[derive(Clone, Copy, Default)]
pub struct EpochBoard {
    slots: [Confirmed; SLOTS],
}
unsafe impl PGRXSharedMemory for EpochBoard {}

static BOARD: PgLwLock<EpochBoard> = unsafe { PgLwLock::new(c"lockext_token_epochs") };
// Set the first time a backend looks after shared memory was (re)initialised: a crash
// restart re-creates shared memory, so a new value marks a new boot.
static BOOT: pgrx::PgAtomic<AtomicU64> = unsafe { pgrx::PgAtomic::new(c"lockext_boot") };

thread_local! {
    static LOCAL: Cell<Option<Confirmed>> = const { Cell::new(None) };
}

pub fn init_shared_memory() {
    pg_shmem_init!(BOARD);
    pg_shmem_init!(BOOT);
}

/// This boot of the server's shared memory; 0 when lockext is not preloaded.
fn boot_id() -> i64 {
    if !settings::preloaded() {
        return 0;
    }
    let boot = BOOT.get();
    match boot.load(Ordering::Acquire) {
        0 => {
            let now = unsafe { pg_sys::GetCurrentTimestamp() } as u64;
            match boot.compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => now as i64,
                Err(existing) => existing as i64,
            }
        }
        set => set as i64,
    }
}

/// The confirmed epoch of `identity`. An identity's confirmed epoch never changes (a raise
/// comes with a new identity), so a backend keeps its own copy and asks shared memory, and
/// its lock, only once per identity.
fn cached(identity: &Identity) -> Option<i64> {
    if let Some(epoch) =
        LOCAL.with(|l| l.get().filter(|c| c.identity == *identity).map(|c| c.epoch))
    {
        return Some(epoch);
    }
    if !settings::preloaded() {
        return None;
    }
    let epoch = {
        let board = BOARD.share();
        board
            .slots
            .iter()
            .find(|c| c.identity == *identity)
            .map(|c| c.epoch)
    }?;
    LOCAL.with(|l| {
        l.set(Some(Confirmed {
            identity: *identity,
            epoch,
        }))
    });
    Some(epoch)
}

fn remember(identity: Identity, epoch: i64) {
    let entry = Confirmed { identity, epoch };
    LOCAL.with(|l| l.set(Some(entry)));
    if settings::preloaded() {
        let mut board = BOARD.exclusive();
        let slot = board
            .slots
            .iter()
            .position(|c| c.identity.database == identity.database)
            .or_else(|| board.slots.iter().position(|c| c.identity.database == 0))
            .unwrap_or(identity.database as usize % SLOTS);
        board.slots[slot] = entry;
    }
}

// ---- statements ----------------------------------------------------------------------

static READ_EPOCH: Statement = Statement {
    sql: "SELECT epoch::bigint, system_identifier = $1 AND timeline = $2 AND database = $3 AND boot = $4, \
                 system_identifier = $1 AND timeline = $2 AND database = $3 \
            FROM lockext.token_epoch",
    params: &[INT8OID, INT4OID, OIDOID, INT8OID],
};

static RECORD_EPOCH: Statement = Statement {
    sql:
        "INSERT INTO lockext.token_epoch AS t \
                 (singleton, epoch, system_identifier, timeline, database, boot, raised_at) \
          VALUES (true, $5, $1, $2, $3, $4, clock_timestamp()) \
          ON CONFLICT (singleton) DO UPDATE \
             SET epoch = greatest(t.epoch, EXCLUDED.epoch), \
                 system_identifier = EXCLUDED.system_identifier, timeline = EXCLUDED.timeline, \
                 database = EXCLUDED.database, boot = EXCLUDED.boot, raised_at = EXCLUDED.raised_at",
    params: &[INT8OID, INT4OID, OIDOID, INT8OID, INT4OID],
};

static LAST_COUNTER: Statement = Statement {
    sql: "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM lockext.fence_token_seq",
    params: &[],
};

// ---- epochs --------------------------------------------------------------------------

/// The epoch a token minted now must carry, and whether it is known to be on disk.
struct InForce {
    epoch: i64,
    confirmed: bool,
    identity: Identity,
}

fn epoch_in_force(client: &mut SpiClient<'_>) -> Result<InForce, LockError> {
    let identity = Identity::now();
    if let Some(epoch) = cached(&identity) {
        return Ok(InForce {
            epoch,
            confirmed: true,
            identity,
        });
    }
    match read_epoch(client, &identity)? {
        Some((epoch, true, _)) => {
            remember(identity, epoch); // seen committed, so durable: trust it from now on
            Ok(InForce {
                epoch,
                confirmed: true,
                identity,
            })
        }
        recorded => Ok(InForce {
            epoch: next_epoch(recorded, identity.timeline)?,
            confirmed: false,
            identity,
        }),
    }
}

/// Call before minting: returns the epoch to mint with (the `$6` of `mint_sql!`),
/// recording a new one if this history has none yet. Never waits: if another
/// transaction is recording the same epoch right now, this one mints with it too.
pub fn prepare_to_mint(client: &mut SpiClient<'_>) -> Result<i64, LockError> {
    if settings::durability() == Durability::Epoch && !settings::preloaded() {
        return Err(LockError::EpochModeNeedsPreload);
    }
    let in_force = epoch_in_force(client)?;
    if !in_force.confirmed {
        // Rule 3: this token's counter must reach the disk with its grant.
        crate::commit::require_flush();
        if crate::claims::try_claim(EPOCH_CLAIM) {
            record(client, &in_force.identity, in_force.epoch)?;
        }
    }
    Ok(in_force.epoch)
}

/// Call after minting: commits as the durability mode asks.
pub fn after_mint() {
    if settings::durability() == Durability::Grant {
        crate::commit::require_flush();
    }
}

/// The epoch after `recorded` (epoch, same identity, same identity but for the boot).
pub fn next_epoch(recorded: Option<(i64, bool, bool)>, timeline: i32) -> Result<i64, LockError> {
    let era_of_timeline = if i64::from(timeline) < ERA_LIMIT {
        i64::from(timeline).max(1)
    } else {
        1
    };
    let epoch = match recorded {
        // Same history, new boot: the next raise.
        Some((epoch, _, true)) => epoch + 1,
        // Another history (failover, PITR, restore): a new era, at least the timeline's.
        Some((epoch, _, false)) => ((epoch >> RAISE_BITS) + 1).max(era_of_timeline) << RAISE_BITS,
        None => era_of_timeline << RAISE_BITS,
    };
    if epoch >= EPOCH_LIMIT {
        return Err(LockError::EpochsExhausted);
    }
    Ok(epoch)
}

fn read_epoch(
    client: &mut SpiClient<'_>,
    identity: &Identity,
) -> Result<Option<(i64, bool, bool)>, LockError> {
    let rows = READ_EPOCH.run(client, &identity.args())?;
    if rows.is_empty() {
        return Ok(None);
    }
    let row = rows.first();
    let epoch = row.get::<i64>(1)?.unwrap_or(0);
    let same = row.get::<bool>(2)?.unwrap_or(false);
    let same_but_boot = row.get::<bool>(3)?.unwrap_or(false);
    Ok(Some((epoch, same, same_but_boot)))
}

fn record(client: &mut SpiClient<'_>, identity: &Identity, epoch: i64) -> Result<(), LockError> {
    let [a, b, c, d] = identity.args();
    let epoch = i32::try_from(epoch).map_err(|_| LockError::EpochsExhausted)?;
    RECORD_EPOCH.run(client, &[a, b, c, d, epoch.into()])?;
    Ok(())
}

// ---- issued tokens -------------------------------------------------------------------

/// The highest token that can have been handed out in this database: the epoch in force
/// over the last counter value.
pub fn highest_issued(client: &mut SpiClient<'_>) -> Result<i64, LockError> {
    let counter = first_value::<i64>(LAST_COUNTER.run(client, &[])?)?.unwrap_or(0);
    let epoch = epoch_in_force(client)?.epoch;
    Ok((epoch << COUNTER_BITS) | counter)
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

/// A token taken apart: its era, its raise within the era, and its counter.
#[pg_extern(immutable, parallel_safe, strict)]
#[search_path(pg_catalog, pg_temp)]
fn token_parts(
    fence_token: i64,
) -> TableIterator<'static, (name!(era, i32), name!(raise, i32), name!(counter, i64))> {
    let epoch = fence_token >> COUNTER_BITS;
    let era = (epoch >> RAISE_BITS) as i32;
    let raise = (epoch & ((1 << RAISE_BITS) - 1)) as i32;
    let counter = fence_token & ((1 << COUNTER_BITS) - 1);
    TableIterator::once((era, raise, counter))
}
