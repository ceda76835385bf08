//! Semaphore permits: one of a semaphore's n permits, a row of `lockext.shared_leases`
//! (`many.rs`). n is whatever the semaphore's live permits say, or the asker's n when it
//! has none. An owner holds at most one permit of a semaphore.
//!
//! Permits are counted by slots: a taker claims one of the n slots, then checks that no
//! live permit is in it. Two takers never fill one slot, so n permits are never exceeded,
//! and takers of different slots do not wait for each other's commits.

use std::collections::HashSet;

use super::many::{self, Look};
use super::{LeaseKind, Request, Taken};
use crate::backend;
use crate::claims;
use crate::error::LockError;
use crate::grant::{
    millis, Attachments, ClearDead, Decision, Params, Seen, Store, ACQUIRE_PARAMS, LOOK,
};
use crate::statements::Statement;
use crate::text::Text;

pub struct Semaphore;

static SLOTS_TAKEN: Statement = Statement {
    sql: include_str!("../../sql/run/shared/slots_taken.sql"),
    params: ACQUIRE_PARAMS,
};

static SLOT_TAKEN: Statement = Statement {
    sql: include_str!("../../sql/run/shared/slot_taken.sql"),
    params: ACQUIRE_PARAMS,
};

/// Before a permit in slot $10: the dead permits of others in that slot.
static CLEAR_DEAD_SLOT: ClearDead = ClearDead {
    clear: Statement {
        sql: include_str!("../../sql/run/grant/clear_dead_slot.sql"),
        params: ACQUIRE_PARAMS,
    },
    left: Statement {
        sql: include_str!("../../sql/run/grant/left_slot.sql"),
        params: ACQUIRE_PARAMS,
    },
};

impl LeaseKind for Semaphore {
    fn mode(&self) -> &'static str {
        "exclusive"
    }

    fn counts_permits(&self) -> bool {
        true
    }

    fn gate_mode(&self) -> claims::Mode {
        claims::Mode::Shared
    }

    fn pass_after_gate(&self, lock_id: Text<'_>) -> Result<bool, LockError> {
        claims::try_kind(lock_id, true)
    }

    /// A semaphore of n permits can hand n over at once, and the first n in line take them
    /// in whatever order their tries land.
    fn queue_window(&self, request: &Request<'_>) -> usize {
        request.permits.map_or(1, |n| n as usize)
    }

    fn many_holders(&self) -> bool {
        true
    }

    fn store(&self) -> &'static Store {
        &many::STORE
    }

    fn look(&self) -> &'static Statement {
        &LOOK
    }

    fn decide(
        &self,
        request: &Request<'_>,
        leases: &[Seen],
        now: i64,
        params: &mut Params<'_>,
        taken: &mut Taken,
    ) -> Result<Decision, LockError> {
        let look = Look::read(leases, now);
        let asked = request.permits.unwrap_or(1);
        if look.exclusive == Some(true) || look.shared {
            return Err(LockError::WrongKind {
                lock_id: request.lock_id.to_string(),
                is: "a lock",
                asked: "a semaphore",
            });
        }
        match look.permits {
            Some(has) if has != asked => {
                return Err(LockError::PermitsMismatch {
                    lock_id: request.lock_id.to_string(),
                    has,
                    asked,
                })
            }
            _ if look.others >= i64::from(asked) => {
                return Ok(Decision::Refused(look.others_free_in_ms.map(millis)));
            }
            _ => {}
        }
        if look.permits.is_none() {
            // This permit fixes n: no other taker may be fixing it at the same time, so
            // the first takers go one at a time (their claims conflict).
            match claims::try_gate(request.lock_id, claims::Mode::Exclusive)? {
                Some(gate) => taken.gate(gate),
                None => return Ok(Decision::Refused(None)),
            }
        }
        if !look.mine_live && claim_free_slot(request.lock_id, asked, params)?.is_none() {
            // Not the caller's own live permit again, and the free slots are being filled
            // right now.
            return Ok(Decision::Refused(None));
        }
        // The dead permits of others in the slot this taker claimed go too.
        Ok(Decision::Grant(
            look.plan((!look.mine_live).then_some(&CLEAR_DEAD_SLOT)),
        ))
    }
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
        .read_latest_all(params.args(&Attachments::NONE))
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
            .read_latest(params.args(&Attachments::NONE))
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
