//! Leases: lock_acquire, lock_renew, lock_release.
//!
//! A lease is one row of `lockext.locks`. Unless a caller asks lock_acquire to wait (and
//! then it waits in lockext's own queue, `wait.rs`), none of these functions ever waits for
//! another transaction: a lease that someone else is in the middle of changing (an acquire
//! or a release inside a transaction that is still open, the reaper deleting it) counts as
//! not available, and the call answers at once. Row changes use `FOR UPDATE SKIP LOCKED`;
//! the one change that has no row to lock yet, the first insert of a lock id, is claimed
//! with a transaction-scoped lock that is only ever tried (`try_claim`).
//!
//! Time is the server's clock as `clock_timestamp()` reads it, taken once per call, so all
//! the tests of one call agree on "now" even if the clock steps while it runs.

use std::cell::Cell;
use std::time::{Duration, Instant};

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::commit;
use crate::error::{self, LockError, OrReport};
use crate::settings;
use crate::statements::{first_value, Statement};
use crate::stats::{self, Counter};
use crate::token::{self, mint_sql};
use crate::wait;

/// Marks lockext's claims among advisory locks in `pg_locks` (objsubid 19531, "LK"); the
/// built-in advisory functions use 1 and 2, so the two never collide.
const CLAIM_TAG: u16 = 0x4C4B;

// Parameters shared by the acquire statements: $1 lock_id, $2 owner, $3 calling role,
// $4 ttl, $5 now, $6 token epoch, $7 the new grant's lock-delay.
const ACQUIRE_PARAMS: &[pg_sys::PgBuiltInOids] = &[
    TEXTOID,
    TEXTOID,
    OIDOID,
    INTERVALOID,
    TIMESTAMPTZOID,
    INT8OID,
    INTERVALOID,
];

// Is the lock held by someone else (live, or expired but within its lock-delay), and if
// so, in how many milliseconds will it be free unless renewed?
static PEEK: Statement = Statement {
    sql: "SELECT expires_at + lock_delay > $5 AND NOT (owner = $2 AND holder_role = $3), \
                 (extract(epoch FROM expires_at + lock_delay - $5) * 1000)::bigint \
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
                lock_delay = $7, \
                taker_pid = pg_backend_pid(), \
                application_name = current_setting('application_name'), \
                client_addr = inet_client_addr() \
           FROM (SELECT lock_id, fence_token AS old_token, \
                        expires_at > $5 AND owner = $2 AND holder_role = $3 AS same_grant \
                   FROM lockext.locks \
                  WHERE lock_id = $1 \
                    AND (expires_at + lock_delay <= $5 OR (owner = $2 AND holder_role = $3)) \
                    FOR UPDATE SKIP LOCKED) AS c \
          WHERE l.lock_id = c.lock_id \
         RETURNING ROW(l.lock_id, l.owner, l.fence_token, l.acquired_at, l.expires_at)::lockext.lock_grant, \
                   NOT c.same_grant, c.old_token, l.fence_token"
    ),
    params: ACQUIRE_PARAMS,
};

