//! Leases: lock_acquire, lock_renew, lock_release.
//!
//! A lease is one row of `lockext.locks`. None of these functions ever waits for another
//! transaction: a lease that someone else is in the middle of changing (an acquire or a
//! release inside a transaction that is still open, the reaper deleting it) counts as
//! not available, and the call answers at once. Row changes use `FOR UPDATE SKIP LOCKED`;
//! the one change that has no row to lock yet, the first insert of a lock id, is claimed
//! with a transaction-scoped lock that is only ever tried (`try_claim`).
//!
//! Time is the server's clock as `clock_timestamp()` reads it, taken once per call, so all
//! the tests of one call agree on "now" even if the clock steps while it runs.

use std::cell::Cell;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::error::{self, LockError, OrReport};
use crate::statements::{first_value, Statement};
use crate::stats::{self, Counter};
use crate::token::{self, mint_sql};

/// Marks lockext's claims among advisory locks in `pg_locks` (objsubid 19531, "LK"); the
/// built-in advisory functions use 1 and 2, so the two never collide.
const CLAIM_TAG: u16 = 0x4C4B;

// Parameters shared by the acquire statements: $1 lock_id, $2 owner, $3 calling role,
// $4 ttl, $5 now, $6 token epoch.
const ACQUIRE_PARAMS: &[pg_sys::PgBuiltInOids] =
    &[TEXTOID, TEXTOID, OIDOID, INTERVALOID, TIMESTAMPTZOID, INT8OID];

static PEEK: Statement = Statement {
    sql: "SELECT expires_at > $5 AND NOT (owner = $2 AND holder_role = $3) \
            FROM lockext.locks WHERE lock_id = $1",
    params: ACQUIRE_PARAMS,
};

// Takes over an expired lease, or extends the caller's own live one (same grant, same
// token). Either way in place: there is no moment at which the lock id has no row.
static TAKE_OVER: Statement = Statement {
    sql: concat!(
        "UPDATE lockext.locks AS l \
            SET owner = $2, holder_role = $3, \
                fence_token = CASE WHEN c.same_grant THEN l.fence_token ELSE ",
        mint_sql!(),
        " END, \
                acquired_at = CASE WHEN c.same_grant THEN l.acquired_at ELSE $5 END, \
                expires_at = $5 + $4, \
                renewals = CASE WHEN c.same_grant THEN l.renewals + 1 ELSE 0 END, \
                taker_pid = pg_backend_pid(), \
                application_name = current_setting('application_name'), \
                client_addr = inet_client_addr() \
           FROM (SELECT lock_id, expires_at > $5 AND owner = $2 AND holder_role = $3 AS same_grant \
                   FROM lockext.locks \
                  WHERE lock_id = $1 \
                    AND (expires_at <= $5 OR (owner = $2 AND holder_role = $3)) \
                    FOR UPDATE SKIP LOCKED) AS c \
          WHERE l.lock_id = c.lock_id \
         RETURNING ROW(l.lock_id, l.owner, l.fence_token, l.acquired_at, l.expires_at)::lockext.lock_grant, \
                   NOT c.same_grant"
    ),
    params: ACQUIRE_PARAMS,
};

static INSERT_NEW: Statement = Statement {
    sql: concat!(
        "INSERT INTO lockext.locks AS l \
                (lock_id, owner, holder_role, fence_token, acquired_at, expires_at, \
                 renewals, taker_pid, application_name, client_addr) \
         VALUES ($1, $2, $3, ",
        mint_sql!(),
        ", $5, $5 + $4, 0, pg_backend_pid(), current_setting('application_name'), inet_client_addr()) \
         ON CONFLICT (lock_id) DO NOTHING \
         RETURNING ROW(l.lock_id, l.owner, l.fence_token, l.acquired_at, l.expires_at)::lockext.lock_grant, \
                   true"
    ),
    params: ACQUIRE_PARAMS,
};

static RENEW: Statement = Statement {
    sql: "UPDATE lockext.locks AS l SET expires_at = $5 + $4, renewals = l.renewals + 1 \
            FROM (SELECT lock_id FROM lockext.locks \
                   WHERE lock_id = $1 AND owner = $2 AND expires_at > $5 \
                     AND (holder_role = $3 OR pg_has_role($3, 'lockext_admin', 'MEMBER')) \
                     AND ($6::bigint IS NULL OR fence_token = $6) \
                     FOR UPDATE SKIP LOCKED) AS c \
           WHERE l.lock_id = c.lock_id \
          RETURNING l.expires_at",
    params: &[TEXTOID, TEXTOID, OIDOID, INTERVALOID, TIMESTAMPTZOID, INT8OID],
};

