//! Which installations' evidence this server has adopted (`token.rs`), kept in shared
//! memory, so that a backend's first grant need not read every lease to know it.
//!
//! Adopting reads the highest token of each of lockext's tables: a sequential scan, 70 ms
//! with a million leases. Every backend used to do it before its first grant, so 64 fresh
//! connections spent seconds of CPU, and a client that connects per request paid it on
//! every request. A backend now first asks this table whether the installation's evidence
//! was adopted since anything could have changed it.
//!
//! **What can change the evidence.** Rows of lockext's tables are written by lockext's own
//! statements, whose tokens the ledger issued (minted, or refused when above the highest
//! issued; on a Citus cluster a fenced write's token is a live grant's, already in the
//! tables), so they never raise the evidence above what the ledger and the tables had;
//! and otherwise by a restore, a hand-made `INSERT`, `UPDATE` or `COPY`, a logical
//! replication worker, or something a superuser added to lockext's tables (a trigger, a
//! rule, a policy's function, a table inheriting from one or that one inherits from, a
//! relation put in place of one). Each database has a **generation**, raised when a
//! transaction that can have changed the evidence commits or prepares:
//! - one that wrote a relation of schema `lockext` by a statement other than lockext's own
//!   (the executor's permission hook sees every statement's plan start and every `COPY
//!   FROM`, whoever runs them, `pgversion::on_statement_checked`; a trigger's or a rule's
//!   statement inside one of lockext's is checked apart from it, `statements.rs`);
//! - one that made, changed or dropped any definition in the database (DDL: a table, an
//!   index, a trigger, a rule, a policy, statistics, a function, an inheritance link, an
//!   extension's members; which object is not known at that point, so any);
//! - every one of a logical replication worker in that database;
//! - `CREATE DATABASE`, for the new database (its oid may be a dropped one's).
//!
//! **Why an entry is never stale.** An entry says: the installation (database, oid of its
//! `lockext.token_epoch`) was adopted from evidence read under snapshots taken after its
//! generation was read as `g`, when no transaction of that database was between its
//! `Ending` and its raise (`in_flight`). It is used only while the generation is still `g`
//! and nothing is in flight.
//! - A writer is counted in flight from before its commit record to its raise, which comes
//!   after its commit is visible to new snapshots (`backend::on_transaction_end`). So a
//!   commit visible when a backend looks is either raised already (the entry, made from a
//!   generation read before the raise, is unusable; one made after, from snapshots that see
//!   the commit) or still in flight (no entry is used or made).
//! - A prepared writer raises it when it prepares; an entry is made only when no prepared
//!   transaction exists (asked after the generation is read), and `COMMIT PREPARED` makes
//!   its transaction visible before it leaves the list of prepared ones. A transaction
//!   prepared before a restart is in that list too.
//! - An entry is not made by a transaction that has written anything (its own uncommitted
//!   changes, which a rollback takes back without a raise, are in what it read).
//! - An entry is not made unless schema lockext is **as the extension made it**
//!   (`sql/run/token/shareable.sql`, asked after the generation is read): every relation
//!   in it the extension's (not a view or a `CREATE TABLE AS` put in place of an evidence
//!   table), neither they nor anything on them depending on an object neither built in nor
//!   the extension's (a function, an operator, a type: a BEFORE trigger changes the row
//!   lockext's statement writes, with no statement of its own; an index or statistics
//!   expression, or an operator a policy uses, runs while lockext's statement is planned,
//!   before its permission check), no rule but a view's, no row-level security, no
//!   inheritance link. Whatever changes that afterwards is DDL, which raises the
//!   generation: the entry is not used again, and the next one is made only once the check
//!   passes again. The check trusts the extension's membership: a function a superuser
//!   adds to the extension is lockext's.
//! - The table lives in shared memory: a restart (or a crash, which resets shared memory)
//!   empties it, and a server made by `pg_upgrade`, restored from a backup, or promoted
//!   (a standby adopts nothing) starts with nothing to trust.
//!
//! What this table does not see: a superuser who writes lockext's tables below SQL (a tool
//! that writes heap pages itself, as `pg_bulkload` does) is in the class of editing the
//! ledger's file (docs/tokens.md).

use pgrx::pg_sys;

use crate::backend::{self, TransactionEnd};
use crate::catalog;
use crate::pgversion;
use crate::shmem::{self, Table};
use crate::statements;

use std::cell::RefCell;

/// Generations, one per database oid modulo this: two databases that share one only make
/// each other's entries unusable more often.
const GENERATIONS: usize = 64;
/// Installations remembered at once; past that the oldest entry is reused (its backends
/// read the evidence again).
const ENTRIES: usize = 128;

#[derive(Clone, Copy)]
struct Board {
    generations: [u64; GENERATIONS],
    /// Transactions between their `Ending` and their raise, by generation.
    in_flight: [u32; GENERATIONS],
    /// Where the next new entry goes (modulo `ENTRIES`).
    next: u64,
}

#[derive(Clone, Copy)]
struct Entry {
    database: u32,
    epoch_table: u32,
    generation: u64,
}

shmem::plain!(Board {
    generations,
    in_flight,
    next
});
shmem::plain!(Entry {
    database,
    epoch_table,
    generation,
});

static ADOPTED: Table<Board, Entry> = Table::new(
    c"lockext_adopted",
    || ENTRIES,
    |_| Board {
        generations: [0; GENERATIONS],
        in_flight: [0; GENERATIONS],
        next: 0,
    },
    Entry {
        database: 0,
        epoch_table: 0,
        generation: 0,
    },
    (),
);

