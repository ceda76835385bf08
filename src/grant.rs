//! Granting a lease, whatever its kind: what an acquire asks for (`Request`, `Kind`), the
//! parameters its statements share (`ACQUIRE_PARAMS`, `Args`), and the steps every kind
//! takes once it is past its gate and its look: the deletion of dead leases of another
//! kind (`clear_dead`), the extension of the caller's own live lease (`extend_own`), and
//! the grant itself (`take`: a token minted, the row taken over or inserted), ending in a
//! `Granted`. `lease.rs` (exclusive leases) and `shared.rs` (shared leases and permits)
//! use these; neither uses the other's statements.

use std::time::Duration;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::backend;
use crate::error::{self, LockError};
use crate::session;
use crate::settings;
use crate::statements::{first_value, Statement};
use crate::text::{Text, TextBuf};
use crate::token;
use crate::xact;

pub type Grant = pgrx::composite_type!('static, "lock_grant");

/// The parameters of every acquire statement, by name; `datums` lays them out as the
/// statements number them (`ACQUIRE_PARAMS`).
pub struct Params<'a> {
    /// $1, $2: the lock id and the caller's owner name.
    pub lock_id: Text<'a>,
    pub owner: Text<'a>,
    /// $3: the calling role (`caller::role`), the holder of what is granted.
    pub role: pg_sys::Oid,
    /// $4: the lease's time to live.
    pub ttl: Interval,
    /// $5: the call's clock, read once per try (`backend::now`).
    pub now: TimestampWithTimeZone,
    /// $6: the new grant's token, minted once the grant is decided (`token::mint`), or
    /// NULL for a statement that mints its own (`token::grant_token`).
    pub token: Option<i64>,
    /// $7: the new grant's lock-delay.
    pub lock_delay: Interval,
    /// $8: the session the lease is bound to (`session::this_session`), or none.
    pub session: Option<TimestampWithTimeZone>,
    /// $9, $10: a semaphore's permits, and the slot its taker claimed (shared_leases only).
    pub permits: Option<i32>,
    pub slot: Option<i32>,
    /// $11: the keep-alive the lease is attached to (`keepalive.rs`), or none.
    pub keepalive: Option<i64>,
}

impl Params<'_> {
    pub fn datums(&self) -> [DatumWithOid<'_>; 11] {
        [
            self.lock_id.into(),
            self.owner.into(),
            self.role.into(),
            self.ttl.into(),
            self.now.into(),
            self.token.into(),
            self.lock_delay.into(),
            self.session.into(),
            self.permits.into(),
            self.slot.into(),
            self.keepalive.into(),
        ]
    }

    /// The call's clock in PostgreSQL's microseconds.
    pub fn now_micros(&self) -> i64 {
        self.now.into_inner()
    }
}

pub(crate) const ACQUIRE_PARAMS: &[pg_sys::PgBuiltInOids] = &[
    TEXTOID,
    TEXTOID,
    OIDOID,
    INTERVALOID,
    TIMESTAMPTZOID,
    INT8OID,
    INTERVALOID,
    TIMESTAMPTZOID,
    INT4OID,
    INT4OID,
    INT8OID,
];

/// A deletion of the dead leases of another kind (or slot) that a grant needs out of its
/// way (`clear`), and the check that none of them is left (`left`, read under the newest
/// snapshot once `clear` ran).
pub struct ClearDead {
    clear: Statement,
    left: Statement,
}

/// Before an exclusive grant: every dead shared lease and permit of the lock id.
pub static CLEAR_DEAD_SHARED: ClearDead = ClearDead {
    clear: Statement {
        sql: include_str!("../sql/run/grant/clear_dead_shared.sql"),
        params: ACQUIRE_PARAMS,
    },
    left: Statement {
        sql: include_str!("../sql/run/grant/left_shared.sql"),
        params: ACQUIRE_PARAMS,
    },
};

