//! Shared (read) leases: a shared lease coexists with other shared leases of its lock id,
//! and with no live exclusive lease (`exclusive.rs` checks the other way round); rows of
//! `lockext.shared_leases` (`many.rs`).

use super::many::{self, Look};
use super::{LeaseKind, Request, Taken};
use crate::claims;
use crate::error::LockError;
use crate::grant::{millis, Decision, Params, Seen, Store, ACQUIRE_PARAMS};
use crate::statements::Statement;
use crate::text::Text;

pub struct Shared;

// The look of a shared acquire: the exclusive lease, the caller's own row, and one live
// permit of someone else's, if any (sql/run/grant/look_shared.sql).
static LOOK_SHARED: Statement = Statement {
    sql: include_str!("../../sql/run/grant/look_shared.sql"),
    params: ACQUIRE_PARAMS,
};

impl LeaseKind for Shared {
    fn mode(&self) -> &'static str {
        "shared"
    }

    fn gate_mode(&self) -> claims::Mode {
        claims::Mode::Shared
    }

    fn pass_after_gate(&self, lock_id: Text<'_>) -> Result<bool, LockError> {
        claims::try_kind(lock_id, false)
    }

    fn many_holders(&self) -> bool {
        true
    }

    fn store(&self) -> &'static Store {
        &many::STORE
    }

    fn look(&self) -> &'static Statement {
        &LOOK_SHARED
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
        if look.permits.is_some() {
            return Err(LockError::WrongKind {
                lock_id: request.lock_id.to_string(),
                is: "a semaphore",
                asked: "a lock",
            });
        }
        if look.exclusive == Some(true) {
            return Ok(Decision::Refused(look.exclusive_free_in_ms.map(millis)));
        }
        Ok(Decision::Grant(look.plan(None)))
    }
}
