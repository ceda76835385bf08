//! lockext on a Citus cluster: the node a call runs on, the shards it uses there, and what
//! keeps each lock id's tokens rising when its shard moves (docs/citus.md).
//!
//! `lockext.citus_distribute()` (sql/citus.sql) distributes the lease tables by lock id, and
//! `lockext.resources` by resource id, in one colocation group, and has Citus delegate each
//! per-lock function to the node that holds its lock id's shard. There the call is an
//! ordinary lockext call, with two differences, both made here:
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
//!   plans, on local relations, with no distributed query inside a delegated call. A call
//!   that waits (`lock_observe`, `lock_acquire` with `wait`) routes each look or try anew
//!   (`route_look`) in a subtransaction that lets go of the lock unless the try grants.
//! - **Tokens.** Each node has its own ledger, so a lock id that moves to another node
//!   would otherwise get tokens from a ledger that may be lower. Each grant records its
//!   token as its lock id's highest (`lockext.lock_tokens`, colocated: it moves with the
//!   shard) in its own transaction, which commits flushed (Citus's shard move can lose
//!   an asynchronous commit acknowledged during its cut-over); before a grant, the node's
//!   ledger is raised past that highest (`ledger::raise_past`). So every token of a lock id
//!   is above every earlier one, wherever each was minted. Between lock ids there is no
//!   order: a resource is fenced only by the lock of its own id, whose rows are in its
//!   shard (`require_own_lock`).
//!
//! What does not run on a distributed installation is refused with 0A000 (`refuse`).

use std::collections::HashMap;

use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::backend;
use crate::catalog;
use crate::commit;
use crate::error::{self, LockError};
use crate::ledger;
use crate::statements::{self, first_named, Args, LatestRow, RelationsInForce, Statement};
use crate::text::Text;

static DISTRIBUTED: Statement = Statement {
    sql: include_str!("../sql/run/citus/distributed.sql"),
    params: &[],
};

static SHARDS: Statement = Statement {
    sql: include_str!("../sql/run/citus/shards.sql"),
    params: &[("lock_id", TEXTOID)],
};

