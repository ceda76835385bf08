//! Exclusive leases: one row of `lockext.locks` per lock id, one holder at a time.
//!
//! An exclusive acquire passes its gate alone. It first tries the common case in one
//! statement: a lock id with no lease row at all gets a new one (`store_if_free`).
//! Otherwise it looks at every lease of its lock id: a live lease of someone else's or a
//! live shared lease or permit refuses it; dead shared leases and permits are deleted first
//! (`CLEAR_DEAD_SHARED`); then the caller's own live lease is extended, or the row taken
//! over in place, or inserted.

use pgrx::spi::SpiClient;

use super::{LeaseKind, Request, Taken};
use crate::backend;
use crate::claims;
use crate::error::LockError;
use crate::grant::{
    grant_row, millis, Attachments, ClearDead, Decision, Granted, OwnerRow, Params, Plan, Seen,
    Store, ACQUIRE_PARAMS, LOOK,
};
use crate::statements::Statement;
use crate::token;

pub struct Exclusive;

/// What an exclusive acquire sees of its lock id (`grant::look_at`), by the call's clock.
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
    fn read(leases: &[Seen], now: i64) -> Look {
        let mut look = Look::default();
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

static STORE: Store = Store {
    extend: Statement {
        sql: include_str!("../../sql/run/grant/extend_lock.sql"),
        params: ACQUIRE_PARAMS,
    },
    take_over: Statement {
        sql: include_str!("../../sql/run/exclusive/take_over.sql"),
        params: ACQUIRE_PARAMS,
    },
    insert: Statement {
        sql: include_str!("../../sql/run/exclusive/insert_new.sql"),
        params: ACQUIRE_PARAMS,
    },
};

static INSERT_FREE: Statement = Statement {
    sql: include_str!("../../sql/run/exclusive/insert_free.sql"),
    params: ACQUIRE_PARAMS,
};

/// Before an exclusive grant: every dead shared lease and permit of the lock id.
static CLEAR_DEAD_SHARED: ClearDead = ClearDead {
    clear: Statement {
        sql: include_str!("../../sql/run/grant/clear_dead_shared.sql"),
        params: ACQUIRE_PARAMS,
    },
    left: Statement {
        sql: include_str!("../../sql/run/grant/left_shared.sql"),
        params: ACQUIRE_PARAMS,
    },
};

impl LeaseKind for Exclusive {
    fn mode(&self) -> &'static str {
        "exclusive"
    }

    fn gate_mode(&self) -> claims::Mode {
        claims::Mode::Exclusive
    }

    fn many_holders(&self) -> bool {
        false
    }

    fn store(&self) -> &'static Store {
        &STORE
    }

    /// One statement instead of the look and the insert, which mints the token itself
    /// (lockext.grant_token) once it found the id free. Its checks read under its own
    /// snapshot, which is taken after the gate only in READ COMMITTED; a REPEATABLE READ
    /// caller's is older, and only the look reads under the newest.
    fn store_if_free(
        &self,
        client: &mut SpiClient<'_>,
        params: &Params<'_>,
        attached: &Attachments,
    ) -> Result<Option<Granted>, LockError> {
        if backend::snapshot_per_transaction() {
            return Ok(None);
        }
        let rows = token::minting_in(|| INSERT_FREE.run(client, params.args(attached)))?;
        grant_row(rows)
    }

    fn look(&self) -> &'static Statement {
        &LOOK
    }

    fn decide(
        &self,
        request: &Request<'_>,
        leases: &[Seen],
        now: i64,
        _params: &mut Params<'_>,
        _taken: &mut Taken,
    ) -> Result<Decision, LockError> {
        let look = Look::read(leases, now);
        if look.semaphore {
            return Err(LockError::WrongKind {
                lock_id: request.lock_id.to_string(),
                is: "a semaphore",
                asked: "a lock",
            });
        }
        if let Some(ms) = look.shared_until_ms {
            return Ok(Decision::Refused(Some(millis(ms)))); // shared leases hold it
        }
        if look.held_by_other {
            // a live lease of someone else's
            return Ok(Decision::Refused(look.free_in_ms.map(millis)));
        }
        Ok(Decision::Grant(Plan {
            clear: [(look.dead_shared > 0).then_some(&CLEAR_DEAD_SHARED), None],
            owner_row: OwnerRow::Covered,
            mine_live: look.mine_live,
            row_exists: look.exclusive_row,
            announces_take_over: true,
        }))
    }
}
