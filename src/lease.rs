//! Leases: lock_acquire, lock_renew, lock_release, for every kind of lease.
//!
//! An acquire is validated (`grant::Request`), queued when it waits (`wait.rs`), passes its
//! lock id's gate (`claims.rs`), and then tries the kind's own `attempt`: `exclusive.rs`
//! (rows of `lockext.locks`) or `shared.rs` (shared leases and permits, rows of
//! `lockext.shared_leases`); each ends in `grant::take`. Renew and release serve every kind.
//!
//! Unless a caller asks lock_acquire to wait (and then it waits in lockext's own queue,
//! `wait.rs`), none of these functions ever waits for another transaction's lock: a lease
//! that someone else is in the middle of changing (an acquire or a release inside a
//! transaction that is still open) counts as not available, and the call answers at once.
//! Every acquire first passes its lock id's gate, a transaction-scoped lock that is only
//! ever tried (`claims.rs`); row changes use `FOR UPDATE SKIP LOCKED`. One exception, by
//! polling and bounded: a dead lease whose row someone holds locked (the reaper deleting
//! it) is looked at again for up to 100 ms (`past_the_gate`), so that the reaper's work
//! never refuses an acquire of a lock that is free.
//!
//! Time is the server's clock as `clock_timestamp()` reads it, taken once per call, so all
//! the tests of one call agree on "now" even if the clock steps while it runs.

use std::time::{Duration, Instant};

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::spi::{SpiClient, SpiTupleTable};

use crate::backend;
use crate::caller;
use crate::claims;
use crate::commit;
use crate::error::{self, LockError, OrReport};
use crate::exclusive;
use crate::grant::{extend_own, Attempt, Granted, Kind, Params, Request};
use crate::keepalive;
use crate::session;
use crate::shared;
use crate::statements::Statement;
use crate::stats::{self, Counter};
use crate::text::Text;
use crate::wait;
use crate::xact;

/// The parameters of renew, release and `HELD_BY_CALLER`, by name; `datums` lays them out
/// as $1..$5 (`HELD_PARAMS`), and a renewal adds the new time to live as $6.
struct Held<'a> {
    lock_id: Text<'a>,
    owner: Text<'a>,
    /// The calling role: the lease's holder, or a `lockext_admin` member.
    role: pg_sys::Oid,
    /// The call's clock: a lease is live or not for the whole call.
    now: TimestampWithTimeZone,
    /// The grant the caller names (NULL: whichever it holds).
    token: Option<i64>,
}

impl Held<'_> {
    fn datums(&self) -> [DatumWithOid<'_>; 5] {
        [
            self.lock_id.into(),
            self.owner.into(),
            self.role.into(),
            self.now.into(),
            self.token.into(),
        ]
    }

    fn datums_with_ttl(&self, ttl: Interval) -> [DatumWithOid<'_>; 6] {
        let [a, b, c, d, e] = self.datums();
        [a, b, c, d, e, ttl.into()]
    }
}

const HELD_PARAMS: &[pg_sys::PgBuiltInOids] = &[TEXTOID, TEXTOID, OIDOID, TIMESTAMPTZOID, INT8OID];
const RENEW_PARAMS: &[pg_sys::PgBuiltInOids] = &[
    TEXTOID,
    TEXTOID,
    OIDOID,
    TIMESTAMPTZOID,
    INT8OID,
    INTERVALOID,
];

static RENEW: [Statement; 2] = [
    Statement {
        sql: include_str!("../sql/run/lease/renew_lock.sql"),
        params: RENEW_PARAMS,
    },
    Statement {
        sql: include_str!("../sql/run/lease/renew_shared_lease.sql"),
        params: RENEW_PARAMS,
    },
];

static RELEASE: [Statement; 2] = [
    Statement {
        sql: include_str!("../sql/run/lease/release_lock.sql"),
        params: HELD_PARAMS,
    },
    Statement {
        sql: include_str!("../sql/run/lease/release_shared_lease.sql"),
        params: HELD_PARAMS,
    },
];

static NOTIFY: Statement = Statement {
    sql: include_str!("../sql/run/lease/notify.sql"),
    params: &[TEXTOID, TEXTOID, INT8OID, INT8OID],
};

