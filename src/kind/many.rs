//! What the kinds with many holders at once (shared leases, semaphore permits) share: their
//! table, `lockext.shared_leases` (one row per lock id and owner, each grant with a fence
//! token of its own), its statements, and how they read their look.
//!
//! Shared leases and permits pass the gate together (in shared mode), and then claim their
//! kind (`claims::try_kind`), so that two first acquires of an id cannot make it a lock and
//! a semaphore at once. Each then looks under the newest snapshot, so it sees every lease
//! committed before it passed.

use crate::grant::{ClearDead, OwnerRow, Plan, Seen, Store, ACQUIRE_PARAMS};
use crate::statements::Statement;

/// What a shared or permit acquire sees of its lock id (`grant::look_at`), by the call's
/// clock: the exclusive lease, and the shared leases or permits not yet free (a shared
/// acquire sees only its own row and one live permit of someone else's, if any: `others`
/// and `shared` then say nothing, and only a permit acquire reads them).
#[derive(Default)]
pub struct Look {
    /// An exclusive lease row: not yet free (`Some(true)`), or free but still there.
    pub exclusive: Option<bool>,
    pub exclusive_free_in_ms: Option<i64>,
    /// Live (not yet free) shared leases or permits of others, and how soon the first is free.
    pub others: i64,
    pub others_free_in_ms: Option<i64>,
    /// The n of the live permits (None: no live permit), and whether live shared leases hold it.
    pub permits: Option<i32>,
    pub shared: bool,
    /// The caller's own live lease of this kind, and whether a row of its owner's name exists
    /// and whether it is another role's, not yet free (then it is not the caller's to take).
    pub mine_live: bool,
    pub row_exists: bool,
    pub named_other_held: bool,
}

impl Look {
    pub fn read(leases: &[Seen], now: i64) -> Look {
        let mut look = Look::default();
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

    /// The plan of a grant that nothing live is in the way of: a dead exclusive lease goes
    /// first, so that its renewal cannot revive it beside ours; then `also`, the kind's own
    /// dead leases in the way, if any; then the owner's row, unless another role's live
    /// lease has its name.
    pub fn plan(&self, also: Option<&'static ClearDead>) -> Plan {
        Plan {
            clear: [
                (self.exclusive == Some(false)).then_some(&CLEAR_DEAD_EXCLUSIVE),
                also,
            ],
            owner_row: if self.named_other_held {
                OwnerRow::OthersNamed
            } else {
                OwnerRow::Claimed
            },
            mine_live: self.mine_live,
            row_exists: self.row_exists,
            announces_take_over: false,
        }
    }
}

pub static STORE: Store = Store {
    extend: Statement {
        sql: include_str!("../../sql/run/grant/extend_shared_lease.sql"),
        params: ACQUIRE_PARAMS,
    },
    take_over: Statement {
        sql: include_str!("../../sql/run/shared/take_over.sql"),
        params: ACQUIRE_PARAMS,
    },
    insert: Statement {
        sql: include_str!("../../sql/run/shared/insert_new.sql"),
        params: ACQUIRE_PARAMS,
    },
};

/// Before a shared lease or a permit: the dead exclusive lease of the lock id.
static CLEAR_DEAD_EXCLUSIVE: ClearDead = ClearDead {
    clear: Statement {
        sql: include_str!("../../sql/run/grant/clear_dead_exclusive.sql"),
        params: ACQUIRE_PARAMS,
    },
    left: Statement {
        sql: include_str!("../../sql/run/grant/left_exclusive.sql"),
        params: ACQUIRE_PARAMS,
    },
};
