//! Leases: lock_acquire, lock_renew, lock_release.
//!
//! An exclusive lease is one row of `lockext.locks`; shared leases and semaphore permits
//! are rows of `lockext.shared_leases` (`shared.rs`). Renew and release serve every kind.
//!
//! Unless a caller asks lock_acquire to wait (and then it waits in lockext's own queue,
//! `wait.rs`), none of these functions ever waits for another transaction: a lease that
//! someone else is in the middle of changing (an acquire or a release inside a transaction
//! that is still open, the reaper deleting it) counts as not available, and the call
//! answers at once. Every acquire first passes its lock id's gate, a transaction-scoped
//! lock that is only ever tried (`claims.rs`); row changes use `FOR UPDATE SKIP LOCKED`.
//!
//! Time is the server's clock as `clock_timestamp()` reads it, taken once per call, so all
//! the tests of one call agree on "now" even if the clock steps while it runs.

use std::time::{Duration, Instant};

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::caller;
use crate::claims;
use crate::commit;
use crate::error::{self, LockError, OrReport};
use crate::session;
use crate::settings;
use crate::shared;
use crate::statements::{first_value, Statement};
use crate::stats::{self, Counter};
use crate::token;
use crate::wait;
use crate::xact;

// Parameters shared by the acquire statements: $1 lock_id, $2 owner, $3 calling role,
// $4 ttl, $5 now, $6 the new grant's token (`token::mint`, once the grant is decided),
// $7 the new grant's lock-delay, $8 the session the lease is bound to (NULL: none), $9 the
// semaphore's permits and $10 the permit's slot (shared_leases only).
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
];

/// Milliseconds from now ($5) to a time, for a waiter's nap.
macro_rules! ms_until {
    ($t:literal) => {
        concat!("(extract(epoch FROM ", $t, " - $5) * 1000)::bigint")
    };
}
pub(crate) use ms_until;

/// What an acquire sets on the lease it grants, in either lease table; `c` is the row it
/// took, with `same_grant` when that is the caller's own live lease.
macro_rules! grant_sets {
    () => {
        concat!(
            "owner = $2, holder_role = $3, \
             fence_token = CASE WHEN c.same_grant THEN l.fence_token ELSE $6 END, \
             acquired_at = CASE WHEN c.same_grant THEN l.acquired_at ELSE $5 END, \
             expires_at = $5 + $4, \
             renewals = CASE WHEN c.same_grant THEN l.renewals + 1 ELSE 0 END, \
             lock_delay = $7, session_start = $8, \
             taker_pid = pg_backend_pid(), \
             application_name = current_setting('application_name'), \
             client_addr = inet_client_addr()"
        )
    };
}
pub(crate) use grant_sets;

/// What an acquire statement returns, as plain columns (`Granted`): the grant's, then
/// whether it minted a token and the token it replaced (a take-over).
macro_rules! grant_returning {
    () => {
        " RETURNING l.lock_id, l.owner, l.fence_token, l.acquired_at, l.expires_at, "
    };
}
pub(crate) use grant_returning;

// Read under the newest snapshot (`Statement::read_latest`), after passing the gate. Is
// the lock held by someone else (live, or expired but within its lock-delay), and how
// soon will it be free unless renewed? Do shared leases or permits hold it, and until when?
static PEEK: Statement = Statement {
    sql: concat!(
        "SELECT x.held, x.free_ms, s.until_ms, s.semaphore, x.mine_live, s.dead \
           FROM (SELECT) AS one \
           LEFT JOIN LATERAL ( \
                SELECT expires_at + lock_delay > $5 AND NOT (owner = $2 AND holder_role = $3) AS held, \
                       expires_at > $5 AND owner = $2 AND holder_role = $3 AS mine_live, ",
        ms_until!("expires_at + lock_delay"),
        " AS free_ms FROM lockext.locks WHERE lock_id = $1) AS x ON true \
           CROSS JOIN LATERAL ( \
                SELECT ",
        ms_until!("max(expires_at + lock_delay) FILTER (WHERE live)"),
        " AS until_ms, bool_or(permits IS NOT NULL) FILTER (WHERE live) AS semaphore, \
                       count(*) FILTER (WHERE NOT live) AS dead \
                  FROM (SELECT permits, expires_at, lock_delay, expires_at + lock_delay > $5 AS live \
                          FROM lockext.shared_leases WHERE lock_id = $1) AS sl) AS s"
    ),
    params: ACQUIRE_PARAMS,
};