static INSERT_NEW: Statement = Statement {
    sql: concat!(
        "INSERT INTO lockext.locks AS l \
                (lock_id, owner, holder_role, fence_token, acquired_at, expires_at, \
                 renewals, lock_delay, taker_pid, application_name, client_addr) \
         VALUES ($1, $2, $3, ",
        mint_sql!(),
        ", $5, $5 + $4, 0, $7, pg_backend_pid(), current_setting('application_name'), inet_client_addr()) \
         ON CONFLICT (lock_id) DO NOTHING \
         RETURNING ROW(l.lock_id, l.owner, l.fence_token, l.acquired_at, l.expires_at)::lockext.lock_grant, \
                   true, NULL::bigint, l.fence_token"
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
    params: &[
        TEXTOID,
        TEXTOID,
        OIDOID,
        INTERVALOID,
        TIMESTAMPTZOID,
        INT8OID,
    ],
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
          RETURNING c.live, l.fence_token",
    params: &[TEXTOID, TEXTOID, OIDOID, TIMESTAMPTZOID, INT8OID],
};

// NOTIFY lockext '{"event": ..., "lock_id": ..., "fence_token": ..., ...}', sent at commit.
static NOTIFY: Statement = Statement {
    sql: "SELECT pg_notify('lockext', json_build_object('event', $1, 'lock_id', $2, 'fence_token', $3, \
                                                       'previous_fence_token', $4)::text)",
    params: &[TEXTOID, TEXTOID, INT8OID, INT8OID],
};

type Grant = pgrx::composite_type!('static, "lock_grant");

/// Takes the lock `lock_id` for `owner` for `ttl`, waiting up to `wait` for it; NULL if a
/// live lease still holds it. `lock_delay` (default: the lockext.lock_delay setting) keeps
/// the lock unavailable that long after this grant's lease expires without a release.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lock_acquire(
    lock_id: Option<&str>,
    owner: Option<&str>,
    ttl: Option<Interval>,
    wait: default!(Option<Interval>, "'0 seconds'"),
    lock_delay: default!(Option<Interval>, "NULL"),
) -> Option<pgrx::composite_type!('static, "lock_grant")> {
    acquire(lock_id, owner, ttl, wait, lock_delay).or_report()
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
    wait: Option<Interval>,
    lock_delay: Option<Interval>,
) -> Result<Option<Grant>, LockError> {
    let _timer = stats::AcquireTimer::start();
    let lock_id = error::identifier("lock_id", lock_id)?;
    let owner = error::identifier("owner", owner)?;
    let ttl = error::ttl(ttl)?;
    // NULL waits no more than the default does: not at all.
    let wait = match wait {
        None => Duration::ZERO,
        some => error::duration("wait", some)?,
    };
    let lock_delay = match lock_delay {
        None => Duration::from_millis(settings::LOCK_DELAY_MS.get() as u64),
        some => error::duration("lock_delay", some)?,
    };
    error::writable_server()?;
    if !wait.is_zero() && unsafe { pg_sys::XactIsoLevel } > pg_sys::XACT_READ_COMMITTED as i32 {
        return Err(LockError::WaitNeedsReadCommitted);
    }
    let mut args = [
        DatumWithOid::from(lock_id),
        owner.into(),
        calling_role().into(),
        ttl.into(),
        server_now()?.into(),
        DatumWithOid::null::<i64>(), // the epoch, known once a grant is likely
        micros_interval(lock_delay).into(),
    ];
    let granted = if wait.is_zero() {
        attempt(lock_id, &mut args, 0)?.0
    } else {
        wait_for(lock_id, &mut args, Instant::now() + wait)?
    };
    let Some(Granted {
        grant,
        minted,
        took_over,
        previous_token,
        token,
    }) = granted
    else {
        stats::count(Counter::AcquiresRefused);
        return Ok(None);
    };
    if minted {
        token::after_mint();
    }
    stats::count(Counter::AcquiresGranted);
    if took_over {
        stats::count(Counter::TakeOvers);
        notify("taken_over", lock_id, token, previous_token)?;
    }
    Ok(Some(grant))
}

/// Queues for the lock and tries each time it is woken (or its nap ends), until the
/// deadline. The server clock in `args` is read again before each try.
fn wait_for(
    lock_id: &str,
    args: &mut [DatumWithOid<'_>; 7],
    deadline: Instant,
) -> Result<Option<Granted>, LockError> {
    let ticket = wait::Ticket::take(lock_id);
    let mut nap = Duration::ZERO;
    loop {
        let mut free_in = None;
        if ticket.is_head() {
            args[4] = server_now()?.into();
            let (granted, until_free) = attempt(lock_id, args, ticket.number())?;
            if granted.is_some() {
                return Ok(granted);
            }
            free_in = until_free;
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        nap = wait::next_nap(ticket.queued(), nap);
        if let Some(free_in) = free_in {
            nap = nap.min(free_in + Duration::from_millis(1));
        }
        wait::nap(deadline, nap);
    }
}

/// One try at the lock. Returns the grant, or none and, when the lock is held, how soon it
/// will be free unless its holder renews.
fn attempt(
    lock_id: &str,
    args: &mut [DatumWithOid<'_>; 7],
    ticket: u64,
) -> Result<(Option<Granted>, Option<Duration>), LockError> {
    if wait::others_ahead(lock_id, ticket) {
        return Ok((None, None)); // callers queue for this lock: no jumping the queue
    }
    Spi::connect_mut(|client| {
        let (held_by_other, free_in_ms) = peek(client, args)?;
        if held_by_other == Some(true) {
            let free_in = free_in_ms.map(|ms| Duration::from_millis(ms.max(0) as u64));
            return Ok((None, free_in)); // a live lease of someone else's
        }
        args[5] = token::prepare_to_mint(client)?.into();
        let granted = match held_by_other {
            Some(_) => take_over(client, &args[..])?,
            None if !try_claim(lock_id) => None, // being created right now
            None => match grant_row(INSERT_NEW.run(client, &args[..])?)? {
                Some(grant) => Some(grant),
                None => take_over(client, &args[..])?, // created since we looked
            },
        };
        Ok((granted, None))
    })
}

fn peek(
    client: &mut SpiClient<'_>,
    args: &[DatumWithOid<'_>],
) -> Result<(Option<bool>, Option<i64>), LockError> {
    let rows = PEEK.run(client, args)?;
    if rows.is_empty() {
        return Ok((None, None));
    }
    let row = rows.first();
    Ok((row.get::<bool>(1)?, row.get::<i64>(2)?))
}

struct Granted {
    grant: Grant,
    minted: bool,
    took_over: bool, // an expired lease taken over in place
    previous_token: Option<i64>,
    token: i64,
}

fn take_over(
    client: &mut SpiClient<'_>,
    args: &[DatumWithOid<'_>],
) -> Result<Option<Granted>, LockError> {
    let granted = grant_row(TAKE_OVER.run(client, args)?)?;
    Ok(granted.map(|g| Granted {
        took_over: g.minted,
        ..g
    }))
}

/// The grant from an acquire statement's RETURNING, if any.
fn grant_row(rows: pgrx::spi::SpiTupleTable<'_>) -> Result<Option<Granted>, LockError> {
    if rows.is_empty() {
        return Ok(None);
    }
    let row = rows.first();
    let (Some(grant), Some(minted), Some(token)) = (
        row.get::<Grant>(1)?,
        row.get::<bool>(2)?,
        row.get::<i64>(4)?,
    ) else {
        return Ok(None);
    };
    let previous_token = row.get::<i64>(3)?;
    Ok(Some(Granted {
        grant,
        minted,
        took_over: false,
        previous_token,
        token,
    }))
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
    let only_leases = commit::only_leases_so_far();
    let renewed = Spi::connect_mut(|client| first_value(RENEW.run(client, &args)?))?;
    commit::relax_if_only_leases(only_leases);
    stats::count(if renewed.is_some() {
        Counter::RenewalsOk
    } else {
        Counter::RenewalsFailed
    });
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
    let only_leases = commit::only_leases_so_far();
    let deleted = Spi::connect_mut(|client| -> Result<Option<(bool, i64)>, LockError> {
        let rows = RELEASE.run(client, &args)?;
        if rows.is_empty() {
            return Ok(None);
        }
        let row = rows.first();
        Ok(Some((
            row.get::<bool>(1)?.unwrap_or(false),
            row.get::<i64>(2)?.unwrap_or(0),
        )))
    })?;
    commit::relax_if_only_leases(only_leases);
    if deleted.is_some() {
        wait::wake_head_at_commit(lock_id);
    }
    let released = matches!(deleted, Some((true, _)));
    stats::count(if released {
        Counter::ReleasesOk
    } else {
        Counter::ReleasesFailed
    });
    if let Some((true, token)) = deleted {
        notify("released", lock_id, token, None)?;
    }
    Ok(released)
}

/// Sends a lockext event to LISTENers of channel `lockext` when the transaction commits,
/// if `lockext.notify` is on.
pub fn notify(
    event: &str,
    lock_id: &str,
    token: i64,
    previous: Option<i64>,
) -> Result<(), LockError> {
    if !settings::NOTIFY.get() {
        return Ok(());
    }
    Spi::connect_mut(|client| {
        NOTIFY.run(
            client,
            &[event.into(), lock_id.into(), token.into(), previous.into()],
        )?;
        Ok(())
    })
}

/// A duration as an interval of plain microseconds.
fn micros_interval(d: Duration) -> Interval {
    Interval::new(0, 0, d.as_micros() as i64)
        .unwrap_or_else(|_| Interval::new(0, 0, 0).expect("zero"))
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
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
