//! Leases: lock_acquire, lock_renew, lock_release, for every kind of lease.
//!
//! An acquire is one route for every kind of lease (`acquire`): validated (`kind::Request`),
//! queued when it waits (`wait.rs`), through its lock id's gate (`claims.rs`, in the kind's
//! mode), the look (`grant::look_at`), the kind's decision (`kind::LeaseKind`), the store
//! step (`grant::store`, which mints the token when it needs one), then the commit step,
//! stats and events. No step of it asks which kind it serves. Renew and release serve every
//! kind.
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

use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::spi::{SpiClient, SpiTupleTable};

use crate::backend;
use crate::caller;
use crate::citus::{self, Access};
use crate::claims;
use crate::commit;
use crate::error::{self, LockError, OrReport};
use crate::grant::{self, extend_own, look_at, Attempt, Decision, Granted, Params};
use crate::keepalive;
use crate::kind::{Request, Taken};
use crate::session;
use crate::statements::{Args, Statement};
use crate::stats::{self, Counter};
use crate::text::Text;
use crate::token;
use crate::wait;
use crate::xact;

/// The parameters of renew, release and `HELD_BY_CALLER`, by name (`HELD_PARAMS`); `args`
/// gives them to a statement, and a renewal adds the new time to live (`RENEW_PARAMS`).
/// compat.rs's renew and release of older SQL take the same, by the same names.
pub(crate) struct Held<'a> {
    pub lock_id: Text<'a>,
    pub owner: Text<'a>,
    /// The calling role: the lease's holder, or a `lockext_admin` member.
    pub role: pg_sys::Oid,
    /// The call's clock: a lease is live or not for the whole call.
    pub now: TimestampWithTimeZone,
    /// The grant the caller names (NULL: whichever it holds).
    pub token: Option<i64>,
}

impl Held<'_> {
    pub fn args(&self) -> Args<'_> {
        Args::with_capacity(RENEW_PARAMS.len())
            .set("lock_id", self.lock_id)
            .set("owner", self.owner)
            .set("role", self.role)
            .set("now", self.now)
            .set("fence_token", self.token)
    }

    pub fn args_with_ttl(&self, ttl: Interval) -> Args<'_> {
        self.args().set("ttl", ttl)
    }
}

pub(crate) const HELD_PARAMS: &[(&str, pg_sys::PgBuiltInOids)] = &[
    ("lock_id", TEXTOID),
    ("owner", TEXTOID),
    ("role", OIDOID),
    ("now", TIMESTAMPTZOID),
    ("fence_token", INT8OID),
];
const RENEW_PARAMS: &[(&str, pg_sys::PgBuiltInOids)] = &[
    ("lock_id", TEXTOID),
    ("owner", TEXTOID),
    ("role", OIDOID),
    ("now", TIMESTAMPTZOID),
    ("fence_token", INT8OID),
    ("ttl", INTERVALOID),
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

// Run after a release whose row said `has_values`. $1 lock_id, $2 the ended grant's token.
static END_VALUES: Statement = Statement {
    sql: include_str!("../sql/run/lease/end_values.sql"),
    params: &[("lock_id", TEXTOID), ("fence_token", INT8OID)],
};

static NOTIFY: Statement = Statement {
    sql: include_str!("../sql/run/lease/notify.sql"),
    params: &[
        ("event", TEXTOID),
        ("lock_id", TEXTOID),
        ("fence_token", INT8OID),
        ("previous_fence_token", INT8OID),
    ],
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
        acquire_routed(&request, |granted| {
            granted.map(|g| g.to_grant()).transpose()
        })
    })
    .or_report()
}