// Dead leases of another kind, or in the slot a permit taker claimed, are deleted before
// a grant that needs them dead, skipping any row that someone holds locked: a renewal that
// got there first (it locks the row it extends). The answer is whether every dead row the
// statement's snapshot shows is gone; if not, the grant is refused as if the lease were
// live. So a renewal and a conflicting grant can never both succeed: whichever locks the
// row first wins, and a renewal that comes second finds its row deleted. (Reading the
// dead rows without deleting them, as 0.2.0 did, let a renewal paused after reading the
// clock revive a lease that a conflicting grant had already seen expire.)
macro_rules! clear_dead_sql {
    ($table:literal, $key:literal, $same_row:literal, $which:literal) => {
        concat!(
            "WITH dead AS (SELECT ",
            $key,
            " FROM ",
            $table,
            " \
                            WHERE lock_id = $1 AND expires_at + lock_delay <= $5 ",
            $which,
            " \
                              FOR UPDATE SKIP LOCKED), \
                  gone AS (DELETE FROM ",
            $table,
            " AS t USING dead \
                            WHERE ",
            $same_row,
            " RETURNING 1) \
             SELECT (SELECT count(*) FROM gone) = \
                    (SELECT count(*) FROM ",
            $table,
            " \
                      WHERE lock_id = $1 AND expires_at + lock_delay <= $5 ",
            $which,
            ")"
        )
    };
}

/// Before an exclusive grant: every dead shared lease and permit of the lock id.
pub static CLEAR_DEAD_SHARED: Statement = Statement {
    sql: clear_dead_sql!(
        "lockext.shared_leases",
        "lock_id, owner",
        "t.lock_id = dead.lock_id AND t.owner = dead.owner",
        ""
    ),
    params: ACQUIRE_PARAMS,
};
/// Before a shared lease or a permit: the dead exclusive lease of the lock id.
pub static CLEAR_DEAD_EXCLUSIVE: Statement = Statement {
    sql: clear_dead_sql!("lockext.locks", "lock_id", "t.lock_id = dead.lock_id", ""),
    params: ACQUIRE_PARAMS,
};
/// Before a permit in slot $10: the dead permits of others in that slot.
pub static CLEAR_DEAD_SLOT: Statement = Statement {
    sql: clear_dead_sql!(
        "lockext.shared_leases",
        "lock_id, owner",
        "t.lock_id = dead.lock_id AND t.owner = dead.owner",
        "AND slot = $10 AND NOT (owner = $2 AND holder_role = $3)"
    ),
    params: ACQUIRE_PARAMS,
};

/// Runs a `CLEAR_DEAD_*` statement: whether every dead lease it looked for is gone. When
/// not, nothing it did is kept (`xact::kept_if_found`): it may hold a renewed lease locked.
pub fn clear_dead(
    client: &mut SpiClient<'_>,
    statement: &'static Statement,
    args: &Args<'_>,
) -> Result<bool, LockError> {
    let cleared = xact::kept_if_found(|| {
        let all_gone = first_value::<bool>(statement.run(client, &args[..])?)? == Some(true);
        Ok(all_gone.then_some(()))
    })?;
    Ok(cleared.is_some())
}

// Takes over an expired lease, or extends the caller's own live one (same grant, same
// token). Either way in place: there is no moment at which the lock id has no row.
static TAKE_OVER: Statement = Statement {
    sql: concat!(
        "UPDATE lockext.locks AS l SET ",
        grant_sets!(),
        " FROM (SELECT lock_id, fence_token AS old_token, \
                        expires_at > $5 AND owner = $2 AND holder_role = $3 AS same_grant \
                   FROM lockext.locks \
                  WHERE lock_id = $1 \
                    AND (expires_at + lock_delay <= $5 OR (owner = $2 AND holder_role = $3)) \
                    FOR UPDATE SKIP LOCKED) AS c \
          WHERE l.lock_id = c.lock_id",
        grant_returning!(),
        "NOT c.same_grant, c.old_token"
    ),
    params: ACQUIRE_PARAMS,
};

