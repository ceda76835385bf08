//! lockext on a Citus cluster: the node a call runs on, the shards it uses there, and what
//! keeps each lock id's tokens rising when its shard moves (docs/citus.md).
//!
//! `lockext.citus_distribute()` (sql/citus.sql) distributes the lease tables by lock id, in
//! one colocation group, and has Citus delegate each per-lock function to the node that
//! holds its lock id's shard. There the call is an ordinary lockext call, with two
//! differences, both made here:
//!
//! - **Where it runs.** `route` holds the shard's metadata lock (ShareLock) to the end of
//!   the transaction, then checks that the shard has a placement on this node. A shard move
//!   takes that lock in ExclusiveLock mode on every node before its last catch-up, so a
//!   call either ends before the move copies its last changes, or runs after it, on the
//!   node the move left the shard on. A call routed by a plan made before the move finds
//!   the shard gone and is refused (40001): the client calls again and Citus routes it
//!   anew. Never served from a copy left behind: the gate, the wait queue and the ledger
//!   it would use are another node's. The statements of the call then name this node's
//!   shards instead of the distributed tables (`statements::with_relations`): the same
//!   plans, on local relations, with no distributed query inside a delegated call.
//! - **Tokens.** Each node has its own ledger, so a lock id that moves to another node
//!   would otherwise get tokens from a ledger that may be lower. Each grant records its
//!   token as its lock id's highest (`lockext.lock_tokens`, colocated: it moves with the
//!   shard) in its own transaction, which commits flushed (Citus's shard move can lose
//!   an asynchronous commit acknowledged during its cut-over); before a grant, the node's
//!   ledger is raised past that highest (`ledger::raise_past`). So every token of a lock id
//!   is above every earlier one, wherever each was minted. Between lock ids there is no
//!   order: a resource fenced by the tokens of several locks cannot be kept on Citus.
//!
//! What does not run on a distributed installation is refused with 0A000 (`refuse`).

use pgrx::pg_sys::BuiltinOid::*;
use pgrx::prelude::*;

use crate::backend;
use crate::catalog;
use crate::commit;
use crate::error::LockError;
use crate::ledger;
use crate::statements::{self, Args, RelationsInForce, Statement};
use crate::text::Text;

static DISTRIBUTED: Statement = Statement {
    sql: include_str!("../sql/run/citus/distributed.sql"),
    params: &[],
};

static SHARDS: Statement = Statement {
    sql: include_str!("../sql/run/citus/shards.sql"),
    params: &[("lock_id", TEXTOID)],
};

static LOCK_SHARD: Statement = Statement {
    sql: include_str!("../sql/run/citus/lock_shard.sql"),
    params: &[("shard", INT8OID)],
};

static PLACEMENT_HERE: Statement = Statement {
    sql: include_str!("../sql/run/citus/placement_here.sql"),
    params: &[("shard", INT8OID)],
};

static HIGH: Statement = Statement {
    sql: include_str!("../sql/run/citus/high.sql"),
    params: &[("lock_id", TEXTOID)],
};

static RECORD_HIGH: Statement = Statement {
    sql: include_str!("../sql/run/citus/record_high.sql"),
    params: &[("lock_id", TEXTOID), ("fence_token", INT8OID)],
};

/// lockext's distributed tables, as its statements name them, in the order of the columns
/// of sql/run/citus/shards.sql.
const TABLES: [(&str, &str); 4] = [
    ("lockext.locks", "locks"),
    ("lockext.shared_leases", "shared_leases"),
    ("lockext.lease_values", "lease_values"),
    ("lockext.lock_tokens", "lock_tokens"),
];

static LOCAL_SHARDS: Statement = Statement {
    sql: include_str!("../sql/run/citus/local_shards.sql"),
    params: &[],
};

/// Runs `f` once with the statements on each shard this node holds (each group of
/// colocated shards, their metadata locked as `route` locks it), and returns what each run
/// gave; on a database whose tables are not distributed, once, as it is. The reaper's
/// round: a statement over a distributed table would be a query of every node's shards.
pub fn on_each_local_shard<T>(
    mut f: impl FnMut() -> Result<T, LockError>,
) -> Result<Vec<T>, LockError> {
    if !distributed()? {
        return Ok(vec![f()?]);
    }
    let groups = Spi::connect_mut(|client| {
        let rows = LOCAL_SHARDS.run(client, Args::new())?;
        let mut groups = Vec::with_capacity(rows.len());
        for row in rows {
            let shard = row.get_by_name::<i64, _>("shard")?.unwrap_or(0);
            let mut relations = Vec::with_capacity(TABLES.len());
            for (table, column) in TABLES {
                let Some(name) = row.get_by_name::<String, _>(column)? else {
                    return Err(LockError::MissingColumn { name: "shard name" });
                };
                relations.push((table, name));
            }
            groups.push((shard, relations));
        }
        for (shard, _) in &groups {
            LOCK_SHARD.run(client, Args::new().set("shard", *shard))?;
        }
        Ok::<_, LockError>(groups)
    })?;
    let mut out = Vec::with_capacity(groups.len());
    for (_, relations) in groups {
        let _in_force = statements::with_relations(relations);
        out.push(f()?);
    }
    Ok(out)
}

