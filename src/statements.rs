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

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CString;
use std::rc::Rc;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, PgBuiltInOids, PgOid};
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult, SpiTupleTable};
use pgrx::FromDatum;

use crate::explore;
use crate::text::Jsonb;

/// A statement lockext runs, the one kind there is: its text (a file of `sql/run/`) and
/// its parameters by name. `params` names each `$N`, in order, with its type, as the
/// file's header names it (`-- $1 limit (...), $2 now (...)`; a mismatch is refused when
/// the statement is first prepared). Callers give `Args` by name and read the columns by
/// name (`first_named`, `get_by_name`, `LatestRow::get`), never by position.
pub struct Statement {
    pub sql: &'static str,
    pub params: &'static [(&'static str, PgBuiltInOids)],
}

/// The most parameters a statement takes (the acquire's eleven, and room).
const MAX_PARAMS: usize = 16;

/// The arguments of a `Statement`, each by its parameter's name: the values in one vector
/// (the one allocation of a call), their names beside them, inline.
#[derive(Default)]
pub struct Args<'a> {
    names: [&'static str; MAX_PARAMS],
    values: Vec<DatumWithOid<'a>>,
}

impl<'a> Args<'a> {
    pub fn new() -> Self {
        Args::default()
    }

    /// Room for `n` arguments up front: one allocation for a statement's whole set.
    pub fn with_capacity(n: usize) -> Self {
        Args {
            names: [""; MAX_PARAMS],
            values: Vec::with_capacity(n),
        }
    }

    /// Gives parameter `name` the value `value`.
    pub fn set(mut self, name: &'static str, value: impl Into<DatumWithOid<'a>>) -> Self {
        let at = self.values.len();
        if at == MAX_PARAMS {
            pgrx::error!("lockext: more than {MAX_PARAMS} arguments (${name})");
        }
        self.names[at] = name;
        self.values.push(value.into());
        self
    }
}

impl Statement {
    /// The values of `args` in the order of `params`, put in place by swapping (nothing
    /// moves when they were given in that order, as `grant::Params::args` gives the
    /// acquire's eleven: one comparison of names each). Every name is a constant of the
    /// calling module, so a missing or unknown one is lockext's bug, which the tests that
    /// run the statement catch: refused with an internal error, never run with a value
    /// misplaced.
    fn ordered<'a>(&'static self, args: Args<'a>) -> Vec<DatumWithOid<'a>> {
        let Args {
            mut names,
            mut values,
        } = args;
        let given = values.len();
        for (at, (name, _)) in self.params.iter().enumerate() {
            match (at..given).find(|&i| names[i] == *name) {
                Some(i) => {
                    names.swap(at, i);
                    values.swap(at, i);
                }
                None => pgrx::error!(
                    "lockext: no value for ${name} of {}",
                    explore::statement_name(self.sql)
                ),
            }
        }
        if given > self.params.len() {
            pgrx::error!(
                "lockext: {} has no parameter ${}",
                explore::statement_name(self.sql),
                names[self.params.len()]
            );
        }
        values
    }

    fn types(&'static self) -> impl Iterator<Item = PgBuiltInOids> {
        self.params.iter().map(|(_, oid)| *oid)
    }