static INSERT_NEW: Statement = Statement {
    sql: concat!(
        "INSERT INTO lockext.locks AS l \
                (lock_id, owner, holder_role, fence_token, acquired_at, expires_at, renewals, \
                 lock_delay, session_start, taker_pid, application_name, client_addr) \
         VALUES ($1, $2, $3, $6, $5, $5 + $4, 0, $7, $8, pg_backend_pid(), current_setting('application_name'), \
           inet_client_addr()) \
         ON CONFLICT (lock_id) DO NOTHING",
        grant_returning!(),
        "true, NULL::bigint"
    ),
    params: ACQUIRE_PARAMS,
};

// Renew and release find the caller's lease by lock id and owner, in either table.
macro_rules! renew_sql {
    ($table:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " AS l SET expires_at = $5 + $4, renewals = l.renewals + 1 \
               FROM (SELECT lock_id, owner FROM ",
            $table,
            " \
                      WHERE lock_id = $1 AND owner = $2 AND expires_at > $5 \
                        AND (holder_role = $3 OR pg_has_role($3, 'lockext_admin', 'MEMBER')) \
                        AND ($6::bigint IS NULL OR fence_token = $6) \
                        FOR UPDATE SKIP LOCKED) AS c \
              WHERE l.lock_id = c.lock_id AND l.owner = c.owner \
             RETURNING l.expires_at"
        )
    };
}

const RENEW_PARAMS: &[pg_sys::PgBuiltInOids] = &[
    TEXTOID,
    TEXTOID,
    OIDOID,
    INTERVALOID,
    TIMESTAMPTZOID,
    INT8OID,
];
static RENEW: [Statement; 2] = [
    Statement {
        sql: renew_sql!("lockext.locks"),
        params: RENEW_PARAMS,
    },
    Statement {
        sql: renew_sql!("lockext.shared_leases"),
        params: RENEW_PARAMS,
    },
];

// Deletes the caller's row whether or not it has expired (that is only cleanup), and
// reports whether the lease was still live: only then did the caller hold the lock.
macro_rules! release_sql {
    ($table:literal) => {
        concat!(
            "DELETE FROM ",
            $table,
            " AS l \
              USING (SELECT lock_id, owner, expires_at > $4 AS live FROM ",
            $table,
            " \
                      WHERE lock_id = $1 AND owner = $2 \
                        AND (holder_role = $3 OR pg_has_role($3, 'lockext_admin', 'MEMBER')) \
                        AND ($5::bigint IS NULL OR fence_token = $5) \
                        FOR UPDATE SKIP LOCKED) AS c \
              WHERE l.lock_id = c.lock_id AND l.owner = c.owner \
             RETURNING c.live, l.fence_token"
        )
    };
}

const RELEASE_PARAMS: &[pg_sys::PgBuiltInOids] =
    &[TEXTOID, TEXTOID, OIDOID, TIMESTAMPTZOID, INT8OID];
static RELEASE: [Statement; 2] = [
    Statement {
        sql: release_sql!("lockext.locks"),
        params: RELEASE_PARAMS,
    },
    Statement {
        sql: release_sql!("lockext.shared_leases"),
        params: RELEASE_PARAMS,
    },
];

// NOTIFY lockext '{"event": ..., "lock_id": ..., "fence_token": ..., ...}', sent at commit.
static NOTIFY: Statement = Statement {
    sql: "SELECT pg_notify('lockext', json_build_object('event', $1, 'lock_id', $2, 'fence_token', $3, \
                                                       'previous_fence_token', $4)::text)",
    params: &[TEXTOID, TEXTOID, INT8OID, INT8OID],
};

pub type Grant = pgrx::composite_type!('static, "lock_grant");

/// What kind of lease an acquire asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Exclusive,
    Shared,
    Semaphore(i32),
}

