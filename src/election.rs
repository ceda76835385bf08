//! Leader election: the value a grant carries, who holds a lock now, and waiting for that
//! to change (etcd's Campaign, Proclaim, Leader and Observe; Consul's lock with its value).
//!
//! Wording: a grant's **value** is a `jsonb` its holder publishes (an address, a shard
//! map), a row of `lockext.lease_values` keyed by the grant (lock id and token); its
//! **version** counts the values set during that grant (1 for the first, 0: none). The
//! **leader** of a lock id is its live grant with the lowest token: for an exclusive lock
//! its only holder, for shared leases and permits the oldest grant still live.
//!
//! A value belongs to one grant. The setter must hold a live lease of that lock id, owner
//! and token, taken by its role; a holder whose lease ran out, or was released or taken
//! over, changes nothing. A value stored by a holder in the moment its lease ended is a
//! row of a grant no reader shows (readers join on the live lease's token, and tokens never
//! repeat), and such rows are deleted by the next setter of that lock id and by the
//! reaper's sweep (`reap_values.sql`).
//! Every other value goes with its lease: each statement that deletes or replaces a lease
//! row (a release, a take-over, a dead lease cleared before a grant, a keep-alive's revoke,
//! a session's end, the reaper's reaping) deletes the ended grant's value in the same
//! statement, found by the deleted rows' keys (one probe of the values' key), skipping a
//! value row its setter holds locked. So the reaper's rounds never read every value to
//! find the ended ones, and a value is never deleted while its lease row lives (a lease in
//! its lock-delay keeps it). Nothing here locks a lease row: a setter or an observer never
//! delays a grant, a renewal or a release.
//!
//! An observer polls, because nothing wakes it for free: a grant, a take-over, an expiry or
//! a release all change what it waits for, and waking observers would put work on those
//! paths. Each poll is one read (two index probes and a join), run in a subtransaction
//! that is rolled back, so that an observer keeps no lock on lockext's tables while it
//! waits (a DDL statement queued behind such a lock would make every grant wait behind
//! it); between polls it sleeps on its latch for `OBSERVE_NAP`.

use std::time::{Duration, Instant};

use pgrx::pg_sys::BuiltinOid::*;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::backend;
use crate::caller;
use crate::citus::{self, Access};
use crate::error::{self, LockError, OrReport};
use crate::kind::Request;
use crate::lease;
use crate::settings;
use crate::statements::{jsonb_by_name, Args, Statement};
use crate::text::{Jsonb, Text, TextBuf};
use crate::wait;
use crate::xact;

static SET_VALUE: Statement = Statement {
    sql: include_str!("../sql/run/election/set_value.sql"),
    params: &[
        ("lock_id", TEXTOID),
        ("owner", TEXTOID),
        ("role", OIDOID),
        ("now", TIMESTAMPTZOID),
        ("fence_token", INT8OID),
        ("value", JSONBOID),
        ("notify", BOOLOID),
        ("role_values_size", INT8OID),
    ],
};

static HOLDERS: Statement = Statement {
    sql: include_str!("../sql/run/election/holders.sql"),
    params: &[
        ("lock_id", TEXTOID),
        ("now", TIMESTAMPTZOID),
        ("limit", INT8OID),
    ],
};

/// How long an observer sleeps between two looks: how late it may learn of a change.
/// A look (subtransaction, read, latch) costs 170 to 220 µs of CPU: an observer spends
/// 0.33 to 0.45 % of a core (`bench/observer.sh`, docs/benchmarks.md).
const OBSERVE_NAP: Duration = Duration::from_millis(50);

/// One live grant of a lock id, as `lock_holders` shows it.
struct Holder {
    owner: TextBuf,
    kind: TextBuf,
    token: i64,
    value: Option<Jsonb>,
    version: i64,
    acquired_at: TimestampWithTimeZone,
    expires_at: TimestampWithTimeZone,
}

/// What an observer compares: the leader's token (None: the lock is free) and the
/// version of its value.
type State = (Option<i64>, i64);

impl Holder {
    fn state(holder: Option<&Holder>) -> State {
        holder.map_or((None, 0), |h| (Some(h.token), h.version))
    }
}

