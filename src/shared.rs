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

use pgrx::spi::SpiClient;

use crate::backend;
use crate::claims;
use crate::error::LockError;
use crate::grant::{
    clear_dead, look_at, millis, take, Attempt, Kind, Params, Request, ACQUIRE_PARAMS,
    CLEAR_DEAD_EXCLUSIVE, CLEAR_DEAD_SLOT,
};
use crate::sql::{grant_returning, grant_sets};
use crate::statements::Statement;
use crate::text::Text;

/// What a shared or permit acquire sees of its lock id (`grant::look_at`), by the call's
/// clock: the exclusive lease, and the shared leases or permits not yet free (a shared
/// acquire sees only its own row and one live permit of someone else's, if any: `others`
/// and `shared` then say nothing, and only a permit acquire reads them).
#[derive(Default)]
struct Look {
    /// An exclusive lease row: not yet free (`Some(true)`), or free but still there.
    exclusive: Option<bool>,
    exclusive_free_in_ms: Option<i64>,
    /// Live (not yet free) shared leases or permits of others, and how soon the first is free.
    others: i64,
    others_free_in_ms: Option<i64>,
    /// The n of the live permits (None: no live permit), and whether live shared leases hold it.
    permits: Option<i32>,
    shared: bool,
    /// The caller's own live lease of this kind, and whether a row of its owner's name exists.
    mine_live: bool,
    row_exists: bool,
}

impl Look {
    fn read(kind: Kind, params: &Params<'_>) -> Look {
        let mut look = Look::default();
        let (leases, now) = look_at(kind, params);
        for lease in leases {
            if !lease.shared {
                look.exclusive = Some(!lease.free(now));
                look.exclusive_free_in_ms = Some(lease.free_in_ms(now));
                continue;
            }
            look.row_exists |= lease.owner_named;
            if lease.free(now) {
                continue;
            }
            match lease.permits {
                Some(n) => look.permits = Some(look.permits.map_or(n, |m| m.min(n))),
                None => look.shared = true,
            }
            look.mine_live |= lease.mine && lease.live(now);
            if !lease.mine {
                look.others += 1;
                let free_in = lease.free_in_ms(now);
                look.others_free_in_ms =
                    Some(look.others_free_in_ms.map_or(free_in, |f| f.min(free_in)));
            }
        }
        look
    }
}

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
                            AND NOT (owner = $2 AND holder_role = $3)) AS taken",
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
        "NOT c.same_grant AS minted, c.old_token AS previous_token"
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
        "true AS minted, NULL::bigint AS previous_token"
    ),
    params: ACQUIRE_PARAMS,
};

/// One try at a shared lease or a permit, past the gate.
pub fn attempt(
    client: &mut SpiClient<'_>,
    request: &Request<'_>,
    params: &mut Params<'_>,
) -> Result<Attempt, LockError> {
    let look = Look::read(request.kind, params);
    let exclusive_held = look.exclusive == Some(true);
    let others = look.others;
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
            if look.permits.is_some() {
                return Err(wrong_kind("a semaphore"));
            }
            if exclusive_held {
                return Ok((None, look.exclusive_free_in_ms.map(millis)));
            }
        }
        Kind::Semaphore(asked) => {
            if exclusive_held || look.shared {
                return Err(wrong_kind("a lock"));
            }
            match look.permits {
                Some(has) if has != asked => {
                    return Err(LockError::PermitsMismatch {
                        lock_id: request.lock_id.to_string(),
                        has,
                        asked,
                    })
                }
                _ if others >= i64::from(asked) => {
                    return Ok((None, look.others_free_in_ms.map(millis)));
                }
                _ => {}
            }
            if look.permits.is_none() {
                // This permit fixes n: no other taker may be fixing it at the same time,
                // so the first takers go one at a time (their claims conflict).
                match claims::try_gate(request.lock_id, claims::Mode::Exclusive)? {
                    Some(gate) => fixing_n = Some(gate),
                    None => return Ok((None, None)),
                }
            }
            if !look.mine_live && claim_free_slot(request.lock_id, asked, params)?.is_none() {
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
    if look.exclusive == Some(false) && !clear_dead(client, &CLEAR_DEAD_EXCLUSIVE, params)? {
        if let Some(gate) = fixing_n {
            gate.reopen();
        }
        return Ok((None, None));
    }
    // And so do dead permits of others in the slot this taker claimed.
    if matches!(request.kind, Kind::Semaphore(_))
        && !look.mine_live
        && !clear_dead(client, &CLEAR_DEAD_SLOT, params)?
    {
        if let Some(gate) = fixing_n {
            gate.reopen();
        }
        return Ok((None, None));
    }
    let row_exists = look.row_exists;
    let granted = if !row_exists && !claims::try_claim_row(request.lock_id, request.owner) {
        None // this owner's row is being created right now
    } else {
        let mine_live = look.mine_live;
        take(
            client,
            request,
            params,
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
    lock_id: Text<'_>,
    permits: i32,
    params: &mut Params<'_>,
) -> Result<Option<i32>, LockError> {
    let taken: HashSet<i32> = SLOTS_TAKEN
        .read_latest_all(&params.datums())
        .iter()
        .filter_map(|row| row.get::<i32>("slot"))
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
        params.slot = Some(slot);
        if SLOT_TAKEN
            .read_latest(&params.datums())
            .and_then(|row| row.get::<bool>("taken"))
            == Some(false)
        {
            return Ok(Some(slot));
        }
        claim.give_back();
    }
    params.slot = None;
    Ok(None)
}
