//! Granting a lease, whatever its kind: the parameters every acquire statement shares
//! (`Params`, `Attachments`, `ACQUIRE_PARAMS`), the look (`look_at`: the leases of the lock
//! id, as `Seen`), and the store step that carries out a kind's decision (`Plan`): the
//! deletion of dead leases of another kind (`clear_dead`), the caller's own live lease
//! extended (`extend_own`), or the grant itself (`take`: a token minted, the row taken over
//! or inserted), ending in a `Granted`. Kinds (`kind/`) decide; this module stores, the same
//! way for each, and knows no kind.

use std::time::Duration;

use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::catalog;
use crate::claims;
use crate::error::LockError;
use crate::statements::{first_named, Args, Statement};
use crate::text::{Text, TextBuf};
use crate::token;
use crate::xact;

pub type Grant = pgrx::composite_type!('static, "lock_grant");

/// The parameters of every acquire statement, by name (`ACQUIRE_PARAMS`); `args` gives
/// them to a statement, with the attachments ($8, $11) for the store step's statements
/// only.
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
    /// $9, $10: a semaphore's permits, and the slot its taker claimed (shared_leases only).
    pub permits: Option<i32>,
    pub slot: Option<i32>,
}

/// What a lease is attached to besides its lock id, given to the statements that store it
/// (an extension, a take-over, an insert): $8, the session it ends with, and $11, the
/// keep-alive that renews it. Every other statement sees them NULL, and reads neither.
#[derive(Clone, Copy)]
pub struct Attachments {
    /// The session the lease is bound to (`session::this_session`), or none.
    pub session: Option<TimestampWithTimeZone>,
    /// The keep-alive the lease is attached to (`keepalive.rs`), or none.
    pub keepalive: Option<i64>,
}

impl Attachments {
    pub const NONE: Attachments = Attachments {
        session: None,
        keepalive: None,
    };
}

impl Params<'_> {
    /// The eleven arguments of an acquire statement, the one place they are given, in the
    /// order of `ACQUIRE_PARAMS`. `attached`: the lease's attachments for a statement of
    /// the store step, which writes them into the lease; `Attachments::NONE` for every
    /// other (the look, a clearing), which sees them NULL.
    pub fn args(&self, attached: &Attachments) -> Args<'_> {
        Args::with_capacity(ACQUIRE_PARAMS.len())
            .set("lock_id", self.lock_id)
            .set("owner", self.owner)
            .set("role", self.role)
            .set("ttl", self.ttl)
            .set("now", self.now)
            .set("token", self.token)
            .set("lock_delay", self.lock_delay)
            .set("session_start", attached.session)
            .set("permits", self.permits)
            .set("slot", self.slot)
            .set("keepalive", attached.keepalive)
    }

    /// The call's clock in PostgreSQL's microseconds.
    pub fn now_micros(&self) -> i64 {
        self.now.into_inner()
    }
}

/// The parameters of every acquire statement, as each file's header names them.
pub(crate) const ACQUIRE_PARAMS: &[(&str, pg_sys::PgBuiltInOids)] = &[
    ("lock_id", TEXTOID),
    ("owner", TEXTOID),
    ("role", OIDOID),
    ("ttl", INTERVALOID),
    ("now", TIMESTAMPTZOID),
    ("token", INT8OID),
    ("lock_delay", INTERVALOID),
    ("session_start", TIMESTAMPTZOID),
    ("permits", INT4OID),
    ("slot", INT4OID),
    ("keepalive", INT8OID),
];

/// A deletion of the dead leases of another kind (or slot) that a grant needs out of its
/// way (`clear`), and the check that none of them is left (`left`, read under the newest
/// snapshot once `clear` ran). Each kind has the ones it needs.
pub struct ClearDead {
    pub clear: Statement,
    pub left: Statement,
}

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
        let cleared = statement
            .clear
            .run(client, params.args(&Attachments::NONE))?;
        let all_gone = first_named::<bool>(cleared, "all_gone")? == Some(true);
        let none_left = all_gone
            && statement
                .left
                .read_latest(params.args(&Attachments::NONE))
                .and_then(|row| row.get::<bool>("left_over"))
                == Some(false);
        Ok(none_left.then_some(()))
    })?;
    Ok(cleared.is_some())
}

