//! Sets of locks taken all or nothing: `lock_acquire_all` and `lock_release_all`.
//!
//! The set is taken in one statement, lock by lock in sorted order (byte order of the
//! ids, whatever the collation), inside a subtransaction. If any lock is not available in
//! time, the subtransaction is rolled back: nothing was taken, so nothing is released.
//! Two callers whose sets overlap take the shared ids in the same order, so when they wait
//! neither can hold one lock while waiting for another that the other holds: no deadlock.

use std::time::Instant;

use pgrx::prelude::*;

use crate::backend;
use crate::caller;
use crate::error::{self, LockError, OrReport};
use crate::kind::Request;
use crate::lease;
use crate::text::{Text, TextBuf};
use crate::xact;

/// Takes every lock in `lock_ids` for `owner`, or none: one grant per distinct lock id, in
/// sorted order, or no rows. `wait` bounds the time for the whole set; `keepalive`
/// attaches every lease of the set to that keep-alive of the caller's (`ttl` NULL).
// Its C symbol, lock_acquire_all_0_3_wrapper, is one no older library has (compat.rs).
#[pg_extern(volatile, parallel_unsafe, name = "lock_acquire_all")]
#[search_path(pg_catalog, pg_temp)]
fn lock_acquire_all_0_3(
    lock_ids: Option<Vec<Option<TextBuf>>>,
    owner: Option<Text<'_>>,
    ttl: Option<Interval>,
    wait: default!(Option<Interval>, "'0 seconds'"),
    mode: default!(Option<Text<'_>>, "'exclusive'"),
    session_bound: default!(Option<bool>, "false"),
    keepalive: default!(Option<i64>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(lock_id, TextBuf),
        name!(owner, TextBuf),
        name!(fence_token, i64),
        name!(acquired_at, TimestampWithTimeZone),
        name!(expires_at, TimestampWithTimeZone),
    ),
> {
    crate::citus::refuse(
        "lock_acquire_all takes leases of many lock ids in one transaction, which a Citus \
         cluster keeps on different nodes",
        "Take them one at a time with lock_acquire, always in the same order (sorted lock ids), \
         and release those taken when one is refused (docs/citus.md).",
    )
    .or_report();
    TableIterator::new(
        caller::as_member(|| {
            acquire_all(lock_ids, owner, ttl, wait, mode, session_bound, keepalive)
        })
        .or_report(),
    )
}

/// A grant as lockext.lock_grant's columns.
type GrantRow = (
    TextBuf,
    TextBuf,
    i64,
    TimestampWithTimeZone,
    TimestampWithTimeZone,
);

/// Releases the caller's leases on `lock_ids`; returns how many of them it still held.
// Its C symbol, lock_release_all_0_3_wrapper, is one no older library has (compat.rs).
#[pg_extern(volatile, parallel_unsafe, name = "lock_release_all")]
#[search_path(pg_catalog, pg_temp)]
fn lock_release_all_0_3(lock_ids: Option<Vec<Option<TextBuf>>>, owner: Option<Text<'_>>) -> i32 {
    crate::citus::refuse(
        "lock_release_all ends leases of many lock ids in one transaction, which a Citus \
         cluster keeps on different nodes",
        "Release each with lock_release, which Citus runs on the node of its lock id.",
    )
    .or_report();
    caller::as_member(|| release_all(lock_ids, owner)).or_report()
}

fn acquire_all(
    lock_ids: Option<Vec<Option<TextBuf>>>,
    owner: Option<Text<'_>>,
    ttl: Option<Interval>,
    wait: Option<Interval>,
    mode: Option<Text<'_>>,
    session_bound: Option<bool>,
    keepalive: Option<i64>,
) -> Result<Vec<GrantRow>, LockError> {
    let ids = sorted_ids(lock_ids)?;
    let base = Request::validate(
        Text::new(b""),
        owner,
        ttl,
        wait,
        None,
        mode,
        None,
        session_bound,
        keepalive,
    )?;
    let deadline = Instant::now() + base.wait;
    let grants = xact::all_or_nothing(|| {
        let mut grants = Vec::with_capacity(ids.len());
        for id in &ids {
            let request = Request {
                lock_id: id.as_text(),
                wait: deadline.saturating_duration_since(Instant::now()),
                ..base
            };
            match lease::acquire(&request)? {
                Some(g) => grants.push((g.lock_id, g.owner, g.token, g.acquired_at, g.expires_at)),
                None => return Ok(None),
            }
        }
        Ok(Some(grants))
    })?;
    Ok(grants.unwrap_or_default())
}

fn release_all(
    lock_ids: Option<Vec<Option<TextBuf>>>,
    owner: Option<Text<'_>>,
) -> Result<i32, LockError> {
    let ids = sorted_ids(lock_ids)?;
    let owner = error::identifier("owner", owner)?;
    backend::writable_server()?;
    let mut released = 0;
    for id in &ids {
        if lease::release_valid(id.as_text(), owner, None)? {
            released += 1;
        }
    }
    Ok(released)
}

/// The distinct ids of a set, each checked, in byte order.
fn sorted_ids(lock_ids: Option<Vec<Option<TextBuf>>>) -> Result<Vec<TextBuf>, LockError> {
    let lock_ids = lock_ids.ok_or(LockError::NullArgument { arg: "lock_ids" })?;
    if lock_ids.is_empty() {
        return Err(LockError::EmptyLockSet { arg: "lock_ids" });
    }
    let mut ids = Vec::with_capacity(lock_ids.len());
    for id in &lock_ids {
        ids.push(
            error::identifier("lock_ids element", id.as_ref().map(TextBuf::as_text))?.to_buf(),
        );
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}