/// Takes the lock `lock_id` for `owner` for `ttl`, waiting up to `wait` for it; NULL if
/// it is not available. `lock_delay` (default: the lockext.lock_delay setting) keeps the
/// lock unavailable that long after this grant's lease expires without a release. `mode`
/// 'shared' takes one of many shared (read) leases; `permits` takes one permit of a
/// semaphore with that many; `session_bound` also ends the lease when this session does;
/// `keepalive` attaches the lease to a keep-alive of the caller's (`keepalive.rs`), which
/// renews it (`ttl` is then NULL).
#[allow(clippy::too_many_arguments)]
// Its C symbol, lock_acquire_0_3_wrapper, is one no older library has (compat.rs).
#[pg_extern(volatile, parallel_unsafe, name = "lock_acquire")]
#[search_path(pg_catalog, pg_temp)]
fn lock_acquire_0_3(
    lock_id: Option<Text<'_>>,
    owner: Option<Text<'_>>,
    ttl: Option<Interval>,
    wait: default!(Option<Interval>, "'0 seconds'"),
    lock_delay: default!(Option<Interval>, "NULL"),
    mode: default!(Option<Text<'_>>, "'exclusive'"),
    permits: default!(Option<i32>, "NULL"),
    session_bound: default!(Option<bool>, "false"),
    keepalive: default!(Option<i64>, "NULL"),
) -> Option<pgrx::composite_type!('static, "lock_grant")> {
    caller::as_member(|| {
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
            keepalive,
        )?;
        acquire(&request)?.map(|g| g.to_grant()).transpose()
    })
    .or_report()
}

/// Extends the caller's live lease to now + `ttl`; NULL when the caller holds none.
// Its C symbol, lock_renew_0_3_wrapper, is one no older library has (compat.rs).
#[pg_extern(volatile, parallel_unsafe, name = "lock_renew")]
#[search_path(pg_catalog, pg_temp)]
fn lock_renew_0_3(
    lock_id: Option<Text<'_>>,
    owner: Option<Text<'_>>,
    ttl: Option<Interval>,
    fence_token: default!(Option<i64>, "NULL"),
) -> Option<TimestampWithTimeZone> {
    caller::as_member(|| renew(lock_id, owner, ttl, fence_token)).or_report()
}

/// Ends the caller's lease; true when the caller still held it.
// Its C symbol, lock_release_0_3_wrapper, is one no older library has (compat.rs).
#[pg_extern(volatile, parallel_unsafe, name = "lock_release")]
#[search_path(pg_catalog, pg_temp)]
fn lock_release_0_3(
    lock_id: Option<Text<'_>>,
    owner: Option<Text<'_>>,
    fence_token: default!(Option<i64>, "NULL"),
) -> bool {
    caller::as_member(|| release(lock_id, owner, fence_token)).or_report()
}