/// lock_acquire, and the grant's value set in the same transaction: NULL (and no value)
/// when the lock is not available. A same-owner retry gets its live grant back and sets
/// the value again (its version goes up).
#[allow(clippy::too_many_arguments)]
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn lock_campaign(
    lock_id: Option<Text<'_>>,
    owner: Option<Text<'_>>,
    ttl: Option<Interval>,
    value: Option<Jsonb>,
    wait: default!(Option<Interval>, "'0 seconds'"),
    lock_delay: default!(Option<Interval>, "NULL"),
    mode: default!(Option<Text<'_>>, "'exclusive'"),
    permits: default!(Option<i32>, "NULL"),
    session_bound: default!(Option<bool>, "false"),
) -> Option<pgrx::composite_type!('static, "lock_grant")> {
    caller::as_member(|| {
        let lock_id = error::identifier("lock_id", lock_id)?;
        let value = valid_value(value)?;
        let request = Request::validate(
            lock_id,
            owner,
            ttl,
            wait,
            lock_delay,
            mode,
            permits,
            session_bound,
            None,
        )?;
        lease::acquire_routed(&request, |granted| {
            let Some(granted) = granted else {
                return Ok(None);
            };
            // Found unless the ttl was shorter than this call: then the grant has run out
            // already, which its expires_at shows, and it has no value, as nobody holds it.
            store(lock_id, request.owner, granted.token, value)?;
            granted.to_grant().map(Some)
        })
    })
    .or_report()
}

/// The version of the value now stored for the caller's live grant `fence_token`, or NULL
/// when the caller holds no such grant (`lockext.lock_set_value` raises 55L01 for it).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn set_lease_value(
    lock_id: Option<Text<'_>>,
    owner: Option<Text<'_>>,
    fence_token: Option<i64>,
    value: Option<Jsonb>,
) -> Option<i64> {
    caller::as_member(|| {
        let lock_id = error::identifier("lock_id", lock_id)?;
        let _routed = citus::route(lock_id, Access::Write)?;
        let owner = error::identifier("owner", owner)?;
        let fence_token = error::token("fence_token", fence_token)?;
        let value = valid_value(value)?;
        backend::writable_server()?;
        // Its check of the lease reads under the statement's snapshot: a stale holder's
        // older one would still show its lease live, and it would be told it set a value.
        if backend::snapshot_per_transaction() {
            return Err(LockError::SetValueNeedsReadCommitted);
        }
        store(lock_id, owner, fence_token, value)
    })
    .or_report()
}

/// Every live grant of `lock_id`, oldest first (the leader first), with its value; no rows
/// when the lock is free.
// pgrx reads the columns from the signature itself, so they cannot be a type alias.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn lock_holders(
    lock_id: Option<Text<'_>>,
) -> TableIterator<
    'static,
    (
        name!(owner, TextBuf),
        name!(kind, TextBuf),
        name!(fence_token, i64),
        name!(value, Option<Jsonb>),
        name!(version, i64),
        name!(acquired_at, TimestampWithTimeZone),
        name!(expires_at, TimestampWithTimeZone),
    ),
> {
    let holders = caller::as_member(|| {
        let lock_id = error::identifier("lock_id", lock_id)?;
        let _routed = citus::route(lock_id, Access::Read)?;
        let now = backend::now()?;
        Spi::connect_mut(|client| read_holders(client, lock_id, now, None, true))
    })
    .or_report();
    TableIterator::new(holders.into_iter().map(|h| {
        (
            h.owner,
            h.kind,
            h.token,
            h.value,
            h.version,
            h.acquired_at,
            h.expires_at,
        )
    }))
}

/// Waits until the leader of `lock_id` or its value is not the one the caller knows
/// (`known_token`, NULL: none; `known_version`, NULL: 0), or `timeout` has passed, and
/// returns one row: whether it changed, and the leader now (NULLs when the lock is free).
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn lock_observe(
    lock_id: Option<Text<'_>>,
    known_token: default!(Option<i64>, "NULL"),
    known_version: default!(Option<i64>, "NULL"),
    timeout: default!(Option<Interval>, "'30 seconds'"),
) -> TableIterator<
    'static,
    (
        name!(changed, bool),
        name!(owner, Option<TextBuf>),
        name!(kind, Option<TextBuf>),
        name!(fence_token, Option<i64>),
        name!(value, Option<Jsonb>),
        name!(version, Option<i64>),
        name!(acquired_at, Option<TimestampWithTimeZone>),
        name!(expires_at, Option<TimestampWithTimeZone>),
    ),
> {
    let (changed, leader) =
        caller::as_member(|| observe(lock_id, known_token, known_version, timeout)).or_report();
    let row = match leader {
        Some(h) => (
            changed,
            Some(h.owner),
            Some(h.kind),
            Some(h.token),
            h.value,
            Some(h.version),
            Some(h.acquired_at),
            Some(h.expires_at),
        ),
        None => (changed, None, None, None, None, None, None, None),
    };
    TableIterator::once(row)
}

/// A value a grant may carry: present, and not over `lockext.value_max_size`: a leader's
/// address or a shard map, not a payload store (every follower reads it at each change,
/// and every set writes it whole to the WAL).
fn valid_value(value: Option<Jsonb>) -> Result<Jsonb, LockError> {
    let value = value.ok_or(LockError::NullArgument { arg: "value" })?;
    let limit = settings::value_max_size();
    if value.len() > limit {
        return Err(LockError::ValueTooLarge {
            len: value.len(),
            limit,
        });
    }
    Ok(value)
}