// Deletes the caller's row whether or not it has expired (that is only cleanup), and
// reports whether the lease was still live: only then did the caller hold the lock.
static RELEASE: Statement = Statement {
    sql: "DELETE FROM lockext.locks AS l \
           USING (SELECT lock_id, expires_at > $4 AS live FROM lockext.locks \
                   WHERE lock_id = $1 AND owner = $2 \
                     AND (holder_role = $3 OR pg_has_role($3, 'lockext_admin', 'MEMBER')) \
                     AND ($5::bigint IS NULL OR fence_token = $5) \
                     FOR UPDATE SKIP LOCKED) AS c \
           WHERE l.lock_id = c.lock_id \
          RETURNING c.live",
    params: &[TEXTOID, TEXTOID, OIDOID, TIMESTAMPTZOID, INT8OID],
};

type Grant = pgrx::composite_type!('static, "lock_grant");

/// Takes the lock `lock_id` for `owner` for `ttl`, or returns NULL if a live lease holds it.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lock_acquire(
    lock_id: Option<&str>,
    owner: Option<&str>,
    ttl: Option<Interval>,
) -> Option<pgrx::composite_type!('static, "lock_grant")> {
    acquire(lock_id, owner, ttl).or_report()
}

/// Extends the caller's live lease to now + `ttl`; NULL when the caller holds none.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lock_renew(
    lock_id: Option<&str>,
    owner: Option<&str>,
    ttl: Option<Interval>,
    fence_token: default!(Option<i64>, "NULL"),
) -> Option<TimestampWithTimeZone> {
    renew(lock_id, owner, ttl, fence_token).or_report()
}

/// Ends the caller's lease; true when the caller still held it.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lock_release(
    lock_id: Option<&str>,
    owner: Option<&str>,
    fence_token: default!(Option<i64>, "NULL"),
) -> bool {
    release(lock_id, owner, fence_token).or_report()
}

pub fn acquire(
    lock_id: Option<&str>,
    owner: Option<&str>,
    ttl: Option<Interval>,
) -> Result<Option<Grant>, LockError> {
    let _timer = stats::AcquireTimer::start();
    let lock_id = error::identifier("lock_id", lock_id)?;
    let owner = error::identifier("owner", owner)?;
    let ttl = error::ttl(ttl)?;
    error::writable_server()?;
    let mut args = [
        DatumWithOid::from(lock_id),
        owner.into(),
        calling_role().into(),
        ttl.into(),
        server_now()?.into(),
        DatumWithOid::null::<i64>(), // the epoch, known once a grant is likely
    ];
    let granted = Spi::connect_mut(|client| -> Result<Option<Granted>, LockError> {
        let held_by_other = first_value::<bool>(PEEK.run(client, &args)?)?;
        if held_by_other == Some(true) {
            return Ok(None); // a live lease of someone else's
        }
        args[5] = token::prepare_to_mint(client)?.into();
        Ok(match held_by_other {
            Some(_) => take_over(client, &args)?,
            None if !try_claim(lock_id) => None, // being created right now
            None => match grant_row(INSERT_NEW.run(client, &args)?)? {
                Some(grant) => Some(grant),
                None => take_over(client, &args)?, // created since we looked
            },
        })
    })?;
    let Some(Granted { grant, minted, took_over }) = granted else {
        stats::count(Counter::AcquiresRefused);
        return Ok(None);
    };
    if minted {
        token::after_mint();
    }
    stats::count(Counter::AcquiresGranted);
    if took_over {
        stats::count(Counter::TakeOvers);
    }
    Ok(Some(grant))
}

struct Granted {
    grant: Grant,
    minted: bool,
    took_over: bool, // an expired lease taken over in place
}