/// `acquire`, on its lock id's node on a Citus cluster (`citus::route`: refusing what cannot
/// run there, the ledger first raised past the lock id's highest, the token recorded as its
/// highest); then `then` on the grant, still on that node's shards (lock_campaign sets the
/// grant's value there). On a server without Citus, `acquire` and `then`.
pub fn acquire_routed<R>(
    request: &Request<'_>,
    then: impl FnOnce(Option<Granted>) -> Result<R, LockError>,
) -> Result<R, LockError> {
    if !request.wait.is_zero() && citus::distributed_for(Access::Write)? {
        // A waiting call routes each try anew: below.
        citus::refuse_in_transaction_block()?;
        refuse_on_citus(request)?;
        let granted = acquire_with(request, attempt_routed)?;
        // On the lock id's shards again for `then` (the granting try's metadata lock is
        // held to the end of the transaction; a refused call's is taken again here).
        let _routed = citus::route_look(request.lock_id, Access::Write)?;
        return then(granted);
    }
    let routed = citus::route(request.lock_id, Access::Write)?;
    if routed.is_some() {
        refuse_on_citus(request)?;
        citus::before_grant(request.lock_id)?;
    }
    let granted = acquire(request)?;
    if let (Some(_), Some(granted)) = (&routed, &granted) {
        citus::after_grant(request.lock_id, granted.token)?;
    }
    then(granted)
}

/// One try of a waiting acquire on a Citus cluster: routed to the lock id's shard
/// (`citus::route_look`) in a subtransaction that is kept only when the try grants, as a
/// call without `wait` is (the ledger raised past the lock id's highest first, the token
/// recorded as its highest). A try that does not grant is rolled back, which lets go of the
/// shard's metadata lock: a waiting call holds up no move of its shard between its tries.
/// Once the shard has moved away, the next try is refused with 40001 (the call leaves the
/// queue; called again, Citus sends it to the shard's new node). The queue is the node's,
/// as are the releases that wake it: every call of the lock id runs there.
fn attempt_routed(
    request: &Request<'_>,
    params: &mut Params<'_>,
    ticket: u64,
) -> Result<Attempt, LockError> {
    let mut tried = None;
    let granted = crate::xact::all_or_nothing(|| {
        let _routed = citus::route_look(request.lock_id, Access::Write)?;
        citus::before_grant(request.lock_id)?;
        match attempt(request, params, ticket)? {
            Attempt::Granted(granted) => {
                citus::after_grant(request.lock_id, granted.token)?;
                Ok(Some(granted))
            }
            other => {
                tried = Some(other);
                Ok(None)
            }
        }
    })?;
    Ok(match granted {
        Some(granted) => Attempt::Granted(granted),
        None => tried.unwrap_or(Attempt::Busy),
    })
}

/// What an acquire may not ask for on a Citus cluster (docs/citus.md says why).
fn refuse_on_citus(request: &Request<'_>) -> Result<(), LockError> {
    let refused = |what, hint| Err(LockError::CitusUnsupported { what, hint });
    if request.attachments.keepalive.is_some() {
        return refused(
            "leases are not attached to keep-alives",
            "Renew each lease with lock_renew.",
        );
    }
    if request.attachments.session.is_some() {
        return refused(
            "leases are not session-bound",
            "Citus runs the call over a connection of its own, not the client's session.",
        );
    }
    Ok(())
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
    caller::as_member(|| {
        let _routed = citus::route_arg("lock_id", lock_id, Access::Write)?;
        renew(lock_id, owner, ttl, fence_token)
    })
    .or_report()
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
    caller::as_member(|| {
        let _routed = citus::route_arg("lock_id", lock_id, Access::Write)?;
        release(lock_id, owner, fence_token)
    })
    .or_report()
}

/// The route of an acquire, one way through: validated (`Request`, by the caller), queued
/// when it waits (`wait_for`), then each try (`attempt`) passes the gate, looks, decides,
/// stores; then the commit step (`commit::after_minting`, if the call minted a token),
/// stats, the session hook, the wake-up of the next waiter and the event.
pub fn acquire(request: &Request<'_>) -> Result<Option<Granted>, LockError> {
    acquire_with(request, attempt)
}