/// Asks for the table and puts the hooks that raise generations in place. At preload.
pub fn init_shared_memory() {
    ADOPTED.request();
    pgversion::on_statement_checked(statement_checked);
    backend::on_definitions_changed(|| changed(backend::database()));
    backend::on_database_created(changed);
    backend::on_transaction_end(transaction_ended);
}

/// A database's generation as read, before its evidence is: what `remember` is given.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Generation(u64);

/// What the server knows of an installation's evidence.
pub enum Known {
    /// Adopted since it last changed: nothing to read.
    Adopted,
    /// Not known: read the evidence (under snapshots taken from now on), adopt it, and
    /// `remember` it with this generation. None: a change is in flight, remember nothing.
    Unknown(Option<Generation>),
}

fn slot(database: pg_sys::Oid) -> usize {
    database.to_u32() as usize % GENERATIONS
}

/// Whether `epoch_table`'s installation in `database` was adopted since its evidence last
/// changed. Without shared memory (not preloaded), never.
pub fn known(database: pg_sys::Oid, epoch_table: pg_sys::Oid) -> Known {
    let Some(table) = ADOPTED.read() else {
        return Known::Unknown(None);
    };
    let board = table.header();
    if board.in_flight[slot(database)] > 0 {
        return Known::Unknown(None);
    }
    let generation = board.generations[slot(database)];
    let adopted = table.rows().iter().any(|entry| {
        entry.database == database.to_u32()
            && entry.epoch_table == epoch_table.to_u32()
            && entry.generation == generation
    });
    if adopted {
        Known::Adopted
    } else {
        Known::Unknown(Some(Generation(generation)))
    }
}

/// Records that the installation's evidence, read after its generation was `generation`,
/// is adopted. Call only once the ledger is above it, and only if, asked after `known`, no
/// transaction was prepared, no lease table had an inheritance link, and this transaction
/// had written nothing.
pub fn remember(database: pg_sys::Oid, epoch_table: pg_sys::Oid, generation: Generation) {
    let Some(mut table) = ADOPTED.write() else {
        return;
    };
    let (board, entries, _) = table.parts();
    let at_slot = slot(database);
    if board.generations[at_slot] != generation.0 || board.in_flight[at_slot] > 0 {
        return; // changed (or changing) since it was read: the entry could never be used
    }
    let entry = Entry {
        database: database.to_u32(),
        epoch_table: epoch_table.to_u32(),
        generation: generation.0,
    };
    let at = match entries
        .iter()
        .position(|e| e.database == entry.database && e.epoch_table == entry.epoch_table)
    {
        Some(at) => at,
        None => {
            let at = (board.next % ENTRIES as u64) as usize;
            board.next = board.next.wrapping_add(1);
            at
        }
    };
    entries[at] = entry;
}

thread_local! {
    // The databases whose generation this backend's transaction raises when it commits or
    // prepares (the backend's own, when it wrote lockext's tables other than by lockext's
    // statements or altered a relation; a database it created).
    static CHANGED: RefCell<Vec<pg_sys::Oid>> = const { RefCell::new(Vec::new()) };
    // Those counted in flight by this transaction's `Ending`.
    static IN_FLIGHT: RefCell<Vec<pg_sys::Oid>> = const { RefCell::new(Vec::new()) };
}

fn changed(database: pg_sys::Oid) {
    CHANGED.with_borrow_mut(|changed| {
        if !changed.contains(&database) {
            changed.push(database);
        }
    });
}

/// The executor's permission hook: a statement is about to run, writing `written`.
fn statement_checked(written: &[pg_sys::Oid]) {
    // Asked of every statement, so that a lockext statement's own check is taken as its
    // own, and nothing else is.
    if statements::own_statement_checked() || written.is_empty() {
        return;
    }
    let lockext = catalog::lockext_schema();
    if lockext != pg_sys::InvalidOid
        && written
            .iter()
            .any(|&relation| catalog::relation_namespace(relation) == lockext)
    {
        changed(backend::database());
    }
}

fn transaction_ended(end: TransactionEnd) {
    match end {
        TransactionEnd::Ending => {
            statements::no_statement_starting();
            if backend::is_logical_replication_worker() {
                changed(backend::database());
            }
            let databases = CHANGED.with_borrow(|changed| changed.clone());
            if databases.is_empty() {
                return;
            }
            if let Some(mut table) = ADOPTED.write() {
                let board = table.header();
                for &database in &databases {
                    board.in_flight[slot(database)] += 1;
                }
                IN_FLIGHT.with_borrow_mut(|in_flight| *in_flight = databases);
            }
        }
        TransactionEnd::Commit | TransactionEnd::Prepare | TransactionEnd::Abort => {
            statements::no_statement_starting();
            let changed = CHANGED.with_borrow_mut(std::mem::take);
            let in_flight = IN_FLIGHT.with_borrow_mut(std::mem::take);
            if changed.is_empty() && in_flight.is_empty() {
                return;
            }
            if let Some(mut table) = ADOPTED.write() {
                let board = table.header();
                if end != TransactionEnd::Abort {
                    for &database in &changed {
                        let generation = &mut board.generations[slot(database)];
                        *generation = generation.wrapping_add(1);
                    }
                }
                for &database in &in_flight {
                    let count = &mut board.in_flight[slot(database)];
                    *count = count.saturating_sub(1);
                }
            }
        }
    }
}
