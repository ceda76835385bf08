//! Fencing: the resource side of the bargain. A write carries the writer's token, and a
//! resource accepts it only if no higher token has written there before.

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::BuiltinOid::*;
use pgrx::prelude::*;

use crate::error::{self, LockError, OrReport};
use crate::statements::Statement;
use crate::token;

// Check and write are one statement: ON CONFLICT takes the resource's row lock, so two
// writers of one resource run one after the other, and the second sees the first's token.
// Equal tokens are accepted: that is the same grant writing again.
static WRITE: Statement = Statement {
    sql: "INSERT INTO lockext.resources AS r (resource_id, fence_token, data, updated_at) \
          VALUES ($1, $2, $3, clock_timestamp()) \
          ON CONFLICT (resource_id) DO UPDATE \
             SET fence_token = EXCLUDED.fence_token, data = EXCLUDED.data, \
                 updated_at = EXCLUDED.updated_at \
           WHERE r.fence_token <= EXCLUDED.fence_token \
          RETURNING true",
    params: &[TEXTOID, INT8OID, JSONBOID],
};

/// Stores `data` for `resource_id` if `fence_token` is not older than the newest token
/// accepted there; returns whether it was stored.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn fenced_update(
    resource_id: Option<&str>,
    fence_token: Option<i64>,
    data: Option<pgrx::JsonB>,
) -> bool {
    write(resource_id, fence_token, data).or_report()
}

pub fn write(
    resource_id: Option<&str>,
    fence_token: Option<i64>,
    data: Option<pgrx::JsonB>,
) -> Result<bool, LockError> {
    let resource_id = error::identifier("resource_id", resource_id)?;
    let fence_token = error::token("fence_token", fence_token)?;
    let data = data.ok_or(LockError::NullArgument { arg: "data" })?;
    error::writable_server()?;
    Spi::connect_mut(|client| {
        token::require_issued(client, fence_token)?;
        let args = [DatumWithOid::from(resource_id), fence_token.into(), data.into()];
        Ok(!WRITE.run(client, &args)?.is_empty())
    })
}