static COLOCATED_SHARDS: Statement = Statement {
    sql: include_str!("../sql/run/citus/colocated.sql"),
    params: &[("shard", INT8OID)],
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

static FLOOR_ROW: Statement = Statement {
    sql: include_str!("../sql/run/citus/floor.sql"),
    params: &[],
};

static RECORD_HIGH: Statement = Statement {
    sql: include_str!("../sql/run/citus/record_high.sql"),
    params: &[("lock_id", TEXTOID), ("fence_token", INT8OID)],
};

/// lockext's distributed tables, as its statements name them, with the column of
/// colocated.sql that names each one's shard.
const TABLES: [(&str, &str); 6] = [
    ("lockext.locks", "locks"),
    ("lockext.shared_leases", "shared_leases"),
    ("lockext.lease_values", "lease_values"),
    ("lockext.lock_tokens", "lock_tokens"),
    ("lockext.resources", "resources"),
    ("lockext.token_floor", "token_floor"),
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
    if !distributed_for(Access::Write)? {
        return Ok(vec![f()?]);
    }
    let groups = Spi::connect_mut(|client| {
        let mut shards = Vec::new();
        for row in LOCAL_SHARDS.run(client, Args::new())? {
            shards.push(row.get_by_name::<i64, _>("shard")?.unwrap_or(0));
        }
        let mut groups = Vec::with_capacity(shards.len());
        for shard in shards {
            groups.push((shard, colocated(client, shard)?));
        }
        for (shard, _) in &groups {
            LOCK_SHARD.run(client, Args::new().set("shard", *shard))?;
        }
        // A shard that moved away before its lock was held is left to its new node: its
        // copy here is what the move left behind, and may be dropped at any moment.
        groups.retain(|(shard, _)| {
            PLACEMENT_HERE
                .read_latest(Args::new().set("shard", *shard))
                .and_then(|row| row.get::<bool>("here"))
                .unwrap_or(false)
        });
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

thread_local! {
    // The lockext.locks this backend has found distributed (its oid): it stays so
    // (undistributing it would make the shard lookup fail, an error, not a call run on the
    // wrong tables). A new installation (DROP and CREATE EXTENSION) has a new oid, and
    // is looked at again. A "no" is never kept: citus_distribute can run at any time.
    static DISTRIBUTED_SEEN: std::cell::Cell<Option<pg_sys::Oid>> = const { std::cell::Cell::new(None) };
}

/// Whether lockext's lease tables are distributed by Citus in this database.
pub fn distributed() -> Result<bool, LockError> {
    distributed_for(Access::Read)
}

/// What a call does to lockext's tables, for `distributed_for` and `route`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// `distributed`, for a call that will `access` the tables. A writer on a database with
/// Citus whose tables were not distributed when this backend last looked first holds
/// lockext.locks in ROW EXCLUSIVE mode (what its statements take a moment later anyway) to
/// the end of its transaction, which the EXCLUSIVE lock of create_distributed_table
/// conflicts with: otherwise a writer that saw "no" while citus_distribute ran would run
/// its statements, planned anew, on the table just distributed, as distributed queries (a
/// coordinator's reaper round failed so in the tests). A reader takes nothing more than its
/// statements' ACCESS SHARE: its read, whichever table it meets, changes nothing. (On a
/// worker the hold guards nothing: citus_distribute does not lock the workers' own tables,
/// docs/citus.md.) A standby takes no such lock, and distributes nothing.
pub fn distributed_for(access: Access) -> Result<bool, LockError> {
    let locks = catalog::lockext_relation(c"locks");
    if locks.is_some() && DISTRIBUTED_SEEN.with(|d| d.get()) == locks {
        return Ok(true);
    }
    if !catalog::has_catalog_relation(c"pg_dist_partition") {
        return Ok(false);
    }
    if let (Some(locks), Access::Write) = (locks, access) {
        if !backend::in_recovery() {
            catalog::hold_as_writer(locks);
        }
    }
    let distributed = Spi::connect_mut(|_| DISTRIBUTED.read_latest(Args::new()))
        .and_then(|row| row.get::<bool>("distributed"))
        .unwrap_or(false);
    if distributed {
        DISTRIBUTED_SEEN.with(|d| d.set(locks));
    }
    Ok(distributed)
}

/// A call routed to this node: its statements name this node's shards of its lock id until
/// it is dropped.
pub struct Routed {
    _relations: RelationsInForce,
}

/// Routes the call for `lock_id` to this node's shards (`Routed`), or refuses it; None on a
/// database whose lease tables are not distributed (every server without Citus), where
/// nothing changes. Every call commits flushed, a renewal and a release too: Citus's shard
/// move loses asynchronous commits acknowledged during its cut-over, and moves are routine,
/// not crashes (a release lost there let its owner's next acquire get the same grant back,
/// after it had heard "released").
pub fn route(lock_id: Text<'_>, access: Access) -> Result<Option<Routed>, LockError> {
    refuse_in_transaction_block()?;
    route_look(lock_id, access)
}

/// `route` for the call's argument `arg` (a lock id, or a resource id: the shard of the lock
/// of its own id), checked first, so that bad input gets its own SQLSTATE on any node.
pub fn route_arg(
    arg: &'static str,
    id: Option<Text<'_>>,
    access: Access,
) -> Result<Option<Routed>, LockError> {
    route(error::identifier(arg, id)?, access)
}

/// Refuses a call inside a transaction block on a distributed installation (why: below).
pub fn refuse_in_transaction_block() -> Result<(), LockError> {
    if distributed()? && backend::in_transaction_block() {
        // A token must reach a client only with its grant's commit: one that rolled back
        // after its token was read would leave that token out of the lock id's highest.
        // And no call may hold its shard's metadata lock for longer than itself: a
        // transaction left open would hold up every move of the shard, and every call to
        // the shard queued behind the move.
        return Err(LockError::CitusUnsupported {
            what: "lockext's lease functions must be called on their own, not inside a \
                   transaction block",
            hint: "Call it outside BEGIN ... COMMIT: Citus then runs it on the node of its \
                   lock id, where it commits at once.",
        });
    }
    Ok(())
}

/// As `route`, for one look of a call that waits (lock_observe), which
/// `refuse_in_transaction_block` let through: each look runs in a subtransaction that is
/// rolled back (and so is seen as a transaction block), which releases the shard's
/// metadata lock, so that a waiting call holds up no move of its shard for longer than a
/// look.
pub fn route_look(lock_id: Text<'_>, access: Access) -> Result<Option<Routed>, LockError> {
    if !distributed_for(access)? {
        return Ok(None);
    }
    let relations = Spi::connect_mut(|client| {
        let shard = first_named::<i64>(
            SHARDS.run(client, Args::new().set("lock_id", lock_id))?,
            "shard",
        )?
        .unwrap_or(0);
        let relations = colocated(client, shard)?;
        let placement = || PLACEMENT_HERE.read_latest(Args::new().set("shard", shard));
        let before = placement();
        LOCK_SHARD.run(client, Args::new().set("shard", shard))?;
        let after = placement();
        let here = |row: &Option<LatestRow>| {
            row.as_ref().and_then(|r| r.get::<bool>("here")) == Some(true)
        };
        if !here(&after) {
            // The shard moved away under this call (it was here until its lock was
            // held), or the call came over a connection of Citus's own (delegated by a
            // plan made before a move): called again, it is routed to the shard's node.
            // Otherwise Citus did not delegate it (on the coordinator, or a CTE or a
            // subquery on a worker), and would not if it were called again.
            let internal = after.as_ref().and_then(|r| r.get::<bool>("internal")) == Some(true);
            if !(here(&before) || internal || served_here(shard)) {
                return Err(LockError::CitusUnsupported {
                    what: "lockext's functions run on the node of their lock id",
                    hint: "Call the function alone (SELECT lockext.lock_acquire(...), not in \
                           a CTE or a subquery), so that Citus delegates it to that node.",
                });
            }
            return Err(LockError::CitusOtherNode {
                lock_id: lock_id.to_string(),
                shard,
            });
        }
        SERVED.with(|s| s.set(Some((backend::local_transaction(), shard))));
        Ok(relations)
    })?;
    commit::require_flush();
    Ok(Some(Routed {
        _relations: statements::with_relations(relations),
    }))
}

thread_local! {
    // The shard the current transaction last found on this node (by local transaction id):
    // a call that waits (an observer's look, a waiting acquire's try) and finds it gone at a
    // later look was routed here, whichever way it came, and is told to call again (40001),
    // not that Citus did not delegate it.
    static SERVED: std::cell::Cell<Option<(pg_sys::LocalTransactionId, i64)>> =
        const { std::cell::Cell::new(None) };
}

/// Whether the current transaction found `shard` on this node before (`SERVED`).
fn served_here(shard: i64) -> bool {
    SERVED.with(|s| s.get()) == Some((backend::local_transaction(), shard))
}

thread_local! {
    // Each shard of lockext.locks this backend has routed a call to, with its colocated
    // shards' names (colocated.sql): a shard keeps its id and name through moves, and an id
    // is never used again.
    static COLOCATED: std::cell::RefCell<HashMap<i64, Vec<(&'static str, String)>>> =
        std::cell::RefCell::new(HashMap::new());
}

/// The relations of shard `shard` of lockext.locks and of its colocated shards, as
/// `statements::with_relations` takes them.
fn colocated(
    client: &mut SpiClient<'_>,
    shard: i64,
) -> Result<Vec<(&'static str, String)>, LockError> {
    if let Some(known) = COLOCATED.with(|c| c.borrow().get(&shard).cloned()) {
        return Ok(known);
    }
    let rows = COLOCATED_SHARDS.run(client, Args::new().set("shard", shard))?;
    if rows.is_empty() {
        return Err(LockError::MissingColumn { name: "shard" });
    }
    let row = rows.first();
    let mut relations = Vec::with_capacity(TABLES.len());
    for (table, column) in TABLES {
        let Some(name) = row.get_by_name::<String, _>(column)? else {
            return Err(LockError::MissingColumn { name: "shard name" });
        };
        relations.push((table, name));
    }
    COLOCATED.with(|c| c.borrow_mut().insert(shard, relations.clone()));
    Ok(relations)
}

/// Before a grant of a routed call: raises this node's ledger past the highest token its
/// lock id ever had, wherever that was minted, and past the floor (the tokens handed out
/// before the tables were distributed). The floor is read at every grant (one row of a local
/// table): a value kept would outlive a DROP and CREATE EXTENSION and a new distribution.
pub fn before_grant(lock_id: Text<'_>) -> Result<(), LockError> {
    let (floor, high) = Spi::connect_mut(|_| {
        (
            FLOOR_ROW
                .read_latest(Args::new())
                .and_then(|row| row.get::<i64>("floor")),
            HIGH.read_latest(Args::new().set("lock_id", lock_id))
                .and_then(|row| row.get::<i64>("high")),
        )
    });
    let floor = floor.ok_or(LockError::CitusNotReady)?;
    let past = high.unwrap_or(0).max(floor);
    if past > 0 {
        ledger::raise_past(past)?;
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

/// On a Citus cluster a resource is fenced only by the lock of its own id: that lock's
/// rows are in the resource's shard (both tables are distributed by the id, colocated), so
/// a fenced call routed by the resource id checks the lock's grant on this node, and the
/// lock's tokens are the only ones ordered there (between lock ids there is no order).
/// Refuses a resource `bound` to no lock, or to another.
pub fn require_own_lock(resource_id: Text<'_>, bound: Option<Text<'_>>) -> Result<(), LockError> {
    if bound.map(Text::bytes) == Some(resource_id.bytes()) {
        return Ok(());
    }
    Err(LockError::CitusUnsupported {
        what: "a resource is fenced only once it is bound to the lock of its own id",
        hint:
            "As lockext_admin: SELECT lockext.bind_resource('acct:42', 'acct:42'); then write it \
               with that lock's grants. Tokens are ordered per lock id only (docs/citus.md).",
    })
}

/// The hint of the keep-alive functions, refused on a distributed installation.
pub const RENEW_EACH: &str = "Renew each lease with lockext.lock_renew, which Citus runs on the \
    node of its lock id (docs/citus.md).";

/// The hint of the functions that fence in the caller's own transaction.
pub const FENCE_ALONE: &str =
    "On a Citus cluster a fenced write is one call: lockext.fenced_update \
    on a resource bound to the lock of its own id, or your own table's row checked in the \
    statement that writes it (UPDATE ... WHERE key = lock id AND token <= $token), on a table \
    distributed by the lock id (docs/citus.md).";

/// Refuses `what` on a database whose lease tables are distributed, with `hint`.
pub fn refuse(what: &'static str, hint: &'static str) -> Result<(), LockError> {
    if distributed()? {
        return Err(LockError::CitusUnsupported { what, hint });
    }
    Ok(())
}