/// Stores `value` for the caller's live grant `token`; its version, or None when the
/// caller holds no such grant (and then nothing changed, no row is left locked). Refused
/// when the role's values would pass `lockext.role_values_size`: nothing changed then either.
fn store(
    lock_id: Text<'_>,
    owner: Text<'_>,
    token: i64,
    value: Jsonb,
) -> Result<Option<i64>, LockError> {
    let now = backend::now()?;
    let limit = settings::role_values_size();
    let args = Args::new()
        .set("lock_id", lock_id)
        .set("owner", owner)
        .set("role", caller::role())
        .set("now", now)
        .set("fence_token", token)
        .set("value", value)
        .set("notify", crate::events::enabled())
        .set("role_values_size", i64::try_from(limit).unwrap_or(i64::MAX));
    let mut full = false;
    let version = Spi::connect_mut(|client| {
        xact::kept_if_found(|| {
            let rows = SET_VALUE.run(client, args)?;
            if rows.is_empty() {
                return Ok(None);
            }
            let row = rows.first();
            let version = row.get_by_name::<i64, _>("version")?;
            full = version.is_none()
                && row.get_by_name::<bool, _>("held")? == Some(true)
                && row.get_by_name::<bool, _>("fits")? == Some(false);
            Ok(version)
        })
    })?;
    if full {
        return Err(LockError::RoleValuesFull { limit });
    }
    Ok(version)
}

/// The live grants of `lock_id` by the clock `now`, oldest first, at most `limit`; their
/// values only when asked for (a copy each, made in the caller's memory: an observer's
/// looks do not want them).
fn read_holders(
    client: &mut SpiClient<'_>,
    lock_id: Text<'_>,
    now: TimestampWithTimeZone,
    limit: Option<i64>,
    with_values: bool,
) -> Result<Vec<Holder>, LockError> {
    let args = Args::new()
        .set("lock_id", lock_id)
        .set("now", now)
        .set("limit", limit);
    let mut rows = HOLDERS.run(client, args)?;
    let missing = |name| LockError::MissingColumn { name };
    let mut holders = Vec::new();
    while rows.next().is_some() {
        let value = if with_values {
            jsonb_by_name(&rows, "value")?
        } else {
            None
        };
        holders.push(Holder {
            owner: rows.get_by_name("owner")?.ok_or(missing("owner"))?,
            kind: rows.get_by_name("kind")?.ok_or(missing("kind"))?,
            token: rows
                .get_by_name("fence_token")?
                .ok_or(missing("fence_token"))?,
            value,
            version: rows.get_by_name("version")?.unwrap_or(0),
            acquired_at: rows
                .get_by_name("acquired_at")?
                .ok_or(missing("acquired_at"))?,
            expires_at: rows
                .get_by_name("expires_at")?
                .ok_or(missing("expires_at"))?,
        });
    }
    Ok(holders)
}

fn observe(
    lock_id: Option<Text<'_>>,
    known_token: Option<i64>,
    known_version: Option<i64>,
    timeout: Option<Interval>,
) -> Result<(bool, Option<Holder>), LockError> {
    let lock_id = error::identifier("lock_id", lock_id)?;
    let known_token = error::optional_token("known_token", known_token)?;
    let known_version = match known_version {
        Some(v) if v < 0 => {
            return Err(LockError::VersionNegative {
                arg: "known_version",
                value: v,
            })
        }
        v => v.unwrap_or(0),
    };
    let timeout = error::duration("timeout", timeout)?;
    if backend::snapshot_per_transaction() {
        return Err(LockError::ObserveNeedsReadCommitted);
    }
    // A free lock has no value to know.
    let known: State = (known_token, known_token.map_or(0, |_| known_version));
    citus::refuse_in_transaction_block()?;
    let deadline = Instant::now() + timeout;
    loop {
        let now = backend::now()?;
        let mut seen = None;
        // Rolled back (the body returns None): it releases the locks its read took, on a
        // Citus cluster its shard's metadata lock too (routed at each look, so that an
        // observer never holds up a move of its shard for longer than one look).
        xact::all_or_nothing(|| {
            let _routed = citus::route_look(lock_id, Access::Read)?;
            seen = Some(Spi::connect_mut(|client| {
                let leader = read_holders(client, lock_id, now, Some(1), false)?;
                Ok::<_, LockError>(Holder::state(leader.first()))
            })?);
            Ok(None::<()>)
        })?;
        let seen = seen.ok_or(LockError::MissingColumn { name: "leader" })?;
        if seen != known || Instant::now() >= deadline {
            break;
        }
        wait::nap(deadline, OBSERVE_NAP);
    }
    let now = backend::now()?;
    let _routed = citus::route(lock_id, Access::Read)?;
    let leader = Spi::connect_mut(|client| read_holders(client, lock_id, now, Some(1), true))?
        .into_iter()
        .next();
    Ok((Holder::state(leader.as_ref()) != known, leader))
}