pub fn acquire(request: &Request<'_>) -> Result<Option<Granted>, LockError> {
    let _timer = stats::AcquireTimer::start();
    let mut params = Params {
        lock_id: request.lock_id,
        owner: request.owner,
        role: caller::role(),
        ttl: request.ttl,
        now: backend::now()?,
        token: None,
        lock_delay: micros_interval(request.lock_delay),
        session: request.session,
        permits: match request.kind {
            Kind::Semaphore(n) => Some(n),
            _ => None,
        },
        slot: None,
        keepalive: request.keepalive,
    };
    let granted = if request.wait.is_zero() {
        attempt(request, &mut params, 0)?.granted()
    } else {
        wait_for(request, &mut params, Instant::now() + request.wait)?
    };
    let Some(granted) = granted else {
        stats::count(Counter::AcquiresRefused);
        return Ok(None);
    };
    stats::count(Counter::AcquiresGranted);
    if request.session.is_some() {
        session::bind(); // the exit hook that ends the lease with this session
    }
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

/// Queues for the lock and tries each time it is woken (or its nap ends), until the
/// deadline. The server clock in `params` is read again before each try.
fn wait_for(
    request: &Request<'_>,
    params: &mut Params<'_>,
    deadline: Instant,
) -> Result<Option<Granted>, LockError> {
    let ticket = wait::Ticket::take(request.lock_id, queue_window(request.kind));
    let mut nap = Duration::ZERO;
    loop {
        let mut free_in = None;
        if ticket.may_try() {
            params.now = backend::now()?;
            match attempt(request, params, ticket.number())? {
                Attempt::Granted(granted) => return Ok(Some(granted)),
                Attempt::Refused(until_free) => free_in = until_free,
                Attempt::Busy => {}
            }
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

/// One try at the lock, through its gate (`claims.rs`).
fn attempt(
    request: &Request<'_>,
    params: &mut Params<'_>,
    ticket: u64,
) -> Result<Attempt, LockError> {
    // The keep-alive must be live by this try's clock, and stays share-locked to the end of
    // the transaction, so that its row outlasts the lease attached to it.
    if let Some(keepalive) = request.keepalive {
        keepalive::attach(keepalive, params.role, params.now)?;
    }
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
        return Ok(
            match Spi::connect_mut(|client| extend_own(client, request, params))? {
                Some(granted) => Attempt::Granted(granted),
                None => Attempt::Refused(None),
            },
        );
    };
    let tried = past_the_gate(request, params)?;
    if !matches!(tried, Attempt::Granted(_)) {
        gate.reopen();
    }
    Ok(tried)
}

/// How long an acquire past its gate tries again while only dead leases are in its way and
/// one of their rows is locked by someone else (`Attempt::Busy`); as long as a renewal or a
/// release tries again for a row the reaper holds (`xact::while_briefly_locked`).
const BUSY_AT_MOST: Duration = Duration::from_millis(100);

/// The kind's attempt, past the gate (which stays held), tried again while it comes back
/// `Busy`, for `BUSY_AT_MOST` at most, then answered as it stands.
///
/// Busy means the look found no live lease in the way, only dead ones (or the caller's own),
/// and yet a row it needs to delete or take over, or the row of the expired keep-alive it
/// must end first, was locked by another transaction, or changed since the look. Who holds
/// a dead lease's row: above all the reaper, whose batch locks the expired keep-alives it
/// ends and every dead lease it deletes, for one short transaction that commits at once
/// (sql/run/reaper/); a session's exit or a keep-alive's revocation deleting it; a
/// renewal that read its clock before the expiry (its row is live once it commits). An
/// acquire that does not wait used to be refused then, although the lease was dead and
/// its row would be gone a moment later (a rival's acquire of a lapsed keep-alive's lock,
/// with the reaper due at the moment it lapsed). So it naps and looks again: the dead row
/// is then gone (granted: the insert), or live (refused at once, by the look), or locked
/// still (again, until the bound).
///
/// Never behind a live holder: a lease live by the look is refused before any of this,
/// whatever its renewal holds. A renewal keeps its row (lock_renew: the lease's; a
/// keep-alive's renewal: the keep-alive's) locked to the end of its transaction, which an
/// autocommit call ends at once but a caller's transaction may keep open for long; only a
/// renewal that raced the expiry (it locks only a row live by its own clock) can hold a
/// row the look saw dead, and that is waited for `BUSY_AT_MOST` at most, as is any other
/// transaction that keeps a dead row locked (a revocation of the expired keep-alive, or a
/// grant of another of its lock ids that ended it, inside a transaction still open).
/// Nothing here waits on a lock: each try
/// locks `SKIP LOCKED` as before, and a refused try keeps nothing (`xact::kept_if_found`).
/// A try that reached the take-over minted a token that is then a gap; the naps double
/// (1 ms to 10 ms), so a row kept locked for the whole bound costs a dozen at most.
fn past_the_gate(request: &Request<'_>, params: &mut Params<'_>) -> Result<Attempt, LockError> {
    let deadline = Instant::now() + BUSY_AT_MOST;
    let mut nap = Duration::from_millis(1);
    loop {
        let tried = Spi::connect_mut(|client| match request.kind {
            Kind::Exclusive => exclusive::attempt(client, request, params),
            _ => shared::attempt(client, request, params),
        })?;
        if !matches!(tried, Attempt::Busy) || Instant::now() + nap > deadline {
            return Ok(tried);
        }
        unsafe { pg_sys::pg_usleep(nap.as_micros() as _) };
        pg_sys::check_for_interrupts!();
        nap = (nap * 2).min(Duration::from_millis(10));
    }
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

pub fn renew(
    lock_id: Option<Text<'_>>,
    owner: Option<Text<'_>>,
    ttl: Option<Interval>,
    fence_token: Option<i64>,
) -> Result<Option<TimestampWithTimeZone>, LockError> {
    let lock_id = error::identifier("lock_id", lock_id)?;
    let owner = error::identifier("owner", owner)?;
    let ttl = error::ttl(ttl)?;
    let fence_token = error::optional_token("fence_token", fence_token)?;
    backend::writable_server()?;
    let held = Held {
        lock_id,
        owner,
        role: caller::role(),
        now: backend::now()?,
        token: fence_token,
    };
    let only_leases = commit::only_leases_so_far();
    let renewed = xact::while_briefly_locked(
        || {
            Spi::connect_mut(|client| {
                first_found(client, &RENEW, &held.datums_with_ttl(ttl), renewed)
            })
        },
        || still_held(&held),
    )?;
    commit::relax_if_only_leases(only_leases);
    stats::count(if renewed.is_some() {
        Counter::RenewalsOk
    } else {
        Counter::RenewalsFailed
    });
    Ok(renewed)
}

pub fn release(
    lock_id: Option<Text<'_>>,
    owner: Option<Text<'_>>,
    fence_token: Option<i64>,
) -> Result<bool, LockError> {
    let lock_id = error::identifier("lock_id", lock_id)?;
    let owner = error::identifier("owner", owner)?;
    let fence_token = error::optional_token("fence_token", fence_token)?;
    backend::writable_server()?;
    release_valid(lock_id, owner, fence_token)
}

/// Releases a lease whose arguments are already checked.
pub fn release_valid(
    lock_id: Text<'_>,
    owner: Text<'_>,
    fence_token: Option<i64>,
) -> Result<bool, LockError> {
    let held = Held {
        lock_id,
        owner,
        role: caller::role(),
        now: backend::now()?,
        token: fence_token,
    };
    let only_leases = commit::only_leases_so_far();
    let deleted = xact::while_briefly_locked(
        || Spi::connect_mut(|client| first_found(client, &RELEASE, &held.datums(), released)),
        || still_held(&held),
    )?;
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

/// Runs a renewal's or a release's statements (one per lease table) in order, each kept
/// only if it found the caller's lease (`xact::kept_if_found`: a refused one keeps no row
/// locked), until one does; `read` says what it found.
pub fn first_found<T>(
    client: &mut SpiClient<'_>,
    statements: &'static [Statement],
    args: &[DatumWithOid<'_>],
    read: impl Fn(SpiTupleTable<'_>) -> Result<Option<T>, LockError>,
) -> Result<Option<T>, LockError> {
    for statement in statements {
        let found = xact::kept_if_found(|| read(statement.run(client, args)?))?;
        if found.is_some() {
            return Ok(found);
        }
    }
    Ok(None)
}

/// A renewal's row: the lease's new expiry. A lease attached to a keep-alive is renewed by
/// it, not by lock_renew: an error, rather than an answer the caller would read as "lost".
pub fn renewed(rows: SpiTupleTable<'_>) -> Result<Option<TimestampWithTimeZone>, LockError> {
    if rows.is_empty() {
        return Ok(None);
    }
    let row = rows.first();
    // The statements of older versions' functions (compat.rs) have no such column.
    if let Some(keepalive) = row.get_by_name::<i64, _>("keepalive").ok().flatten() {
        return Err(LockError::RenewAttached {
            lock_id: row
                .get_by_name::<String, _>("lock_id")
                .ok()
                .flatten()
                .unwrap_or_default(),
            keepalive,
        });
    }
    let expires_at = row.get_by_name::<TimestampWithTimeZone, _>("expires_at")?;
    // A renewal with a shorter time to live brings the lease's end nearer.
    if let Some(expires_at) = expires_at {
        crate::status::due_by(expires_at);
    }
    Ok(expires_at)
}

/// A release's row: whether the lease was still live, and its token.
pub fn released(rows: SpiTupleTable<'_>) -> Result<Option<(bool, i64)>, LockError> {
    if rows.is_empty() {
        return Ok(None);
    }
    let row = rows.first();
    Ok(Some((
        row.get_by_name::<bool, _>("live")?.unwrap_or(false),
        row.get_by_name::<i64, _>("fence_token")?.unwrap_or(0),
    )))
}

// Read under the newest snapshot (`read_latest`). Parameters as RELEASE's (`Held`).
static HELD_BY_CALLER: Statement = Statement {
    sql: include_str!("../sql/run/lease/held_by_caller.sql"),
    params: HELD_PARAMS,
};

/// Whether the caller's lease is live, under the newest snapshot: what a renewal or a
/// release that found nothing tries again for (`xact::while_briefly_locked`).
fn still_held(held: &Held<'_>) -> bool {
    Spi::connect_mut(|_| {
        HELD_BY_CALLER
            .read_latest(&held.datums())
            .and_then(|row| row.get::<bool>("held"))
            == Some(true)
    })
}

/// Sends a lockext event to LISTENers of channel `lockext` when the transaction commits,
/// if `lockext.notify` is on.
pub fn notify(
    event: &str,
    lock_id: Text<'_>,
    token: i64,
    previous: Option<i64>,
) -> Result<(), LockError> {
    if !crate::events::enabled() {
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