/// The look of every kind but a shared lease: every lease of the lock id, read under the
/// newest snapshot (`Statement::read_latest_all`), after passing the gate; each kind sums
/// the rows up its own way (`kind/`).
pub static LOOK: Statement = Statement {
    sql: include_str!("../sql/run/grant/look.sql"),
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

/// The look: the leases of the lock id in `params` that its acquire depends on, as the
/// kind's `look` statement reads them under the newest snapshot, and the call's clock.
pub fn look_at(look: &'static Statement, params: &Params<'_>) -> (Vec<Seen>, i64) {
    let leases = look
        .read_latest_all(params.args(&Attachments::NONE))
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

/// The statements that store a lease of one table: the caller's own live lease extended,
/// a row taken over in place, a row inserted. Each kind names its table's (`kind/`).
pub struct Store {
    pub extend: Statement,
    pub take_over: Statement,
    pub insert: Statement,
}

/// What a kind decided from its look (`LeaseKind::decide`).
pub enum Decision {
    /// Not now: a lease not yet free is in the way (how soon it will be free unless its
    /// holders renew, when known), or another acquire of the lock id is in flight.
    Refused(Option<Duration>),
    /// Nothing live in the way: the store step carries out the plan.
    Grant(Plan),
}

/// How the store step grants, as the kind decided it.
pub struct Plan {
    /// The dead leases to delete first, in this order (`clear_dead`).
    pub clear: [Option<&'static ClearDead>; 2],
    /// What the owner's row needs, once they are gone.
    pub owner_row: OwnerRow,
    /// The caller's own live lease: extended, the same grant, before a token is minted.
    pub mine_live: bool,
    /// A row to take over (else one is inserted).
    pub row_exists: bool,
    /// A take-over of someone else's dead lease is announced (`Granted::took_over`).
    pub announces_take_over: bool,
}

/// What the owner's row of a table with a row per owner needs before the grant.
pub enum OwnerRow {
    /// Nothing: the table has one row per lock id, which the gate covers.
    Covered,
    /// Its name is another role's lease, not yet free: not the caller's to take.
    OthersNamed,
    /// Its creation claimed first (`claims::try_claim_row`) when it does not exist.
    Claimed,
}

/// The store step: carries out a kind's plan, past the gate and the look. The dead leases
/// in the way go first (`clear_dead`), then the owner's row is claimed, then the grant is
/// made (`take`). Busy: a dead row (or its keep-alive's) was locked by someone else, or
/// changed since the look.
pub fn store(
    client: &mut SpiClient<'_>,
    store: &'static Store,
    plan: &Plan,
    params: &mut Params<'_>,
    attached: &Attachments,
) -> Result<Attempt, LockError> {
    // A dead lease of another kind goes first, so that its renewal cannot revive it beside
    // ours. Not cleared: its row is locked right now (the reaper deleting it, or a renewal
    // that read its clock before the expiry), or it was renewed since the look.
    for clear in plan.clear.iter().flatten() {
        if !clear_dead(client, clear, params)? {
            return Ok(Attempt::Busy);
        }
    }
    let refused = match plan.owner_row {
        OwnerRow::Covered => false,
        OwnerRow::OthersNamed => true,
        // Being created right now by another transaction.
        OwnerRow::Claimed => {
            !plan.row_exists && !claims::try_claim_row(params.lock_id, params.owner)?
        }
    };
    if refused {
        return Ok(Attempt::Refused(None));
    }
    let granted = take(
        client,
        store,
        params,
        attached,
        plan.mine_live,
        plan.row_exists,
    )?;
    // Nothing granted past every live lease: the dead row (or its keep-alive's) was
    // locked by someone else, or changed or deleted since the look.
    Ok(Attempt::granted_or_busy(granted.map(|g| Granted {
        took_over: plan.announces_take_over && g.minted && plan.row_exists,
        ..g
    })))
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

/// The caller's own live lease, extended: the same grant, no new token.
pub fn extend_own(
    client: &mut SpiClient<'_>,
    store: &'static Store,
    params: &Params<'_>,
    attached: &Attachments,
) -> Result<Option<Granted>, LockError> {
    grant_by(client, &store.extend, params, attached)
}

/// Runs an acquire statement that changes a lease row it locks `FOR UPDATE SKIP LOCKED`
/// (an extension or a take-over), kept only if it granted. PostgreSQL keeps the lock of a
/// row that fails the recheck of `FOR UPDATE` (changed since the statement's snapshot, by
/// a holder's renewal for instance): a refused acquire inside a transaction that stays
/// open would otherwise keep a live holder's row locked, and the holder's renewals would
/// be refused until that transaction ended.
// Never inlined: the gdb tests (tests/cluster/tests/held_row.rs, acquire_while_reaped.rs)
// recognise a backend stopped in a take-over by this frame, whatever the compiler makes of
// its callers (`store` and `take` are inlined into theirs).
#[inline(never)]
fn grant_by(
    client: &mut SpiClient<'_>,
    statement: &'static Statement,
    params: &Params<'_>,
    attached: &Attachments,
) -> Result<Option<Granted>, LockError> {
    xact::kept_if_found(|| grant_row(statement.run(client, params.args(attached))?))
}

/// Grants the lease, past the gate and the look: the caller's own live lease is extended
/// (the same grant, no new token); otherwise a token is minted and the lease row taken
/// over if there is one, or inserted. An insert that finds the row created since the look
/// takes that over instead.
pub fn take(
    client: &mut SpiClient<'_>,
    store: &'static Store,
    params: &mut Params<'_>,
    attached: &Attachments,
    mine_live: bool,
    row_exists: bool,
) -> Result<Option<Granted>, LockError> {
    if mine_live {
        if let Some(grant) = extend_own(client, store, params, attached)? {
            return Ok(Some(grant));
        }
    }
    params.token = Some(token::mint(client)?);
    if row_exists {
        return grant_by(client, &store.take_over, params, attached);
    }
    // ON CONFLICT DO NOTHING locks nothing: no subtransaction is needed for the insert.
    match grant_row(store.insert.run(client, params.args(attached))?)? {
        Some(grant) => Ok(Some(grant)),
        None => grant_by(client, &store.take_over, params, attached),
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
    catalog::lockext_type(c"lock_grant").ok_or(LockError::MissingColumn { name: "lock_grant" })
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