impl Kind {
    /// From lock_acquire's `mode` and `permits`; NULL means the default, as for `wait`.
    pub fn parse(mode: Option<&str>, permits: Option<i32>) -> Result<Kind, LockError> {
        let shared = match mode.unwrap_or("exclusive") {
            "exclusive" => false,
            "shared" => true,
            other => {
                return Err(LockError::UnknownMode {
                    mode: other.to_string(),
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
    pub lock_id: &'a str,
    pub owner: &'a str,
    pub ttl: Interval,
    pub wait: Duration,
    pub lock_delay: Duration,
    pub kind: Kind,
    pub session: Option<TimestampWithTimeZone>,
}

impl<'a> Request<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn validate(
        lock_id: &'a str,
        owner: Option<&'a str>,
        ttl: Option<Interval>,
        wait: Option<Interval>,
        lock_delay: Option<Interval>,
        mode: Option<&str>,
        permits: Option<i32>,
        session_bound: Option<bool>,
    ) -> Result<Request<'a>, LockError> {
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
        let kind = Kind::parse(mode, permits)?;
        error::writable_server()?;
        if !wait.is_zero() && unsafe { pg_sys::XactIsoLevel } > pg_sys::XACT_READ_COMMITTED as i32 {
            return Err(LockError::WaitNeedsReadCommitted);
        }
        let session = match session_bound {
            Some(true) => Some(session::bind()?),
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
        })
    }
}

/// Takes the lock `lock_id` for `owner` for `ttl`, waiting up to `wait` for it; NULL if
/// it is not available. `lock_delay` (default: the lockext.lock_delay setting) keeps the
/// lock unavailable that long after this grant's lease expires without a release. `mode`
/// 'shared' takes one of many shared (read) leases; `permits` takes one permit of a
/// semaphore with that many; `session_bound` also ends the lease when this session does.
#[allow(clippy::too_many_arguments)]
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn lock_acquire(
    lock_id: Option<&str>,
    owner: Option<&str>,
    ttl: Option<Interval>,
    wait: default!(Option<Interval>, "'0 seconds'"),
    lock_delay: default!(Option<Interval>, "NULL"),
    mode: default!(Option<&str>, "'exclusive'"),
    permits: default!(Option<i32>, "NULL"),
    session_bound: default!(Option<bool>, "false"),
) -> Option<pgrx::composite_type!('static, "lock_grant")> {
    caller::as_owner(|| {
        let lock_id = error::identifier("lock_id", lock_id)?;
        let request = Request::validate(
            lock_id,
            owner,
            ttl,
            wait,
            lock_delay,
            mode,
            permits,
            session_bound,
        )?;
        acquire(&request)?.map(|g| g.to_grant()).transpose()
    })
    .or_report()
}

/// Extends the caller's live lease to now + `ttl`; NULL when the caller holds none.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn lock_renew(
    lock_id: Option<&str>,
    owner: Option<&str>,
    ttl: Option<Interval>,
    fence_token: default!(Option<i64>, "NULL"),
) -> Option<TimestampWithTimeZone> {
    caller::as_owner(|| renew(lock_id, owner, ttl, fence_token)).or_report()
}

/// Ends the caller's lease; true when the caller still held it.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn lock_release(
    lock_id: Option<&str>,
    owner: Option<&str>,
    fence_token: default!(Option<i64>, "NULL"),
) -> bool {
    caller::as_owner(|| release(lock_id, owner, fence_token)).or_report()
}

pub fn acquire(request: &Request<'_>) -> Result<Option<Granted>, LockError> {
    let _timer = stats::AcquireTimer::start();
    let permits = match request.kind {
        Kind::Semaphore(n) => Some(n),
        _ => None,
    };
    let mut args = [
        DatumWithOid::from(request.lock_id),
        request.owner.into(),
        caller::role().into(),
        request.ttl.into(),
        server_now()?.into(),
        DatumWithOid::null::<i64>(), // the token, minted once the grant is decided
        micros_interval(request.lock_delay).into(),
        request.session.into(),
        permits.into(),
        DatumWithOid::null::<i32>(), // the slot, chosen by a semaphore's taker
    ];
    let granted = if request.wait.is_zero() {
        attempt(request, &mut args, 0)?.0
    } else {
        wait_for(request, &mut args, Instant::now() + request.wait)?
    };
    let Some(granted) = granted else {
        stats::count(Counter::AcquiresRefused);
        return Ok(None);
    };
    stats::count(Counter::AcquiresGranted);
    if request.kind != Kind::Exclusive {
        // Shared leases and permits are many: the next in line may be free to take one too.
        wait::wake_head_at_commit(request.lock_id);
    }
    if granted.took_over {
        stats::count(Counter::TakeOvers);
        notify(
            "taken_over",
            request.lock_id,
            granted.token,
            granted.previous_token,
        )?;
    }
    Ok(Some(granted))
}

