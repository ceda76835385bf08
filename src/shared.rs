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
    /// The caller's own live lease of this kind, and whether a row of its owner's name exists
    /// and whether it is another role's, not yet free (then it is not the caller's to take).
    mine_live: bool,
    row_exists: bool,
    named_other_held: bool,
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
            look.named_other_held |= lease.owner_named && !lease.mine;
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

static SLOTS_TAKEN: Statement = Statement {
    sql: include_str!("../sql/run/shared/slots_taken.sql"),
    params: ACQUIRE_PARAMS,
};

static SLOT_TAKEN: Statement = Statement {
    sql: include_str!("../sql/run/shared/slot_taken.sql"),
    params: ACQUIRE_PARAMS,
};

static TAKE_OVER: Statement = Statement {
    sql: include_str!("../sql/run/shared/take_over.sql"),
    params: ACQUIRE_PARAMS,
};

static INSERT_NEW: Statement = Statement {
    sql: include_str!("../sql/run/shared/insert_new.sql"),
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
                return Ok(Attempt::Refused(look.exclusive_free_in_ms.map(millis)));
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
                    return Ok(Attempt::Refused(look.others_free_in_ms.map(millis)));
                }
                _ => {}
            }
            if look.permits.is_none() {
                // This permit fixes n: no other taker may be fixing it at the same time,
                // so the first takers go one at a time (their claims conflict).
                match claims::try_gate(request.lock_id, claims::Mode::Exclusive)? {
                    Some(gate) => fixing_n = Some(gate),
                    None => return Ok(Attempt::Refused(None)),
                }
            }
            if !look.mine_live && claim_free_slot(request.lock_id, asked, params)?.is_none() {
                // Not the caller's own live permit again, and the free slots are being
                // filled right now.
                if let Some(gate) = fixing_n {
                    gate.reopen();
                }
                return Ok(Attempt::Refused(None));
            }
        }
        Kind::Exclusive => unreachable!("exclusive leases live in lockext.locks"),
    }
    // A dead exclusive lease goes first, so that its renewal cannot revive it beside ours.
    // Not cleared: its row is locked right now (the reaper deleting it, say), or it was
    // renewed since the look.
    if look.exclusive == Some(false) && !clear_dead(client, &CLEAR_DEAD_EXCLUSIVE, params)? {
        if let Some(gate) = fixing_n {
            gate.reopen();
        }
        return Ok(Attempt::Busy);
    }
    // And so do dead permits of others in the slot this taker claimed.
    if matches!(request.kind, Kind::Semaphore(_))
        && !look.mine_live
        && !clear_dead(client, &CLEAR_DEAD_SLOT, params)?
    {
        if let Some(gate) = fixing_n {
            gate.reopen();
        }
        return Ok(Attempt::Busy);
    }
    let row_exists = look.row_exists;
    // Not this owner's to take: its row is being created right now, or its name is another
    // role's live lease.
    let attempt = if look.named_other_held
        || !row_exists && !claims::try_claim_row(request.lock_id, request.owner)?
    {
        Attempt::Refused(None)
    } else {
        let mine_live = look.mine_live;
        // Nothing granted: this owner's dead row (or its keep-alive's) was locked by
        // someone else, or changed since the look.
        Attempt::granted_or_busy(take(
            client,
            request,
            params,
            mine_live,
            row_exists,
            &TAKE_OVER,
            &INSERT_NEW,
        )?)
    };
    if !matches!(attempt, Attempt::Granted(_)) {
        if let Some(gate) = fixing_n {
            gate.reopen();
        }
    }
    Ok(attempt)
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