    /// Refuses a statement whose header does not name each parameter `$N name`, in the
    /// order of `params`: checked once per backend, when the statement is first prepared.
    fn check_header(&'static self) {
        let header: String = self
            .sql
            .lines()
            .take_while(|line| line.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        for (at, (name, _)) in self.params.iter().enumerate() {
            let wanted = format!("${} {name}", at + 1);
            let named = header.match_indices(&wanted).any(|(i, _)| {
                header[i + wanted.len()..]
                    .chars()
                    .next()
                    .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
            });
            if !named {
                pgrx::error!(
                    "lockext: the header of {} does not name {wanted}",
                    explore::statement_name(self.sql)
                );
            }
        }
    }

    /// Runs the statement and returns its rows. May write: callers hold a mutable client.
    ///
    /// Executed through `select`, not `update`: pgrx's `update` first assigns the
    /// transaction an id, so that even a lock_acquire that only looked and refused would
    /// cost a transaction id and a commit record. The plans are prepared as mutating, so
    /// SPI still runs them read-write; an id is assigned only when a row is written.
    pub fn run<'conn>(
        &'static self,
        client: &mut SpiClient<'conn>,
        args: Args<'_>,
    ) -> SpiResult<SpiTupleTable<'conn>> {
        let args = self.ordered(args);
        run_kept(
            self.sql,
            || (self.check_header(), self.types()).1,
            client,
            &args,
        )
    }

    /// Runs a read-only statement under the newest snapshot, not the statement's or the
    /// transaction's, and returns its first row. A conflict check must see every lease
    /// committed before it took its claim (`claims.rs`), even in a REPEATABLE READ
    /// transaction whose snapshot is older; foreign-key checks read the same way. Needs a
    /// connected SPI (inside `Spi::connect_mut`).
    pub fn read_latest(&'static self, args: Args<'_>) -> Option<LatestRow> {
        self.read_latest_rows(args, 1).into_iter().next()
    }

    /// As `read_latest`, every row.
    pub fn read_latest_all(&'static self, args: Args<'_>) -> Vec<LatestRow> {
        self.read_latest_rows(args, 0)
    }

    fn read_latest_rows(&'static self, args: Args<'_>, limit: i64) -> Vec<LatestRow> {
        let args = self.ordered(args);
        read_rows(
            self.sql,
            || (self.check_header(), self.types()).1,
            &args,
            limit,
            latest_snapshot(),
        )
    }
}

/// The jsonb column `column` of the current row of `rows`, copied into the memory of SPI's
/// caller (`Jsonb::transferred`), where it outlives `SPI_finish`. Sound: `rows` borrows a
/// connected SPI's tuple table, its current row is one of that table, and the column is
/// checked to be jsonb before its datum is detoasted (a constant column name of lockext's
/// statement: another type is lockext's bug, refused with an internal error).
pub fn jsonb_by_name(rows: &SpiTupleTable<'_>, column: &str) -> SpiResult<Option<Jsonb>> {
    let ordinal = rows.column_ordinal(column)?;
    if rows.column_type_oid(ordinal)? != PgOid::BuiltIn(PgBuiltInOids::JSONBOID) {
        pgrx::error!("lockext: column {column} is not jsonb");
    }
    Ok(rows
        .get_datum_by_ordinal(ordinal)?
        .map(|datum| unsafe { Jsonb::transferred(datum) }))
}

/// The column `column` of the first row, or None when there is no row (or it is NULL).
pub fn first_named<T: pgrx::IntoDatum + pgrx::FromDatum>(
    rows: SpiTupleTable<'_>,
    column: &str,
) -> SpiResult<Option<T>> {
    if rows.is_empty() {
        return Ok(None);
    }
    rows.first().get_by_name::<T, _>(column)
}

thread_local! {
    // Set when one of lockext's statements starts, until the executor checks its
    // privileges (`own_statement_checked`) or it ends.
    static STARTING: Cell<bool> = const { Cell::new(false) };
}

/// Whether the executor's privilege check now running (the hook of `adopted.rs` asks, once
/// per check) is that of the lockext statement that just started: the first check after
/// it starts is its own, since a statement is checked once as its plan starts, and
/// nothing runs between its start and that check. Answers true once per statement: every
/// other check while it runs is of something else (a trigger, a rule's other statement, a
/// policy's function that a superuser put on lockext's tables), which lockext did not
/// write. What lockext's statements write is lockext's: the files of `sql/run/`, which name
/// lockext's tables, PostgreSQL's functions and lockext's own.
pub fn own_statement_checked() -> bool {
    STARTING.with(|s| s.replace(false))
}