/// Before a shared lease or a permit: the dead exclusive lease of the lock id.
pub static CLEAR_DEAD_EXCLUSIVE: ClearDead = ClearDead {
    clear: Statement {
        sql: include_str!("../sql/run/grant/clear_dead_exclusive.sql"),
        params: ACQUIRE_PARAMS,
    },
    left: Statement {
        sql: include_str!("../sql/run/grant/left_exclusive.sql"),
        params: ACQUIRE_PARAMS,
    },
};

/// Before a permit in slot $10: the dead permits of others in that slot.
pub static CLEAR_DEAD_SLOT: ClearDead = ClearDead {
    clear: Statement {
        sql: include_str!("../sql/run/grant/clear_dead_slot.sql"),
        params: ACQUIRE_PARAMS,
    },
    left: Statement {
        sql: include_str!("../sql/run/grant/left_slot.sql"),
        params: ACQUIRE_PARAMS,
    },
};

/// Deletes the dead leases that the look saw in the grant's way (`ClearDead`): whether
/// they are all gone. When not, nothing it did is kept (`xact::kept_if_found`): it may
/// hold a renewed lease locked.
///
/// The deletion's own answer (every lease its statement sees dead is gone) is not enough:
/// a lease renewed after the look and before that statement's snapshot (by its renewal,
/// or its keep-alive's, whose row is not the lease's) is live there, so neither deleted
/// nor counted; and a REPEATABLE READ caller's statement does not see a lease newer than
/// its snapshot at all. So the newest snapshot must show none of them left: every lease
/// the look saw in the way was dead, and this grant deleted it (a renewal that comes
/// later finds its row deleted, or its keep-alive ended).
// Never inlined: the gdb tests (tests/cluster/tests/held_row.rs, look_then_clear.rs)
// recognise a backend stopped in this step by this frame, whatever the compiler makes of
// its callers; it runs only when dead leases of another kind are in the way, so the call
// costs nothing.
#[inline(never)]
pub fn clear_dead(
    client: &mut SpiClient<'_>,
    statement: &'static ClearDead,
    params: &Params<'_>,
) -> Result<bool, LockError> {
    let cleared = xact::kept_if_found(|| {
        let datums = params.datums();
        let all_gone = first_value::<bool>(statement.clear.run(client, &datums)?)? == Some(true);
        let none_left = all_gone
            && statement
                .left
                .read_latest(&datums)
                .and_then(|row| row.get::<bool>("left_over"))
                == Some(false);
        Ok(none_left.then_some(()))
    })?;
    Ok(cleared.is_some())
}

// The look: read under the newest snapshot (`Statement::read_latest_all`), after passing
// the gate; each kind sums its rows up its own way (`exclusive.rs`, `shared.rs`).
static LOOK: Statement = Statement {
    sql: include_str!("../sql/run/grant/look.sql"),
    params: ACQUIRE_PARAMS,
};

// The same, read the same way, for a shared acquire.
static LOOK_SHARED: Statement = Statement {
    sql: include_str!("../sql/run/grant/look_shared.sql"),
    params: ACQUIRE_PARAMS,
};

/// One lease of the lock id an acquire looks at (`look_at`); times in PostgreSQL's
/// microseconds.
pub struct Seen {
    /// A shared lease or a permit (a row of lockext.shared_leases), or the exclusive lease.
    pub shared: bool,
    pub expires_at: i64,
    /// When its lock is free: the expiry plus the lock-delay.
    pub free_at: i64,
    /// The caller's own: its owner and its role.
    pub mine: bool,
    /// Its owner's name is the caller's, whatever the role.
    pub owner_named: bool,
    pub permits: Option<i32>,
}

impl Seen {
    pub fn live(&self, now: i64) -> bool {
        self.expires_at > now
    }
    pub fn free(&self, now: i64) -> bool {
        self.free_at <= now
    }
    pub fn free_in_ms(&self, now: i64) -> i64 {
        self.free_at.saturating_sub(now) / 1000
    }
}

