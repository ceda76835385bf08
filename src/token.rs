//! Fencing tokens: where they come from, and what makes them safe to hand out.
//!
//! A token is only worth anything if no later grant can ever get a lower or equal one.
//! Two rules keep that promise:
//! - a token is minted inside the statement that records the grant (see `mint_sql!`), so
//!   the grant and the sequence advance live and die with one transaction;
//! - that transaction commits synchronously. A sequence logs values ahead of use, so a
//!   token seen by a client before its WAL is flushed could be handed out again after a
//!   crash. `commit_grant_durably` overrides a session's `synchronous_commit = off` for the
//!   granting transaction only.

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::spi::SpiClient;

use crate::error::LockError;
use crate::statements::{first_value, Statement};

/// The SQL expression that mints one token, for lease statements to embed.
macro_rules! mint_sql {
    () => {
        "nextval('lockext.fence_token_seq'::regclass)"
    };
}
pub(crate) use mint_sql;

/// Makes the current transaction's commit wait for its WAL flush, as a grant needs.
///
/// `set_config(..., is_local => true)` semantics: it lasts until the transaction ends, so
/// it still holds at commit (a `SET` clause on the function would be undone before then).
/// Only `off` is raised: `local` and stronger already flush before the client hears back.
pub fn commit_grant_durably() {
    let current = unsafe { pg_sys::synchronous_commit };
    if current != pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_OFF as i32 {
        return;
    }
    unsafe {
        pg_sys::set_config_option(
            c"synchronous_commit".as_ptr(),
            c"on".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            0,
            false,
        );
    }
}

static HIGHEST_ISSUED: Statement = Statement {
    sql: "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM lockext.fence_token_seq",
    params: &[],
};

/// The highest token ever handed out in this database.
pub fn highest_issued(client: &mut SpiClient<'_>) -> Result<i64, LockError> {
    let args: [DatumWithOid<'_>; 0] = [];
    Ok(first_value::<i64>(HIGHEST_ISSUED.run(client, &args)?)?.unwrap_or(0))
}

/// Refuses a token that lockext never issued: a forged one would raise a resource's
/// high-water mark past every real holder and lock them all out.
pub fn require_issued(client: &mut SpiClient<'_>, token: i64) -> Result<(), LockError> {
    let highest = highest_issued(client)?;
    if token > highest {
        return Err(LockError::TokenNeverIssued { token, highest });
    }
    Ok(())
}
