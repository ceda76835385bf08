//! Exclusive leases: one row of `lockext.locks` per lock id, one holder at a time.
//!
//! An exclusive acquire, past its gate (`lease.rs`), first tries the common case in one
//! statement: a lock id with no lease row at all gets a new one (`INSERT_FREE`). Otherwise
//! it looks at every lease of its lock id (`grant::look_at`): a live lease of someone
//! else's or a live shared lease or permit refuses it; dead shared leases and permits are
//! deleted first (`grant::clear_dead`); then the caller's own live lease is extended, or
//! the row taken over in place, or inserted (`grant::take`).

use pgrx::spi::SpiClient;

use crate::backend;
use crate::error::LockError;
use crate::grant::{
    clear_dead, grant_row, look_at, millis, take, Attempt, Granted, Kind, Params, Request,
    ACQUIRE_PARAMS, CLEAR_DEAD_SHARED,
};
use crate::statements::Statement;
use crate::token;

/// What an exclusive acquire sees of its lock id (`grant::look`), by the call's clock.
#[derive(Default)]
struct Look {
    /// Whether an exclusive lease row exists, and whether it is someone else's and not yet
    /// free (live, or in its lock-delay); how long until it is free.
    exclusive_row: bool,
    held_by_other: bool,
    free_in_ms: Option<i64>,
    /// The caller's own live exclusive lease.
    mine_live: bool,
    /// Shared leases or permits not yet free: how long until the last is, and whether they
    /// are a semaphore's.
    shared_until_ms: Option<i64>,
    semaphore: bool,
    /// Shared leases or permits whose lock is free (dead), to delete before granting.
    dead_shared: usize,
}

impl Look {
    fn read(params: &Params<'_>) -> Look {
        let mut look = Look::default();
        let (leases, now) = look_at(Kind::Exclusive, params);
        for lease in leases {
            if !lease.shared {
                look.exclusive_row = true;
                look.held_by_other = !lease.free(now) && !lease.mine;
                look.free_in_ms = Some(lease.free_in_ms(now));
                look.mine_live = lease.mine && lease.live(now);
            } else if lease.free(now) {
                look.dead_shared += 1;
            } else {
                let until = lease.free_in_ms(now);
                look.shared_until_ms = Some(look.shared_until_ms.map_or(until, |u| u.max(until)));
                look.semaphore |= lease.permits.is_some();
            }
        }
        look
    }
}

static TAKE_OVER: Statement = Statement {
    sql: include_str!("../sql/run/exclusive/take_over.sql"),
    params: ACQUIRE_PARAMS,
};

static INSERT_FREE: Statement = Statement {
    sql: include_str!("../sql/run/exclusive/insert_free.sql"),
    params: ACQUIRE_PARAMS,
};

static INSERT_NEW: Statement = Statement {
    sql: include_str!("../sql/run/exclusive/insert_new.sql"),
    params: ACQUIRE_PARAMS,
};

/// One try at an exclusive lease, past the gate.
pub fn attempt(
    client: &mut SpiClient<'_>,
    request: &Request<'_>,
    params: &mut Params<'_>,
) -> Result<Attempt, LockError> {
    // One statement instead of the look and the insert, which mints the token itself
    // (lockext.grant_token) once it found the id free. Its checks read under its own
    // snapshot, which is taken after the gate only in READ COMMITTED; a REPEATABLE READ
    // caller's is older, and only the look reads under the newest.
    if !backend::snapshot_per_transaction() {
        let rows = token::minting_in(|| INSERT_FREE.run(client, &params.datums()))?;
        if let Some(granted) = grant_row(rows)? {
            return Ok(Attempt::Granted(granted));
        }
    }
    let look = Look::read(params);
    if look.semaphore {
        return Err(LockError::WrongKind {
            lock_id: request.lock_id.to_string(),
            is: "a semaphore",
            asked: "a lock",
        });
    }
    if let Some(ms) = look.shared_until_ms {
        return Ok(Attempt::Refused(Some(millis(ms)))); // shared leases hold it
    }
    if look.held_by_other {
        return Ok(Attempt::Refused(look.free_in_ms.map(millis))); // a live lease of someone else's
    }
    if look.dead_shared > 0 && !clear_dead(client, &CLEAR_DEAD_SHARED, params)? {
        // A dead shared lease or permit locked right now (the reaper deleting it, or a
        // renewal that read its clock before the expiry), or renewed since the look.
        return Ok(Attempt::Busy);
    }
    let granted = take(
        client,
        request,
        params,
        look.mine_live,
        look.exclusive_row,
        &TAKE_OVER,
        &INSERT_NEW,
    )?;
    // Nothing granted past every live lease: the dead row (or its keep-alive's) was
    // locked by someone else, or changed or deleted since the look.
    Ok(Attempt::granted_or_busy(granted.map(|g| Granted {
        took_over: g.minted && look.exclusive_row,
        ..g
    })))
}