/// The leases of the lock id in `params` that its acquire depends on, under the newest
/// snapshot, and the call's clock: every lease, but for a shared acquire (`LOOK_SHARED`).
pub fn look_at(kind: Kind, params: &Params<'_>) -> (Vec<Seen>, i64) {
    let look = if kind == Kind::Shared {
        &LOOK_SHARED
    } else {
        &LOOK
    };
    let leases = look
        .read_latest_all(&params.datums())
        .into_iter()
        .filter_map(|row| {
            Some(Seen {
                shared: row.get::<bool>("shared")?,
                expires_at: row.get::<i64>("expires_at")?,
                free_at: row.get::<i64>("free_at")?,
                mine: row.get::<bool>("mine") == Some(true),
                owner_named: row.get::<bool>("owner_named") == Some(true),
                permits: row.get::<i32>("permits"),
            })
        })
        .collect();
    (leases, params.now_micros())
}

/// What kind of lease an acquire asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Exclusive,
    Shared,
    Semaphore(i32),
}

/// The lease tables. Which kind lives in which is said here only (`Kind::table`); the
/// statements that exist once per table are arrays indexed by it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// `lockext.locks`: exclusive leases, one row per lock id.
    Locks = 0,
    /// `lockext.shared_leases`: shared leases and permits, one row per lock id and owner.
    SharedLeases = 1,
}

impl Kind {
    pub fn table(self) -> Table {
        match self {
            Kind::Exclusive => Table::Locks,
            Kind::Shared | Kind::Semaphore(_) => Table::SharedLeases,
        }
    }

    /// From lock_acquire's `mode` and `permits`; NULL means the default, as for `wait`.
    pub fn parse(mode: Option<Text<'_>>, permits: Option<i32>) -> Result<Kind, LockError> {
        let shared = match mode.map_or(&b"exclusive"[..], Text::bytes) {
            b"exclusive" => false,
            b"shared" => true,
            _ => {
                return Err(LockError::UnknownMode {
                    mode: mode.map(|m| m.to_string()).unwrap_or_default(),
                })
            }
        };
        match permits {
            None if shared => Ok(Kind::Shared),
            None => Ok(Kind::Exclusive),
            Some(permits) if !(1..=error::MAX_PERMITS).contains(&permits) => {
                Err(LockError::PermitsOutOfRange { permits })
            }
            Some(_) if shared => Err(LockError::SharedPermits),
            Some(permits) => Ok(Kind::Semaphore(permits)),
        }
    }
}

/// A validated acquire: everything but the lock id is checked once, so that a set of locks
/// (`sets.rs`) shares it.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    pub lock_id: Text<'a>,
    pub owner: Text<'a>,
    pub ttl: Interval,
    pub wait: Duration,
    pub lock_delay: Duration,
    pub kind: Kind,
    pub session: Option<TimestampWithTimeZone>,
    /// The keep-alive that renews the lease (its `ttl` is then unused), or none.
    pub keepalive: Option<i64>,
}

impl<'a> Request<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn validate(
        lock_id: Text<'a>,
        owner: Option<Text<'a>>,
        ttl: Option<Interval>,
        wait: Option<Interval>,
        lock_delay: Option<Interval>,
        mode: Option<Text<'_>>,
        permits: Option<i32>,
        session_bound: Option<bool>,
        keepalive: Option<i64>,
    ) -> Result<Request<'a>, LockError> {
        let owner = error::identifier("owner", owner)?;
        let keepalive = error::optional_token("keepalive", keepalive)?;
        let ttl = match (keepalive, ttl) {
            (None, ttl) => error::ttl(ttl)?,
            // Unused: the statements store 'infinity' as an attached lease's own expiry
            // (its keep-alive's is the one in force: `keepalive::lease_expiry`). new()
            // fails only out of range, which one microsecond is not.
            (Some(_), None) => Interval::new(0, 0, 1).map_err(|_| LockError::KeepaliveWithTtl)?,
            (Some(_), Some(_)) => return Err(LockError::KeepaliveWithTtl),
        };
        // NULL waits no more than the default does: not at all.
        let wait = match wait {
            None => Duration::ZERO,
            some => error::duration("wait", some)?,
        };
        let lock_delay = match lock_delay {
            None => Duration::from_millis(settings::LOCK_DELAY_MS.get() as u64),
            some => error::duration("lock_delay", some)?,
        };
        let kind = Kind::parse(mode, permits)?;
        backend::writable_server()?;
        if !wait.is_zero() && backend::snapshot_per_transaction() {
            return Err(LockError::WaitNeedsReadCommitted);
        }
        if keepalive.is_some() {
            if session_bound == Some(true) {
                return Err(LockError::KeepaliveWithSession);
            }
            if backend::snapshot_per_transaction() {
                return Err(LockError::KeepaliveNeedsReadCommitted);
            }
        }
        let session = match session_bound {
            Some(true) => Some(session::this_session()?),
            _ => None,
        };
        Ok(Request {
            lock_id,
            owner,
            ttl,
            wait,
            lock_delay,
            kind,
            session,
            keepalive,
        })
    }
}

