//! The SQL that lockext runs, prepared once per backend and kept.
//!
//! Each statement is a `static Statement` whose text is a file of `sql/run/` (one per
//! statement, `include_str!`-ed by the module that runs it; sql/run/README.md). Its text,
//! comments included, is its identity in the cache (not its address: the compiler may
//! merge statics whose contents are equal). Values always travel as parameters, never
//! spliced into the text, and every table is schema-qualified. Functions and operators are
//! not (`count`, `=`): every path that runs these statements pins search_path to
//! `pg_catalog, pg_temp` first (lockext's SQL functions by their SET clause, the reaper and
//! launcher in `reaper.rs`, the exit hook in `session.rs`), so no caller's or database's
//! search_path can bend them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;
use std::rc::Rc;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, PgBuiltInOids, PgOid};
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult, SpiTupleTable};
use pgrx::FromDatum;

use crate::explore;

pub struct Statement {
    pub sql: &'static str,
    pub params: &'static [PgBuiltInOids],
}

thread_local! {
    // A backend is single-threaded; a thread_local is its per-backend cache. Plans kept
    // with SPI_keepplan are revalidated by PostgreSQL when the objects they use change
    // (DROP/CREATE EXTENSION), so they are never stale. Each is kept for the backend's
    // life (leaked): the cache is not borrowed while a statement runs, since a statement
    // may call into lockext, which runs statements of its own (lockext.grant_token).
    static PLANS: RefCell<HashMap<&'static str, &'static OwnedPreparedStatement>> = RefCell::new(HashMap::new());
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
        let kept = PLANS.with(|plans| plans.borrow().get(key).copied());
        let plan = match kept {
            Some(plan) => plan,
            None => {
                let oids: Vec<PgOid> = self.params.iter().map(|&o| PgOid::BuiltIn(o)).collect();
                let plan: &'static OwnedPreparedStatement =
                    Box::leak(Box::new(client.prepare_mut(self.sql, &oids)?.keep()));
                PLANS.with(|plans| plans.borrow_mut().insert(key, plan));
                plan
            }
        };
        explore::point(|| format!("before {}", explore::statement_name(self.sql)));
        let rows = client.select(plan, None, args);
        explore::point(|| format!("after {}", explore::statement_name(self.sql)));
        rows
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

thread_local! {
    // Plans for `read_latest`, which pgrx cannot run with a snapshot of our choosing.
    static RAW_PLANS: RefCell<HashMap<&'static str, usize>> = RefCell::new(HashMap::new());
}

/// One row read by `read_latest`: its columns by name, NULL as None. By-value types only
/// (bool, integers): a by-reference datum would point into memory that SPI frees.
pub struct LatestRow {
    names: Rc<[String]>,
    values: Vec<Option<pg_sys::Datum>>,
}

impl LatestRow {
    pub fn get<T: FromDatum>(&self, column: &str) -> Option<T> {
        let at = self.names.iter().position(|name| name == column)?;
        let datum = (*self.values.get(at)?)?;
        unsafe { T::from_polymorphic_datum(datum, false, pg_sys::InvalidOid) }
    }
}

impl Statement {
    /// Runs a read-only statement under the newest snapshot, not the statement's or the
    /// transaction's, and returns its first row. A conflict check must see every lease
    /// committed before it took its claim (`claims.rs`), even in a REPEATABLE READ
    /// transaction whose snapshot is older; foreign-key checks read the same way. Needs a
    /// connected SPI (inside `Spi::connect_mut`).
    pub fn read_latest(&'static self, args: &[DatumWithOid<'_>]) -> Option<LatestRow> {
        self.read_latest_rows(args, 1).into_iter().next()
    }

    /// As `read_latest`, every row.
    pub fn read_latest_all(&'static self, args: &[DatumWithOid<'_>]) -> Vec<LatestRow> {
        self.read_latest_rows(args, 0)
    }

    fn read_latest_rows(&'static self, args: &[DatumWithOid<'_>], limit: i64) -> Vec<LatestRow> {
        self.read_rows(args, limit, unsafe { pg_sys::GetLatestSnapshot() })
    }

    /// Under `snapshot`, or with none (null) under the active one.
    fn read_rows(
        &'static self,
        args: &[DatumWithOid<'_>],
        limit: i64,
        snapshot: pg_sys::Snapshot,
    ) -> Vec<LatestRow> {
        let plan = RAW_PLANS.with(|plans| {
            *plans.borrow_mut().entry(self.sql).or_insert_with(|| {
                let sql = CString::new(self.sql).expect("statement text has no NUL");
                let mut oids: Vec<pg_sys::Oid> = self
                    .params
                    .iter()
                    .map(|&o| pg_sys::Oid::from(o as u32))
                    .collect();
                unsafe {
                    let plan =
                        pg_sys::SPI_prepare(sql.as_ptr(), oids.len() as i32, oids.as_mut_ptr());
                    if plan.is_null() {
                        pgrx::error!("lockext: cannot prepare {}", self.sql);
                    }
                    pg_sys::SPI_keepplan(plan);
                    plan as usize
                }
            })
        }) as pg_sys::SPIPlanPtr;
        let (mut values, nulls): (Vec<pg_sys::Datum>, Vec<std::os::raw::c_char>) = args
            .iter()
            .map(|a| match a.datum() {
                Some(d) => (d.sans_lifetime(), b' ' as std::os::raw::c_char),
                None => (pg_sys::Datum::from(0usize), b'n' as std::os::raw::c_char),
            })
            .unzip();
        explore::point(|| format!("before {}", explore::statement_name(self.sql)));
        let rows = self.execute_raw(plan, &mut values, &nulls, limit, snapshot);
        explore::point(|| format!("after {}", explore::statement_name(self.sql)));
        rows
    }

    fn execute_raw(
        &'static self,
        plan: pg_sys::SPIPlanPtr,
        values: &mut [pg_sys::Datum],
        nulls: &[std::os::raw::c_char],
        limit: i64,
        snapshot: pg_sys::Snapshot,
    ) -> Vec<LatestRow> {
        unsafe {
            let status = pg_sys::SPI_execute_snapshot(
                plan,
                values.as_mut_ptr(),
                nulls.as_ptr(),
                snapshot,
                std::ptr::null_mut(),
                true,
                false,
                limit,
            );
            let table = pg_sys::SPI_tuptable;
            if status != pg_sys::SPI_OK_SELECT as i32 || table.is_null() {
                return Vec::new();
            }
            let desc = (*table).tupdesc;
            let names: Rc<[String]> = (1..=(*desc).natts)
                .map(|i| {
                    let name = pg_sys::SPI_fname(desc, i);
                    std::ffi::CStr::from_ptr(name)
                        .to_string_lossy()
                        .into_owned()
                })
                .collect();
            (0..pg_sys::SPI_processed as usize)
                .map(|r| {
                    let tuple = *(*table).vals.add(r);
                    let row = (1..=(*desc).natts)
                        .map(|i| {
                            let mut is_null = false;
                            let d = pg_sys::SPI_getbinval(tuple, desc, i, &mut is_null);
                            (!is_null).then_some(d)
                        })
                        .collect();
                    LatestRow {
                        names: names.clone(),
                        values: row,
                    }
                })
                .collect()
        }
    }
}