/// Forgets a statement as starting: at the end of a transaction, which no statement spans.
pub fn no_statement_starting() {
    STARTING.with(|s| s.set(false));
}

/// Marks a statement as starting until the executor checks it, or until dropped (also
/// when an error unwinds through it).
struct Starting;

impl Starting {
    fn now() -> Starting {
        STARTING.with(|s| s.set(true));
        Starting
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        STARTING.with(|s| s.set(false));
    }
}

thread_local! {
    // A backend is single-threaded; a thread_local is its per-backend cache. Plans kept
    // with SPI_keepplan are revalidated by PostgreSQL when the objects they use change
    // (DROP/CREATE EXTENSION), so they are never stale. Each is kept for the backend's
    // life (leaked): the cache is not borrowed while a statement runs, since a statement
    // may call into lockext, which runs statements of its own (lockext.grant_token).
    static PLANS: RefCell<HashMap<&'static str, &'static OwnedPreparedStatement>> = RefCell::new(HashMap::new());
}

// ---- the relations of a call on a Citus cluster ------------------------------------------

/// A set of relations in force (`with_relations`), with the key of its statements' texts:
/// the relations' names, joined once when the set is put in force, not at every statement.
#[derive(Default)]
struct Relations {
    set: Vec<(&'static str, String)>,
    key: String,
}

thread_local! {
    // While a call runs on a Citus worker (`citus::route`): each distributed table of
    // lockext's, as its statements name it, with the name of the shard that holds the
    // call's lock id on this node. Empty otherwise.
    static RELATIONS: RefCell<Relations> = RefCell::new(Relations::default());
    // Each statement's text with a set of shard names in place (by the set's key, then by
    // the statement), made once per backend and set, and kept as the key of its plan
    // (leaked, as the plans are).
    static ROUTED: RefCell<HashMap<String, HashMap<&'static str, &'static str>>> =
        RefCell::new(HashMap::new());
}

/// Puts back the relations in force before `with_relations`, when dropped.
pub struct RelationsInForce {
    before: Relations,
}

impl Drop for RelationsInForce {
    fn drop(&mut self) {
        let before = std::mem::take(&mut self.before);
        RELATIONS.with(|r| *r.borrow_mut() = before);
    }
}

/// Until the returned guard is dropped, every statement names, instead of each table of
/// `relations` (`lockext.locks`), the relation given with it (a shard of it on this node,
/// `lockext.locks_102008`). A statement's text is changed only where it names the table as a
/// whole word, schema-qualified as every statement names its tables.
pub fn with_relations(relations: Vec<(&'static str, String)>) -> RelationsInForce {
    let key = relations
        .iter()
        .map(|(_, to)| to.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let relations = Relations {
        set: relations,
        key,
    };
    let before = RELATIONS.with(|r| std::mem::replace(&mut *r.borrow_mut(), relations));
    RelationsInForce { before }
}

/// `sql` with the relations in force in place of the tables they stand for; `sql` itself
/// when none are (every call on a server without Citus).
fn in_force(sql: &'static str) -> &'static str {
    RELATIONS.with(|r| {
        let relations = r.borrow();
        if relations.set.is_empty() {
            return sql;
        }
        let known = ROUTED.with(|m| {
            m.borrow()
                .get(&relations.key)
                .and_then(|texts| texts.get(sql).copied())
        });
        if let Some(text) = known {
            return text;
        }
        let text: &'static str = Box::leak(replace_relations(sql, &relations.set).into_boxed_str());
        ROUTED.with(|m| {
            m.borrow_mut()
                .entry(relations.key.clone())
                .or_default()
                .insert(sql, text)
        });
        text
    })
}

/// `sql` with each `table` of `relations` replaced by its relation where it stands as a
/// whole name (not a prefix of a longer one: `lockext.locks` in `lockext.locks_idx` stays).
fn replace_relations(sql: &str, relations: &[(&'static str, String)]) -> String {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    let mut quoted = false;
    'scan: while !rest.is_empty() {
        if !quoted && rest.starts_with("--") {
            // A comment, to the end of its line: copied as it is (an apostrophe there
            // starts no literal).
            let end = rest.find('\n').unwrap_or(rest.len());
            out.push_str(&rest[..end]);
            rest = &rest[end..];
            continue;
        }
        // Not inside a string literal ('lockext.locks'::regclass names the table itself).
        for (table, to) in relations.iter().filter(|_| !quoted) {
            if let Some(after) = rest.strip_prefix(table) {
                let whole = after
                    .chars()
                    .next()
                    .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
                let starts = out
                    .chars()
                    .last()
                    .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '.'));
                if whole && starts {
                    out.push_str(to);
                    rest = after;
                    continue 'scan;
                }
            }
        }
        let mut chars = rest.chars();
        if let Some(c) = chars.next() {
            quoted ^= c == '\'';
            out.push(c);
        }
        rest = chars.as_str();
    }
    out
}

/// Runs `sql` through its plan kept in this backend, prepared first with the parameter
/// types `types` gives if there is none yet.
fn run_kept<'conn, I: Iterator<Item = PgBuiltInOids>>(
    sql: &'static str,
    types: impl FnOnce() -> I,
    client: &mut SpiClient<'conn>,
    args: &[DatumWithOid<'_>],
) -> SpiResult<SpiTupleTable<'conn>> {
    let sql = in_force(sql);
    let key = sql;
    let kept = PLANS.with(|plans| plans.borrow().get(key).copied());
    let plan = match kept {
        Some(plan) => plan,
        None => {
            let oids: Vec<PgOid> = types().map(PgOid::BuiltIn).collect();
            let plan: &'static OwnedPreparedStatement =
                Box::leak(Box::new(client.prepare_mut(sql, &oids)?.keep()));
            PLANS.with(|plans| plans.borrow_mut().insert(key, plan));
            plan
        }
    };
    explore::point(|| format!("before {}", explore::statement_name(sql)));
    let rows = {
        let _starting = Starting::now();
        client.select(plan, None, args)
    };
    explore::point(|| format!("after {}", explore::statement_name(sql)));
    rows
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

/// The newest snapshot: every transaction committed before now. Taken and registered by
/// PostgreSQL (kept until the transaction ends); the pointer is only handed to SPI.
fn latest_snapshot() -> pg_sys::Snapshot {
    unsafe { pg_sys::GetLatestSnapshot() }
}

/// Runs `sql` under `snapshot`, or with none (null) under the active one, through its raw
/// plan kept in this backend (prepared with the types `types` gives if there is none yet).
fn read_rows<I: Iterator<Item = PgBuiltInOids>>(
    sql_text: &'static str,
    types: impl FnOnce() -> I,
    args: &[DatumWithOid<'_>],
    limit: i64,
    snapshot: pg_sys::Snapshot,
) -> Vec<LatestRow> {
    {
        let sql_text = in_force(sql_text);
        let plan = RAW_PLANS.with(|plans| {
            *plans.borrow_mut().entry(sql_text).or_insert_with(|| {
                let sql = CString::new(sql_text).expect("statement text has no NUL");
                let mut oids: Vec<pg_sys::Oid> =
                    types().map(|o| pg_sys::Oid::from(o as u32)).collect();
                unsafe {
                    let plan =
                        pg_sys::SPI_prepare(sql.as_ptr(), oids.len() as i32, oids.as_mut_ptr());
                    if plan.is_null() {
                        pgrx::error!("lockext: cannot prepare {}", sql_text);
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
        explore::point(|| format!("before {}", explore::statement_name(sql_text)));
        let rows = {
            let _starting = Starting::now();
            execute_raw(plan, &mut values, &nulls, limit, snapshot)
        };
        explore::point(|| format!("after {}", explore::statement_name(sql_text)));
        rows
    }
}

fn execute_raw(
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