fn take_over(
    client: &mut SpiClient<'_>,
    args: &[DatumWithOid<'_>],
) -> Result<Option<Granted>, LockError> {
    let granted = grant_row(TAKE_OVER.run(client, args)?)?;
    Ok(granted.map(|g| Granted { took_over: g.minted, ..g }))
}

/// The grant from an acquire statement's RETURNING, if any.
fn grant_row(rows: pgrx::spi::SpiTupleTable<'_>) -> Result<Option<Granted>, LockError> {
    if rows.is_empty() {
        return Ok(None);
    }
    let row = rows.first();
    let (Some(grant), Some(minted)) = (row.get::<Grant>(1)?, row.get::<bool>(2)?) else {
        return Ok(None);
    };
    Ok(Some(Granted { grant, minted, took_over: false }))
}

pub fn renew(
    lock_id: Option<&str>,
    owner: Option<&str>,
    ttl: Option<Interval>,
    fence_token: Option<i64>,
) -> Result<Option<TimestampWithTimeZone>, LockError> {
    let lock_id = error::identifier("lock_id", lock_id)?;
    let owner = error::identifier("owner", owner)?;
    let ttl = error::ttl(ttl)?;
    let fence_token = error::optional_token("fence_token", fence_token)?;
    error::writable_server()?;
    let args = [
        DatumWithOid::from(lock_id),
        owner.into(),
        calling_role().into(),
        ttl.into(),
        server_now()?.into(),
        fence_token.into(),
    ];
    let renewed = Spi::connect_mut(|client| first_value(RENEW.run(client, &args)?))?;
    stats::count(if renewed.is_some() { Counter::RenewalsOk } else { Counter::RenewalsFailed });
    Ok(renewed)
}

pub fn release(
    lock_id: Option<&str>,
    owner: Option<&str>,
    fence_token: Option<i64>,
) -> Result<bool, LockError> {
    let lock_id = error::identifier("lock_id", lock_id)?;
    let owner = error::identifier("owner", owner)?;
    let fence_token = error::optional_token("fence_token", fence_token)?;
    error::writable_server()?;
    let args = [
        DatumWithOid::from(lock_id),
        owner.into(),
        calling_role().into(),
        server_now()?.into(),
        fence_token.into(),
    ];
    let released = Spi::connect_mut(|client| first_value::<bool>(RELEASE.run(client, &args)?))?;
    let released = released.unwrap_or(false);
    stats::count(if released { Counter::ReleasesOk } else { Counter::ReleasesFailed });
    Ok(released)
}

/// The server's clock now: what `clock_timestamp()` returns. Never the transaction's start
/// (`now()`), which inside a long transaction would make leases look younger than they are.
pub fn server_now() -> Result<TimestampWithTimeZone, LockError> {
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    TimestampWithTimeZone::try_from(now).map_err(|_| LockError::ClockOutOfRange)
}

/// The role that called us. Inside a SECURITY DEFINER function the current user is the
/// definer; the caller is the "outer" user.
fn calling_role() -> pg_sys::Oid {
    unsafe { pg_sys::GetOuterUserId() }
}

/// Claims the creation of a lock id's first row for this transaction, without waiting.
///
/// A row being inserted by an open transaction cannot be locked, and an INSERT that meets
/// it waits for that transaction to end. So whoever inserts a lease first takes this lock,
/// held to the end of its transaction; a second creator fails to take it and answers
/// "not available" at once. The key is a 64-bit hash of the lock id: a collision only
/// makes two ids contend for creation, never for ownership.
///
/// Claims use the server's shared lock table, sized by max_locks_per_transaction. One
/// transaction keeps at most half that many: past it (a bulk load of leases in one
/// transaction), a claim is only tested, not kept, so the call still never waits, but a
/// rival creating one of those same ids may wait for the bulk transaction to end.
pub fn try_claim(key: &str) -> bool {
    let hash = fnv1a(key.as_bytes());
    let tag = pg_sys::LOCKTAG {
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: (hash >> 32) as u32,
        locktag_field3: hash as u32,
        locktag_field4: CLAIM_TAG,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    };
    let mode = pg_sys::ExclusiveLock as pg_sys::LOCKMODE;
    let taken = unsafe { pg_sys::LockAcquire(&tag, mode, false, true) }
        != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL;
    if taken && !keep_another_claim() {
        unsafe { pg_sys::LockRelease(&tag, mode, false) };
    }
    taken
}

thread_local! {
    // (local transaction id, claims kept in it)
    static CLAIMS_KEPT: Cell<(u32, i32)> = const { Cell::new((0, 0)) };
}

/// Counts a kept claim against this transaction's budget; false when the budget is spent.
fn keep_another_claim() -> bool {
    let lxid = unsafe { (*pg_sys::MyProc).lxid };
    let budget = unsafe { pg_sys::max_locks_per_xact } / 2;
    CLAIMS_KEPT.with(|kept| {
        let (xact, n) = kept.get();
        let n = if xact == lxid { n } else { 0 };
        if n >= budget {
            return false;
        }
        kept.set((lxid, n + 1));
        true
    })
}

/// FNV-1a, 64 bits: stable across builds and processes, as a lock key shared by backends
/// (possibly running different builds during an upgrade) must be.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
