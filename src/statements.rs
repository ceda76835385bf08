//! The SQL that lockext runs, prepared once per backend and kept.
//!
//! Each statement is a `static Statement`; its text is its identity in the cache (not its
//! address: the compiler may merge statics whose contents are equal). Values
//! always travel as parameters, never spliced into the text, and every name is
//! schema-qualified, so the statements mean the same whatever the caller's search_path.

use std::cell::RefCell;
use std::collections::HashMap;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{PgBuiltInOids, PgOid};
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult, SpiTupleTable};

pub struct Statement {
    pub sql: &'static str,
    pub params: &'static [PgBuiltInOids],
}

thread_local! {
    // A backend is single-threaded; a thread_local is its per-backend cache. Plans kept
    // with SPI_keepplan are revalidated by PostgreSQL when the objects they use change
    // (DROP/CREATE EXTENSION), so they are never stale.
    static PLANS: RefCell<HashMap<&'static str, OwnedPreparedStatement>> = RefCell::new(HashMap::new());
}

impl Statement {
    /// Runs the statement and returns its rows. May write: callers hold a mutable client.
    ///
    /// Executed through `select`, not `update`: pgrx's `update` first assigns the
    /// transaction an id, so that even a lock_acquire that only looked and refused would
    /// cost a transaction id and a commit record. The plans are prepared as mutating, so
    /// SPI still runs them read-write; an id is assigned only when a row is written.
    pub fn run<'conn>(
        &'static self,
        client: &mut SpiClient<'conn>,
        args: &[DatumWithOid<'_>],
    ) -> SpiResult<SpiTupleTable<'conn>> {
        let key = self.sql;
        PLANS.with(|plans| {
            let mut plans = plans.borrow_mut();
            if !plans.contains_key(&key) {
                let oids: Vec<PgOid> = self.params.iter().map(|&o| PgOid::BuiltIn(o)).collect();
                let plan = client.prepare_mut(self.sql, &oids)?.keep();
                plans.insert(key, plan);
            }
            client.select(&plans[&key], None, args)
        })
    }
}

/// The first column of the first row, or None when there is no row (or it is NULL).
pub fn first_value<T: pgrx::IntoDatum + pgrx::FromDatum>(
    rows: SpiTupleTable<'_>,
) -> SpiResult<Option<T>> {
    if rows.is_empty() {
        return Ok(None);
    }
    rows.first().get_one::<T>()
}
