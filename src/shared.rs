//! Shared leases and semaphore permits: locks with many holders at once, one row each in
//! `lockext.shared_leases`, each grant with a fence token of its own.
//!
//! - A shared (read) lease coexists with other shared leases of its lock id, and with no
//!   live exclusive lease (`lease.rs` checks the other way round).
//! - A permit is one of a semaphore's N permits; N is whatever the semaphore's live permits
//!   say, or the asker's N when it has none. An owner holds at most one permit of a
//!   semaphore.
//!
//! Every acquire of a lock id passes its gate first (`claims.rs`): shared leases and
//! permits together, an exclusive lease alone; each then looks under the newest snapshot,
//! so it sees every lease committed before it passed. A semaphore's permits are counted by
//! slots: a taker claims one of the n slots, then checks that no live permit is in it.
//! Two takers never fill one slot, so n permits are never exceeded, and takers of
//! different slots do not wait for each other's commits.

use std::collections::HashSet;

use pgrx::datum::DatumWithOid;
use pgrx::spi::SpiClient;

use crate::backend;
use crate::claims;
use crate::error::LockError;
use crate::grant::{
    clear_dead, millis, take, Args, Attempt, Kind, Request, ACQUIRE_PARAMS, CLEAR_DEAD_EXCLUSIVE,
    CLEAR_DEAD_SLOT,
};
use crate::sql::{grant_returning, grant_sets, ms_until};
use crate::statements::Statement;

// Read under the newest snapshot, after passing the gate: is there a live exclusive lease,
// and till when; how many live shared leases or permits others hold, of what kind, and
// how soon the first of them runs out; does the caller have a row already.
static PEEK: Statement = Statement {
    sql: concat!(
        "SELECT x.held, x.free_ms, s.others, s.permits, s.shared, s.next_free_ms, \
                EXISTS (SELECT FROM lockext.shared_leases WHERE lock_id = $1 AND owner = $2), \
                s.mine_live \
           FROM (SELECT) AS one \
           LEFT JOIN LATERAL ( \
                SELECT expires_at + lock_delay > $5 AS held, ",
        ms_until!("expires_at + lock_delay"),
        " AS free_ms FROM lockext.locks WHERE lock_id = $1) AS x ON true \
           CROSS JOIN LATERAL ( \
                SELECT count(*) FILTER (WHERE NOT mine) AS others, min(permits) AS permits, \
                       bool_or(permits IS NULL) AS shared, \
                       coalesce(bool_or(mine AND expires_at > $5), false) AS mine_live, ",
        ms_until!("min(expires_at + lock_delay) FILTER (WHERE NOT mine)"),
        " AS next_free_ms \
                  FROM (SELECT permits, expires_at, lock_delay, \
                               owner = $2 AND holder_role = $3 AS mine \
                          FROM lockext.shared_leases \
                         WHERE lock_id = $1 AND expires_at + lock_delay > $5) AS live) AS s"
    ),
    params: ACQUIRE_PARAMS,
};

// The slots of the live permits of others.
static SLOTS_TAKEN: Statement = Statement {
    sql: "SELECT slot FROM lockext.shared_leases \
           WHERE lock_id = $1 AND slot IS NOT NULL AND expires_at + lock_delay > $5 \
             AND NOT (owner = $2 AND holder_role = $3)",
    params: ACQUIRE_PARAMS,
};

// Is slot $10 taken by a live permit of someone else's?
static SLOT_TAKEN: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM lockext.shared_leases \
                          WHERE lock_id = $1 AND slot = $10 AND expires_at + lock_delay > $5 \
                            AND NOT (owner = $2 AND holder_role = $3))",
    params: ACQUIRE_PARAMS,
};

// The caller's own row: extended when live (same grant, same slot), renewed with a new
// token (and the slot just claimed) when not. A row of the same owner name but another
// role is taken only once it is free.
static TAKE_OVER: Statement = Statement {
    sql: concat!(
        "UPDATE lockext.shared_leases AS l \
            SET permits = $9, slot = CASE WHEN c.same_grant THEN l.slot ELSE $10 END, ",
        grant_sets!(),
        " FROM (SELECT lock_id, owner, fence_token AS old_token, \
                        expires_at > $5 AND holder_role = $3 AS same_grant \
                   FROM lockext.shared_leases \
                  WHERE lock_id = $1 AND owner = $2 \
                    AND (holder_role = $3 OR expires_at + lock_delay <= $5) \
                    FOR UPDATE SKIP LOCKED) AS c \
          WHERE l.lock_id = c.lock_id AND l.owner = c.owner",
        grant_returning!(),
        "NOT c.same_grant, c.old_token"
    ),
    params: ACQUIRE_PARAMS,
};

static INSERT_NEW: Statement = Statement {
    sql: concat!(
        "INSERT INTO lockext.shared_leases AS l \
                (lock_id, owner, permits, slot, holder_role, fence_token, acquired_at, \
                 expires_at, renewals, lock_delay, session_start, taker_pid, application_name, \
                 client_addr) \
         VALUES ($1, $2, $9, $10, $3, $6, $5, $5 + $4, 0, $7, $8, pg_backend_pid(), current_setting('application_name'), \
           inet_client_addr()) \
         ON CONFLICT (lock_id, owner) DO NOTHING",
        grant_returning!(),
        "true, NULL::bigint"
    ),
    params: ACQUIRE_PARAMS,
};

