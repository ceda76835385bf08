//! Exclusive leases: one row of `lockext.locks` per lock id, one holder at a time.
//!
//! An exclusive acquire, past its gate (`lease.rs`), looks at every lease of its lock id
//! (`grant::look_at`): a live lease of someone else's or a live shared lease or permit
//! refuses it; dead shared leases and permits are deleted first (`grant::clear_dead`); then
//! the caller's own live lease is extended, or the row taken over in place, or inserted
//! (`grant::take`).

use pgrx::spi::SpiClient;

use crate::error::LockError;
use crate::grant::{
    clear_dead, look_at, millis, take, Attempt, Granted, Kind, Params, Request, ACQUIRE_PARAMS,
    CLEAR_DEAD_SHARED,
};
use crate::sql::{grant_returning, grant_sets};
use crate::statements::Statement;

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
        "NOT c.same_grant AS minted, c.old_token AS previous_token"
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
        "true AS minted, NULL::bigint AS previous_token"
    ),
    params: ACQUIRE_PARAMS,
};

/// One try at an exclusive lease, past the gate.
pub fn attempt(
    client: &mut SpiClient<'_>,
    request: &Request<'_>,
    params: &mut Params<'_>,
) -> Result<Attempt, LockError> {
    let look = Look::read(params);
    if look.semaphore {
        return Err(LockError::WrongKind {
            lock_id: request.lock_id.to_string(),
            is: "a semaphore",
            asked: "a lock",
        });
    }
    if let Some(ms) = look.shared_until_ms {
        return Ok((None, Some(millis(ms)))); // shared leases hold it
    }
    if look.held_by_other {
        return Ok((None, look.free_in_ms.map(millis))); // a live lease of someone else's
    }
    if look.dead_shared > 0 && !clear_dead(client, &CLEAR_DEAD_SHARED, params)? {
        return Ok((None, None)); // a shared lease or permit is being renewed right now
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
    Ok((
        granted.map(|g| Granted {
            took_over: g.minted && look.exclusive_row,
            ..g
        }),
        None,
    ))
}