/// A try of an acquire: `attempt`, or on a Citus cluster, when the call waits,
/// `attempt_routed`.
type Try = fn(&Request<'_>, &mut Params<'_>, u64) -> Result<Attempt, LockError>;

/// `acquire`, each try made by `try_once`.
fn acquire_with(request: &Request<'_>, try_once: Try) -> Result<Option<Granted>, LockError> {
    let _timer = stats::AcquireTimer::start();
    let mut params = Params {
        lock_id: request.lock_id,
        owner: request.owner,
        role: caller::role(),
        ttl: request.ttl,
        now: backend::now()?,
        token: None,
        lock_delay: micros_interval(request.lock_delay),
        permits: request.permits,
        slot: None,
    };
    let minted_before = token::minted();
    let granted = if request.wait.is_zero() {
        try_once(request, &mut params, 0).map(Attempt::granted)
    } else {
        wait_for(
            request,
            &mut params,
            Instant::now() + request.wait,
            try_once,
        )
    };
    // The commit step: a call that minted a token (granted, or a gap) commits durably, as
    // lockext.durability says; decided here, whatever the tries came to.
    if token::minted() != minted_before {
        commit::after_minting();
    }
    let Some(granted) = granted? else {
        stats::count(Counter::AcquiresRefused);
        return Ok(None);
    };
    stats::count(Counter::AcquiresGranted);
    if request.attachments.session.is_some() {
        session::bind(); // the exit hook that ends the lease with this session
    }
    if request.kind.many_holders() {
        // Many hold it at once: the next in line may be free to take one too.
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
    try_once: Try,
) -> Result<Option<Granted>, LockError> {
    let ticket = wait::Ticket::take(request.lock_id, request.kind.queue_window(request));
    let mut nap = Duration::ZERO;
    loop {
        let mut free_in = None;
        if ticket.may_try() {
            params.now = backend::now()?;
            match try_once(request, params, ticket.number())? {
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

/// One try at the lock, through its gate (`claims.rs`): the gate is passed here and given
/// back here, once, when the try grants nothing.
fn attempt(
    request: &Request<'_>,
    params: &mut Params<'_>,
    ticket: u64,
) -> Result<Attempt, LockError> {
    let kind = request.kind;
    // The keep-alive must be live by this try's clock, and stays share-locked to the end of
    // the transaction, so that its row outlasts the lease attached to it.
    if let Some(keepalive) = request.attachments.keepalive {
        keepalive::attach(keepalive, params.role, params.now)?;
    }
    // No jumping the queue of callers waiting for this lock, and no passing the gate while
    // a conflicting acquire is in flight (the kind's mode, then its own claim)...
    let gate = if jumps_the_queue(request, ticket) {
        None
    } else {
        claims::try_gate(request.lock_id, kind.gate_mode())?
    };
    let gate = match gate {
        Some(gate) if !kind.pass_after_gate(request.lock_id)? => {
            gate.reopen();
            None
        }
        gate => gate,
    };
    let Some(gate) = gate else {
        // ...except for a holder asking again (a retry after a lost reply): it gets its
        // live grant back, which changes no one's chances.
        return Ok(
            match Spi::connect_mut(|client| {
                extend_own(client, kind.store(), params, &request.attachments)
            })? {
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

/// The look, the decision and the store (`look_decide_store`), past the gate (which stays
/// held), tried again while they come back `Busy`, for `BUSY_AT_MOST` at most, then
/// answered as they stand.
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
        let tried = Spi::connect_mut(|client| look_decide_store(client, request, params))?;
        if !matches!(tried, Attempt::Busy) || Instant::now() + nap > deadline {
            return Ok(tried);
        }
        backend::sleep_us(nap.as_micros() as i64);
        pg_sys::check_for_interrupts!();
        nap = (nap * 2).min(Duration::from_millis(10));
    }
}

/// Past the gate: the kind's grant in one statement if the lock id has no lease at all
/// (`store_if_free`), else the look (`grant::look_at`), the kind's decision, and the store
/// step (`grant::store`). The claims the decision took (`Taken`) are given back when
/// nothing is granted.
fn look_decide_store(
    client: &mut SpiClient<'_>,
    request: &Request<'_>,
    params: &mut Params<'_>,
) -> Result<Attempt, LockError> {
    let kind = request.kind;
    let attached = &request.attachments;
    if let Some(granted) = kind.store_if_free(client, params, attached)? {
        return Ok(Attempt::Granted(granted));
    }
    let (leases, now) = look_at(kind.look(), params);
    let mut taken = Taken::default();
    let tried = match kind.decide(request, &leases, now, params, &mut taken)? {
        Decision::Refused(until_free) => Attempt::Refused(until_free),
        Decision::Grant(plan) => grant::store(client, kind.store(), &plan, params, attached)?,
    };
    if !matches!(tried, Attempt::Granted(_)) {
        taken.give_back();
    }
    Ok(tried)
}

/// Whether trying now would jump the queue of this lock. A caller that does not wait
/// (ticket 0) never goes ahead of anyone queued.
fn jumps_the_queue(request: &Request<'_>, ticket: u64) -> bool {
    let window = if ticket == 0 {
        1
    } else {
        request.kind.queue_window(request)
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
                xact::first_found(client, &RENEW, || held.args_with_ttl(ttl), renewed)
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
        || {
            Spi::connect_mut(|client| {
                let ended = xact::first_found(client, &RELEASE, || held.args(), released)?;
                if let Some(ended) = ended.filter(|ended| ended.has_values) {
                    END_VALUES.run(
                        client,
                        Args::with_capacity(2)
                            .set("lock_id", lock_id)
                            .set("fence_token", ended.token),
                    )?;
                }
                Ok(ended)
            })
        },
        || still_held(&held),
    )?;
    commit::relax_if_only_leases(only_leases);
    if deleted.is_some() {
        wait::wake_head_at_commit(lock_id);
    }
    let released = deleted.is_some_and(|ended| ended.live);
    stats::count(if released {
        Counter::ReleasesOk
    } else {
        Counter::ReleasesFailed
    });
    if let Some(Ended {
        live: true, token, ..
    }) = deleted
    {
        notify("released", lock_id, token, None)?;
    }
    Ok(released)
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

/// What a release ended: a lease, live or not, and whether its grant has values to delete.
#[derive(Clone, Copy)]
pub struct Ended {
    /// The lease was still live: the caller held the lock until this release.
    pub live: bool,
    pub token: i64,
    /// The grant has values (`END_VALUES` deletes them); older versions' statements
    /// (compat.rs) delete them themselves and have no such column.
    pub has_values: bool,
}

/// A release's row.
pub fn released(rows: SpiTupleTable<'_>) -> Result<Option<Ended>, LockError> {
    if rows.is_empty() {
        return Ok(None);
    }
    let row = rows.first();
    Ok(Some(Ended {
        live: row.get_by_name::<bool, _>("live")?.unwrap_or(false),
        token: row.get_by_name::<i64, _>("fence_token")?.unwrap_or(0),
        has_values: row
            .get_by_name::<bool, _>("has_values")
            .ok()
            .flatten()
            .unwrap_or(false),
    }))
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
            .read_latest(held.args())
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
        let args = Args::with_capacity(4)
            .set("event", event)
            .set("lock_id", lock_id)
            .set("fence_token", token)
            .set("previous_fence_token", previous);
        NOTIFY.run(client, args)?;
        Ok(())
    })
}

/// A duration as an interval of plain microseconds.
fn micros_interval(d: Duration) -> Interval {
    Interval::new(0, 0, d.as_micros() as i64)
        .unwrap_or_else(|_| Interval::new(0, 0, 0).expect("zero"))
}