pub type Args<'a> = [DatumWithOid<'a>; 10];

/// Queues for the lock and tries each time it is woken (or its nap ends), until the
/// deadline. The server clock in `args` is read again before each try.
fn wait_for(
    request: &Request<'_>,
    args: &mut Args<'_>,
    deadline: Instant,
) -> Result<Option<Granted>, LockError> {
    let ticket = wait::Ticket::take(request.lock_id, queue_window(request.kind));
    let mut nap = Duration::ZERO;
    loop {
        let mut free_in = None;
        if ticket.may_try() {
            args[4] = server_now()?.into();
            let (granted, until_free) = attempt(request, args, ticket.number())?;
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

/// What one try came to: the grant, or none and, when the lock is held, how soon it will be
/// free unless its holders renew.
pub type Attempt = (Option<Granted>, Option<Duration>);

/// One try at the lock, through its gate (`claims.rs`).
fn attempt(request: &Request<'_>, args: &mut Args<'_>, ticket: u64) -> Result<Attempt, LockError> {
    // Shared leases and permits go side by side (a semaphore's takers then claim slots);
    // an exclusive acquire goes alone.
    let mode = match request.kind {
        Kind::Exclusive => claims::Mode::Exclusive,
        _ => claims::Mode::Shared,
    };
    // No jumping the queue of callers waiting for this lock, and no passing the gate while
    // a conflicting acquire is in flight...
    let gate = if jumps_the_queue(request, ticket) {
        None
    } else {
        claims::try_gate(request.lock_id, mode)?
    };
    let gate = match (gate, request.kind) {
        (Some(gate), Kind::Shared | Kind::Semaphore(_)) => {
            let semaphore = matches!(request.kind, Kind::Semaphore(_));
            if claims::try_kind(request.lock_id, semaphore)? {
                Some(gate)
            } else {
                gate.reopen();
                None
            }
        }
        (gate, _) => gate,
    };
    let Some(gate) = gate else {
        // ...except for a holder asking again (a retry after a lost reply): it gets its
        // live grant back, which changes no one's chances.
        return Ok((
            Spi::connect_mut(|client| extend_own(client, request, args))?,
            None,
        ));
    };
    let tried = Spi::connect_mut(|client| match request.kind {
        Kind::Exclusive => attempt_exclusive(client, request, args),
        _ => shared::attempt(client, request, args),
    })?;
    if tried.0.is_none() {
        gate.reopen();
    }
    Ok(tried)
}

/// How far back in the queue a waiter may try: a semaphore of n permits can hand n over
/// at once, and the first n in line take them in whatever order their tries land; any
/// other lock goes to the head of the queue alone.
fn queue_window(kind: Kind) -> usize {
    match kind {
        Kind::Semaphore(n) => n as usize,
        _ => 1,
    }
}

/// Whether trying now would jump the queue of this lock. A caller that does not wait
/// (ticket 0) never goes ahead of anyone queued.
fn jumps_the_queue(request: &Request<'_>, ticket: u64) -> bool {
    let window = if ticket == 0 {
        1
    } else {
        queue_window(request.kind)
    };
    !wait::may_try(request.lock_id, ticket, window)
}

// Extends the caller's own live lease, the same grant; never takes anything new.
macro_rules! extend_sql {
    ($table:literal) => {
        concat!(
            "UPDATE ", $table, " AS l SET ",
            grant_sets!(),
            " FROM (SELECT lock_id, owner, fence_token AS old_token, true AS same_grant \
                      FROM ", $table, " \
                     WHERE lock_id = $1 AND owner = $2 AND holder_role = $3 AND expires_at > $5 \
                       FOR UPDATE SKIP LOCKED) AS c \
              WHERE l.lock_id = c.lock_id AND l.owner = c.owner",
            grant_returning!(),
            "false, c.old_token"
        )
    };
}

static EXTEND: [Statement; 2] = [
    Statement {
        sql: extend_sql!("lockext.locks"),
        params: ACQUIRE_PARAMS,
    },
    Statement {
        sql: extend_sql!("lockext.shared_leases"),
        params: ACQUIRE_PARAMS,
    },
];

fn extend_own(
    client: &mut SpiClient<'_>,
    request: &Request<'_>,
    args: &Args<'_>,
) -> Result<Option<Granted>, LockError> {
    let table = usize::from(request.kind != Kind::Exclusive);
    grant_by(client, &EXTEND[table], args)
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
    args: &[DatumWithOid<'_>],
) -> Result<Option<Granted>, LockError> {
    xact::kept_if_found(|| grant_row(statement.run(client, args)?))
}

fn attempt_exclusive(
    client: &mut SpiClient<'_>,
    request: &Request<'_>,
    args: &mut Args<'_>,
) -> Result<Attempt, LockError> {
    let Some(peek) = PEEK.read_latest(&args[..]) else {
        return Ok((None, None));
    };
    if peek.get::<bool>(4) == Some(true) {
        return Err(LockError::WrongKind {
            lock_id: request.lock_id.to_string(),
            is: "a semaphore",
            asked: "a lock",
        });
    }
    if let Some(ms) = peek.get::<i64>(3) {
        return Ok((None, Some(millis(ms)))); // shared leases hold it
    }
    let held_by_other = peek.get::<bool>(1);
    if held_by_other == Some(true) {
        return Ok((None, peek.get::<i64>(2).map(millis))); // a live lease of someone else's
    }
    if peek.get::<i64>(6).unwrap_or(0) > 0 && !clear_dead(client, &CLEAR_DEAD_SHARED, args)? {
        return Ok((None, None)); // a shared lease or permit is being renewed right now
    }
    let granted = take(
        client,
        request,
        args,
        peek.get::<bool>(5) == Some(true),
        held_by_other.is_some(),
        &TAKE_OVER,
        &INSERT_NEW,
    )?;
    Ok((
        granted.map(|g| Granted {
            took_over: g.minted && held_by_other.is_some(),
            ..g
        }),
        None,
    ))
}

/// Grants the lease, past the gate and the look: the caller's own live lease is extended
/// (the same grant, no new token); otherwise a token is minted and the lease row taken
/// over if there is one, or inserted. An insert that finds the row created since the look
/// takes that over instead.
#[allow(clippy::too_many_arguments)]
pub fn take(
    client: &mut SpiClient<'_>,
    request: &Request<'_>,
    args: &mut Args<'_>,
    mine_live: bool,
    row_exists: bool,
    take_over: &'static Statement,
    insert: &'static Statement,
) -> Result<Option<Granted>, LockError> {
    if mine_live {
        if let Some(grant) = extend_own(client, request, args)? {
            return Ok(Some(grant));
        }
    }
    args[5] = token::mint(client)?.into();
    let args = &args[..];
    if row_exists {
        return grant_by(client, take_over, args);
    }
    // ON CONFLICT DO NOTHING locks nothing: no subtransaction is needed for the insert.
    match grant_row(insert.run(client, args)?)? {
        Some(grant) => Ok(Some(grant)),
        None => grant_by(client, take_over, args),
    }
}

pub fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

/// A grant, in plain values: a composite value made inside a subtransaction would hold a
/// tuple descriptor owned by it, gone once it ends (`to_grant` makes lockext.lock_grant).
pub struct Granted {
    pub lock_id: String,
    pub owner: String,
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

/// The grant from an acquire statement's RETURNING (`grant_returning!`), if any.
fn grant_row(rows: pgrx::spi::SpiTupleTable<'_>) -> Result<Option<Granted>, LockError> {
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
        row.get::<String>(1)?,
        row.get::<String>(2)?,
        row.get::<i64>(3)?,
        row.get::<TimestampWithTimeZone>(4)?,
        row.get::<TimestampWithTimeZone>(5)?,
        row.get::<bool>(6)?,
    )
    else {
        return Ok(None);
    };
    Ok(Some(Granted {
        lock_id,
        owner,
        token,
        acquired_at,
        expires_at,
        minted,
        took_over: false,
        previous_token: row.get::<i64>(7)?,
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
    let now = server_now()?;
    let args = [
        DatumWithOid::from(lock_id),
        owner.into(),
        caller::role().into(),
        ttl.into(),
        now.into(),
        fence_token.into(),
    ];
    let only_leases = commit::only_leases_so_far();
    // The same call's clock: a lease is live or not for the whole call.
    let held = [
        DatumWithOid::from(lock_id),
        owner.into(),
        caller::role().into(),
        now.into(),
        fence_token.into(),
    ];
    let renewed = while_briefly_locked(&held, || {
        Spi::connect_mut(|client| {
            for statement in &RENEW {
                let renewed =
                    xact::kept_if_found(|| Ok(first_value(statement.run(client, &args)?)?))?;
                if renewed.is_some() {
                    return Ok::<_, LockError>(renewed);
                }
            }
            Ok(None)
        })
    })?;
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
    release_valid(lock_id, owner, fence_token)
}

/// Releases a lease whose arguments are already checked.
pub fn release_valid(
    lock_id: &str,
    owner: &str,
    fence_token: Option<i64>,
) -> Result<bool, LockError> {
    let args = [
        DatumWithOid::from(lock_id),
        owner.into(),
        caller::role().into(),
        server_now()?.into(),
        fence_token.into(),
    ];
    let only_leases = commit::only_leases_so_far();
    let deleted = while_briefly_locked(&args, || {
        Spi::connect_mut(|client| -> Result<Option<(bool, i64)>, LockError> {
            for statement in &RELEASE {
                let deleted = xact::kept_if_found(|| {
                    let rows = statement.run(client, &args)?;
                    if rows.is_empty() {
                        return Ok(None);
                    }
                    let row = rows.first();
                    Ok(Some((
                        row.get::<bool>(1)?.unwrap_or(false),
                        row.get::<i64>(2)?.unwrap_or(0),
                    )))
                })?;
                if deleted.is_some() {
                    return Ok(deleted);
                }
            }
            Ok(None)
        })
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

// Is the caller's lease live (by the clock of the call, $4), in either table, under the
// newest snapshot? Parameters as RELEASE's.
static HELD_BY_CALLER: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM lockext.locks \
                          WHERE lock_id = $1 AND owner = $2 AND expires_at > $4 \
                            AND (holder_role = $3 OR pg_has_role($3, 'lockext_admin', 'MEMBER')) \
                            AND ($5::bigint IS NULL OR fence_token = $5)) \
              OR EXISTS (SELECT FROM lockext.shared_leases \
                          WHERE lock_id = $1 AND owner = $2 AND expires_at > $4 \
                            AND (holder_role = $3 OR pg_has_role($3, 'lockext_admin', 'MEMBER')) \
                            AND ($5::bigint IS NULL OR fence_token = $5))",
    params: RELEASE_PARAMS,
};

/// Runs a renew or release, and again while it found nothing although the caller's live
/// lease is there: its row was locked for a moment by someone else, such as the reaper,
/// which keeps the lock of a row it looked at as expired and found renewed (PostgreSQL
/// keeps the lock of a row that fails the recheck of `FOR UPDATE`) until its short batch
/// commits. A holder must not be told "not yours" for that. Bounded: after 100 ms the
/// answer stands (a lease a long transaction keeps locked is not available to change).
fn while_briefly_locked<T>(
    held: &[DatumWithOid<'_>],
    mut attempt: impl FnMut() -> Result<Option<T>, LockError>,
) -> Result<Option<T>, LockError> {
    for _ in 0..100 {
        if let Some(done) = attempt()? {
            return Ok(Some(done));
        }
        let still_held = Spi::connect_mut(|_| {
            HELD_BY_CALLER
                .read_latest(held)
                .and_then(|row| row.get::<bool>(1))
                == Some(true)
        });
        if !still_held {
            return Ok(None);
        }
        unsafe { pg_sys::pg_usleep(1000) };
        pg_sys::check_for_interrupts!();
    }
    attempt()
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