/// What one try at a lease came to, past the gate.
pub enum Attempt {
    Granted(Granted),
    /// Refused: a lease not yet free is in the way (how soon it will be free unless its
    /// holders renew, when known), or another acquire of the lock id is in flight.
    Refused(Option<Duration>),
    /// Refused for now: the look found nothing in the way but dead leases (or the caller's
    /// own), and one of their rows, or its keep-alive's, was locked by another transaction
    /// (the reaper deleting it, say) or changed after the look. `lease::past_the_gate`
    /// looks again, briefly.
    Busy,
}

impl Attempt {
    /// The grant, if any.
    pub fn granted(self) -> Option<Granted> {
        match self {
            Attempt::Granted(granted) => Some(granted),
            Attempt::Refused(_) | Attempt::Busy => None,
        }
    }

    /// A grant, or the dead rows in the way changed by someone else (`Busy`): the
    /// answer of a step that got past every live lease.
    pub fn granted_or_busy(granted: Option<Granted>) -> Attempt {
        granted.map_or(Attempt::Busy, Attempt::Granted)
    }
}

// By `Table`.
static EXTEND: [Statement; 2] = [
    Statement {
        sql: include_str!("../sql/run/grant/extend_lock.sql"),
        params: ACQUIRE_PARAMS,
    },
    Statement {
        sql: include_str!("../sql/run/grant/extend_shared_lease.sql"),
        params: ACQUIRE_PARAMS,
    },
];

pub fn extend_own(
    client: &mut SpiClient<'_>,
    request: &Request<'_>,
    params: &Params<'_>,
) -> Result<Option<Granted>, LockError> {
    grant_by(client, &EXTEND[request.kind.table() as usize], params)
}

/// Runs an acquire statement that changes a lease row it locks `FOR UPDATE SKIP LOCKED`
/// (an extension or a take-over), kept only if it granted. PostgreSQL keeps the lock of a
/// row that fails the recheck of `FOR UPDATE` (changed since the statement's snapshot, by
/// a holder's renewal for instance): a refused acquire inside a transaction that stays
/// open would otherwise keep a live holder's row locked, and the holder's renewals would
/// be refused until that transaction ended.
fn grant_by(
    client: &mut SpiClient<'_>,
    statement: &'static Statement,
    params: &Params<'_>,
) -> Result<Option<Granted>, LockError> {
    xact::kept_if_found(|| grant_row(statement.run(client, &params.datums())?))
}

/// Grants the lease, past the gate and the look: the caller's own live lease is extended
/// (the same grant, no new token); otherwise a token is minted and the lease row taken
/// over if there is one, or inserted. An insert that finds the row created since the look
/// takes that over instead.
#[allow(clippy::too_many_arguments)]
pub fn take(
    client: &mut SpiClient<'_>,
    request: &Request<'_>,
    params: &mut Params<'_>,
    mine_live: bool,
    row_exists: bool,
    take_over: &'static Statement,
    insert: &'static Statement,
) -> Result<Option<Granted>, LockError> {
    if mine_live {
        if let Some(grant) = extend_own(client, request, params)? {
            return Ok(Some(grant));
        }
    }
    params.token = Some(token::mint(client)?);
    if row_exists {
        return grant_by(client, take_over, params);
    }
    // ON CONFLICT DO NOTHING locks nothing: no subtransaction is needed for the insert.
    match grant_row(insert.run(client, &params.datums())?)? {
        Some(grant) => Ok(Some(grant)),
        None => grant_by(client, take_over, params),
    }
}