/// One try at a shared lease or a permit, past the gate.
pub fn attempt(
    client: &mut SpiClient<'_>,
    request: &Request<'_>,
    args: &mut Args<'_>,
) -> Result<Attempt, LockError> {
    let Some(peek) = PEEK.read_latest(&args[..]) else {
        return Ok((None, None));
    };
    let exclusive_held = peek.get::<bool>(1) == Some(true);
    let others = peek.get::<i64>(3).unwrap_or(0);
    let wrong_kind = |is| LockError::WrongKind {
        lock_id: request.lock_id.to_string(),
        is,
        asked: if request.kind == Kind::Shared {
            "a lock"
        } else {
            "a semaphore"
        },
    };
    let mut fixing_n: Option<claims::Gate> = None;
    match request.kind {
        Kind::Shared => {
            if peek.get::<i32>(4).is_some() {
                return Err(wrong_kind("a semaphore"));
            }
            if exclusive_held {
                return Ok((None, peek.get::<i64>(2).map(millis)));
            }
        }
        Kind::Semaphore(asked) => {
            if exclusive_held || peek.get::<bool>(5) == Some(true) {
                return Err(wrong_kind("a lock"));
            }
            match peek.get::<i32>(4) {
                Some(has) if has != asked => {
                    return Err(LockError::PermitsMismatch {
                        lock_id: request.lock_id.to_string(),
                        has,
                        asked,
                    })
                }
                _ if others >= i64::from(asked) => {
                    return Ok((None, peek.get::<i64>(6).map(millis)));
                }
                _ => {}
            }
            if peek.get::<i32>(4).is_none() {
                // This permit fixes n: no other taker may be fixing it at the same time,
                // so the first takers go one at a time (their claims conflict).
                match claims::try_gate(request.lock_id, claims::Mode::Exclusive)? {
                    Some(gate) => fixing_n = Some(gate),
                    None => return Ok((None, None)),
                }
            }
            if peek.get::<bool>(8) != Some(true)
                && claim_free_slot(request.lock_id, asked, args)?.is_none()
            {
                // Not the caller's own live permit again, and the free slots are being
                // filled right now.
                if let Some(gate) = fixing_n {
                    gate.reopen();
                }
                return Ok((None, None));
            }
        }
        Kind::Exclusive => unreachable!("exclusive leases live in lockext.locks"),
    }
    // A dead exclusive lease goes first, so that its renewal cannot revive it beside ours.
    if peek.get::<bool>(1) == Some(false) && !clear_dead(client, &CLEAR_DEAD_EXCLUSIVE, args)? {
        if let Some(gate) = fixing_n {
            gate.reopen();
        }
        return Ok((None, None));
    }
    // And so do dead permits of others in the slot this taker claimed.
    if matches!(request.kind, Kind::Semaphore(_))
        && peek.get::<bool>(8) != Some(true)
        && !clear_dead(client, &CLEAR_DEAD_SLOT, args)?
    {
        if let Some(gate) = fixing_n {
            gate.reopen();
        }
        return Ok((None, None));
    }
    let row_exists = peek.get::<bool>(7) == Some(true);
    let granted = if !row_exists && !claims::try_claim_row(request.lock_id, request.owner) {
        None // this owner's row is being created right now
    } else {
        let mine_live = peek.get::<bool>(8) == Some(true);
        take(
            client,
            request,
            args,
            mine_live,
            row_exists,
            &TAKE_OVER,
            &INSERT_NEW,
        )?
    };
    if granted.is_none() {
        if let Some(gate) = fixing_n {
            gate.reopen();
        }
    }
    Ok((granted, None))
}

/// Claims a slot of the semaphore that no live permit holds, trying the free ones from a
/// place of this backend's own, so that takers arriving together try different slots.
/// The claim is kept to the end of the transaction; the slot number is returned.
fn claim_free_slot(
    lock_id: &str,
    permits: i32,
    args: &mut Args<'_>,
) -> Result<Option<i32>, LockError> {
    let taken: HashSet<i32> = SLOTS_TAKEN
        .read_latest_all(&args[..])
        .iter()
        .filter_map(|row| row.get::<i32>(1))
        .collect();
    let free: Vec<i32> = (1..=permits).filter(|s| !taken.contains(s)).collect();
    let start = backend::pid() as usize;
    for i in 0..free.len() {
        let slot = free[(start + i) % free.len()];
        let Some(claim) = claims::try_claim_slot(lock_id, slot)? else {
            continue;
        };
        // Look again now that the slot is ours: a taker that filled it and committed
        // since the first look had held this claim until its commit.
        args[9] = slot.into();
        if SLOT_TAKEN
            .read_latest(&args[..])
            .and_then(|row| row.get::<bool>(1))
            == Some(false)
        {
            return Ok(Some(slot));
        }
        claim.give_back();
    }
    args[9] = DatumWithOid::null::<i32>();
    Ok(None)
}