/// Whether `lockext.<table>` is one of the tables `citus_distribute` distributes.
pub fn is_distributed(table: &std::ffi::CStr) -> bool {
    let name = table.to_bytes();
    TABLES.iter().any(|(_, column)| column.as_bytes() == name)
}

/// Whether lockext's lease tables are distributed by Citus in this database.
pub fn distributed() -> Result<bool, LockError> {
    if !catalog::has_catalog_relation(c"pg_dist_partition") {
        return Ok(false);
    }
    Ok(Spi::connect_mut(|_| DISTRIBUTED.read_latest(Args::new()))
        .and_then(|row| row.get::<bool>("distributed"))
        .unwrap_or(false))
}

/// A call routed to this node: its statements name this node's shards of its lock id until
/// it is dropped.
pub struct Routed {
    _relations: RelationsInForce,
}

/// What a call is, for `route`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// It may mint a token: it must be a transaction of its own.
    Grants,
    /// It renews, releases or reads.
    Other,
}

/// Routes the call for `lock_id` to this node's shards (`Routed`), or refuses it; None on a
/// database whose lease tables are not distributed (every server without Citus), where
/// nothing changes. Every call that writes commits flushed (module header).
pub fn route(lock_id: Text<'_>, call: Call) -> Result<Option<Routed>, LockError> {
    if !distributed()? {
        return Ok(None);
    }
    if call == Call::Grants && backend::in_transaction_block() {
        // A token must reach a client only with its grant's commit: one that rolled back
        // after its token was read would leave that token out of the lock id's highest.
        return Err(LockError::CitusUnsupported {
            what: "lock_acquire must be called on its own, not inside a transaction block",
            hint: "Call it outside BEGIN ... COMMIT: Citus then runs it on the node of its \
                   lock id, and it commits before its token is answered.",
        });
    }
    let relations = Spi::connect_mut(|client| {
        let shards = SHARDS.run(client, Args::new().set("lock_id", lock_id))?;
        let row = shards.first();
        let shard = row.get_by_name::<i64, _>("shard")?.unwrap_or(0);
        let mut relations = Vec::with_capacity(TABLES.len());
        for (table, column) in TABLES {
            let Some(name) = row.get_by_name::<String, _>(column)? else {
                return Err(LockError::MissingColumn { name: "shard name" });
            };
            relations.push((table, name));
        }
        LOCK_SHARD.run(client, Args::new().set("shard", shard))?;
        let placement = PLACEMENT_HERE.read_latest(Args::new().set("shard", shard));
        let here = placement.as_ref().and_then(|row| row.get::<bool>("here"));
        let coordinator = placement.and_then(|row| row.get::<bool>("coordinator"));
        if here != Some(true) {
            // On the coordinator (which holds no shard) or inside a transaction block,
            // Citus did not delegate the call, and would not if it were called again.
            if backend::in_transaction_block() || coordinator == Some(true) {
                return Err(LockError::CitusUnsupported {
                    what: "lockext's functions run on the node of their lock id",
                    hint: "Call the function alone (SELECT lockext.lock_acquire(...), not in \
                           a CTE, a subquery or a transaction block), so that Citus \
                           delegates it to that node.",
                });
            }
            return Err(LockError::CitusOtherNode {
                lock_id: lock_id.to_string(),
                shard,
            });
        }
        Ok(relations)
    })?;
    commit::require_flush();
    Ok(Some(Routed {
        _relations: statements::with_relations(relations),
    }))
}

/// Before a grant of a routed call: raises this node's ledger past the highest token its
/// lock id ever had, wherever that was minted.
pub fn before_grant(lock_id: Text<'_>) -> Result<(), LockError> {
    let high = Spi::connect_mut(|_| HIGH.read_latest(Args::new().set("lock_id", lock_id)))
        .and_then(|row| row.get::<i64>("high"));
    if let Some(high) = high {
        ledger::raise_past(high)?;
    }
    Ok(())
}

/// After a grant of a routed call, in its transaction: its token is its lock id's highest.
pub fn after_grant(lock_id: Text<'_>, token: i64) -> Result<(), LockError> {
    Spi::connect_mut(|client| {
        RECORD_HIGH
            .run(
                client,
                Args::new()
                    .set("lock_id", lock_id)
                    .set("fence_token", token),
            )
            .map(|_| ())
    })?;
    Ok(())
}

/// The hint of every function refused on a distributed installation.
pub const ONLY_LEASES: &str = "On a Citus cluster lockext serves lock_acquire, lock_renew and \
    lock_release, each delegated to the node of its lock id; fence a resource by its lock's \
    tokens where it is written (docs/citus.md).";

/// Refuses `what` on a database whose lease tables are distributed, with `hint`.
pub fn refuse(what: &'static str, hint: &'static str) -> Result<(), LockError> {
    if distributed()? {
        return Err(LockError::CitusUnsupported { what, hint });
    }
    Ok(())
}