pub fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

/// A grant, in plain values: a composite value made inside a subtransaction would hold a
/// tuple descriptor owned by it, gone once it ends (`to_grant` makes lockext.lock_grant).
pub struct Granted {
    pub lock_id: TextBuf,
    pub owner: TextBuf,
    pub token: i64,
    pub acquired_at: TimestampWithTimeZone,
    pub expires_at: TimestampWithTimeZone,
    pub minted: bool,
    pub took_over: bool, // an expired lease of someone else's taken over in place
    pub previous_token: Option<i64>,
}

impl Granted {
    /// lock_acquire's result, a `lockext.lock_grant`, formed in one go.
    pub fn to_grant(&self) -> Result<Grant, LockError> {
        let missing = LockError::MissingColumn { name: "lock_grant" };
        let tupdesc = pgrx::PgTupleDesc::for_composite_type_by_oid(grant_type()?).ok_or(missing)?;
        let datums = [
            self.lock_id.clone().into_datum(),
            self.owner.clone().into_datum(),
            self.token.into_datum(),
            self.acquired_at.into_datum(),
            self.expires_at.into_datum(),
        ];
        unsafe { PgHeapTuple::from_datums(tupdesc, datums) }
            .map_err(|_| LockError::MissingColumn { name: "lock_grant" })
    }
}

/// The oid of type lockext.lock_grant: two catalog-cache lookups (not kept: a reinstall in
/// this backend may keep the schema and make the type anew).
fn grant_type() -> Result<pg_sys::Oid, LockError> {
    let schema = unsafe { pg_sys::get_namespace_oid(c"lockext".as_ptr(), true) };
    let oid = unsafe {
        pg_sys::GetSysCacheOid(
            pg_sys::SysCacheIdentifier::TYPENAMENSP as i32,
            pg_sys::Anum_pg_type_oid as pg_sys::AttrNumber,
            pg_sys::Datum::from(c"lock_grant".as_ptr()),
            pg_sys::Datum::from(schema),
            pg_sys::Datum::from(0usize),
            pg_sys::Datum::from(0usize),
        )
    };
    if oid == pg_sys::InvalidOid {
        return Err(LockError::MissingColumn { name: "lock_grant" });
    }
    Ok(oid)
}

/// The grant from an acquire statement's RETURNING (sql/run/exclusive/take_over.sql's
/// columns), if any.
pub fn grant_row(rows: pgrx::spi::SpiTupleTable<'_>) -> Result<Option<Granted>, LockError> {
    if rows.is_empty() {
        return Ok(None);
    }
    let row = rows.first();
    let (
        Some(lock_id),
        Some(owner),
        Some(token),
        Some(acquired_at),
        Some(expires_at),
        Some(minted),
    ) = (
        row.get_by_name::<TextBuf, _>("lock_id")?,
        row.get_by_name::<TextBuf, _>("owner")?,
        row.get_by_name::<i64, _>("fence_token")?,
        row.get_by_name::<TimestampWithTimeZone, _>("acquired_at")?,
        row.get_by_name::<TimestampWithTimeZone, _>("expires_at")?,
        row.get_by_name::<bool, _>("minted")?,
    )
    else {
        return Ok(None);
    };
    // Its lock is free (and the lease reapable) no sooner than it expires. An attached
    // lease's row says infinity: its keep-alive's expiry was published by its grant.
    crate::status::due_by(expires_at);
    Ok(Some(Granted {
        lock_id,
        owner,
        token,
        acquired_at,
        expires_at,
        minted,
        took_over: false,
        previous_token: row.get_by_name::<i64, _>("previous_token")?,
    }))
}
