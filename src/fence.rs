//! Fencing: the resource side of the bargain. A write carries the writer's token, and a
//! resource accepts it only if no higher token has written there before.
//!
//! Three ways in, one code path (`advance`):
//! - `fenced_update` stores a JSON document for the resource (the article's resource);
//! - `lockext.fence` (sql/fence.sql) checks and records the token inside the caller's own
//!   transaction, so any write to any table in that transaction is fenced with it;
//! - `lockext.fence_guard` (here: `lockext_fence_guard`), a trigger keeping a fence per
//!   row of a user table, whose writes without a token in the row use the one
//!   `declare_token` recorded.
//!
//! Readers check with `fence_read_check`. The SQL wrappers raise the stale-token error
//! themselves, with lockext's own SQLSTATE 55L01, which pgrx cannot carry through a Rust
//! function; the trigger raises it from its own entry point (`throw`).

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CStr};

use pgrx::pg_sys::{self, BuiltinOid::*, PgOid};
use pgrx::prelude::*;
use pgrx::{register_subxact_callback, PgSqlErrorCode, PgSubXactCallbackEvent};

use crate::backend;
use crate::caller::{self, Needs};
use crate::catalog;
use crate::citus::{self, Access};
use crate::error::{self, LockError, OrReport};
use crate::statements::{first_named, Args, Statement};
use crate::stats::{self, Counter};
use crate::text::{Jsonb, Text, TextBuf};
use crate::token;
use crate::xact;

// A fenced write: the check and the write are one statement (why, and what a bound
// resource demands: advance.sql's header), an UPDATE of the resource's row first, then,
// when that changed nothing, the upsert that stores a resource's first write or refuses.
static WRITE: [Statement; 2] = [
    Statement {
        sql: include_str!("../sql/run/fence/update_mark.sql"),
        params: ADVANCE_PARAMS,
    },
    Statement {
        sql: include_str!("../sql/run/fence/advance.sql"),
        params: ADVANCE_PARAMS,
    },
];

/// The parameters of every fenced write (WRITE, WRITE_OWN_LOCK), in their order.
const ADVANCE_PARAMS: &[(&str, pg_sys::PgBuiltInOids)] = &[
    ("resource_id", TEXTOID),
    ("fence_token", INT8OID),
    ("data", JSONBOID),
    ("replace", BOOLOID),
    ("role", OIDOID),
];

// The same, on a Citus cluster, for a resource bound to the lock of its own id (why an
// UPDATE only: the file's header).
static WRITE_OWN_LOCK: [Statement; 1] = [Statement {
    sql: include_str!("../sql/run/fence/advance_own_lock.sql"),
    params: ADVANCE_PARAMS,
}];

static BIND: Statement = Statement {
    sql: include_str!("../sql/run/fence/bind.sql"),
    params: &[("resource_id", TEXTOID), ("lock_id", TEXTOID)],
};

static HIGH_WATER_MARK: Statement = Statement {
    sql: include_str!("../sql/run/fence/high_water_mark.sql"),
    params: &[("resource_id", TEXTOID), ("fence_token", INT8OID)],
};

// Read under the newest snapshot (`Statement::read_latest`), as are the next two.
static EXCLUSIVE_GRANT_LIVE: Statement = Statement {
    sql: include_str!("../sql/run/fence/exclusive_grant_live.sql"),
    params: &[
        ("lock_id", TEXTOID),
        ("fence_token", INT8OID),
        ("role", OIDOID),
    ],
};

static OWN_LEASE_LIVE: Statement = Statement {
    sql: include_str!("../sql/run/fence/own_lease_live.sql"),
    params: &[
        ("lock_id", TEXTOID),
        ("fence_token", INT8OID),
        ("role", OIDOID),
    ],
};

static READ_MARK: Statement = Statement {
    sql: include_str!("../sql/run/fence/read_mark.sql"),
    params: &[("resource_id", TEXTOID)],
};

static LEASE_IS_LIVE: Statement = Statement {
    sql: include_str!("../sql/run/fence/lease_is_live.sql"),
    params: &[("lock_id", TEXTOID), ("fence_token", INT8OID)],
};

/// Stores `data` for `resource_id` if `fence_token` is not older than the newest token
/// accepted there; returns whether it was stored.
// Its C symbol, fenced_update_0_3_wrapper, is one no older library has (compat.rs).
#[pg_extern(volatile, parallel_unsafe, name = "fenced_update")]
#[search_path(pg_catalog, pg_temp)]
fn fenced_update_0_3(
    resource_id: Option<Text<'_>>,
    fence_token: Option<i64>,
    data: Option<Jsonb>,
) -> bool {
    caller::as_member(|| {
        let routed = citus::route_arg("resource_id", resource_id, Access::Write)?;
        fenced_write(resource_id, fence_token, data, Scope::of(&routed))
    })
    .or_report()
}

/// Records `fence_token` as `resource_id`'s high-water mark, in the caller's transaction
/// and under the resource's row lock. Returns NULL when accepted, or the newer token that
/// makes it stale. (`lockext.fence` turns the latter into an error.)
// Its C symbol, fence_advance_0_3_wrapper, is one no older library has (compat.rs).
#[pg_extern(volatile, parallel_unsafe, name = "fence_advance")]
#[search_path(pg_catalog, pg_temp)]
fn fence_advance_0_3(resource_id: Option<Text<'_>>, fence_token: Option<i64>) -> Option<i64> {
    citus::refuse(
        "lockext.fence records a token in the caller's own transaction",
        citus::FENCE_ALONE,
    )
    .or_report();
    caller::as_member(|| fence_only(resource_id, fence_token)).or_report()
}

/// A reader's check (`lockext.fence_read`): NULL when the reader may read `resource_id`
/// with `fence_token`, or why not (the 55L01 error's detail, which the SQL wrapper raises).
/// Keeps the resource's row share-locked to the end of the transaction.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn fence_read_check(resource_id: Option<Text<'_>>, fence_token: Option<i64>) -> Option<TextBuf> {
    caller::as_member(|| {
        let routed = citus::route_arg("resource_id", resource_id, Access::Read)?;
        read_check(resource_id, fence_token, Scope::of(&routed))
    })
    .or_report()
}

/// One role's declaration of its writer's token in the current transaction, made in
/// subtransaction `sub` (undone when that subtransaction rolls back).
struct Declared {
    role: pg_sys::Oid,
    sub: pg_sys::SubTransactionId,
    token: i64,
}

thread_local! {
    // The declarations of the current transaction (its number, and one entry per role and
    // subtransaction, newest last). Only that transaction's writes by that role may use
    // them: each role its own (a SECURITY DEFINER function of another role that declares
    // its own token leaves the caller's alone), and a rolled back subtransaction's are
    // gone (ROLLBACK TO SAVEPOINT undoes a declaration, explicit or made by a write).
    static DECLARED: RefCell<(pg_sys::LocalTransactionId, Vec<Declared>)> =
        const { RefCell::new((0, Vec::new())) };
    // The transaction the rollback callback is registered for (pgrx forgets its
    // subtransaction callbacks when a transaction ends).
    static WATCHING: Cell<pg_sys::LocalTransactionId> = const { Cell::new(0) };
}

/// This transaction's declarations, emptied when it is a new transaction.
fn with_declared<R>(f: impl FnOnce(&mut Vec<Declared>) -> R) -> R {
    let lxid = backend::local_transaction();
    DECLARED.with(|declared| {
        let mut declared = declared.borrow_mut();
        if declared.0 != lxid {
            *declared = (lxid, Vec::new());
        }
        f(&mut declared.1)
    })
}

/// Forgets the declarations of a subtransaction that rolls back (and of its children,
/// whose ids are higher), once per transaction.
fn watch_subtransactions() {
    let lxid = backend::local_transaction();
    if WATCHING.replace(lxid) == lxid {
        return;
    }
    register_subxact_callback(PgSubXactCallbackEvent::AbortSub, |aborted, _parent| {
        with_declared(|declared| declared.retain(|d| d.sub < aborted));
    });
}

/// Declares `fence_token` as the writer's token for this transaction's writes, by the
/// current role, to tables guarded by `lockext.fence_guard`: for an UPDATE that leaves the
/// token column as it is and a DELETE, which carry no token in the row. Refuses a token
/// lockext never issued (22023). fence_guard declares the token of each write it accepts.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn declare_token(fence_token: Option<i64>) {
    citus::refuse(
        "declare_token declares a token for rows that take tokens of any lock",
        citus::FENCE_ALONE,
    )
    .or_report();
    caller::require(Needs::User)
        .and_then(|()| declare(fence_token))
        .or_report();
}

/// The token this transaction declared for the current role (`declare_token`), if any.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn declared_token() -> Option<i64> {
    caller::require(Needs::User).or_report();
    declared_by(backend::current_user())
}

/// The token `role` declared in this transaction, if any (its newest declaration).
fn declared_by(role: pg_sys::Oid) -> Option<i64> {
    with_declared(|declared| {
        declared
            .iter()
            .rev()
            .find(|d| d.role == role)
            .map(|d| d.token)
    })
}

/// fence_guard's check of one row (sql/fence.sql): declares the writer's `fence_token` (as
/// `declare_token`, refusing a token never issued) and answers whether it may write a row
/// that carries `row_token` (NULL: a new row, or one without a token): false when the row's
/// is newer. A refusal is counted with fenced_update's (`fence_rejected_stale`), in shared
/// memory, so the count outlives the transaction that the trigger's error rolls back.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn fence_row(fence_token: Option<i64>, row_token: Option<i64>) -> bool {
    citus::refuse(
        "fence_row checks rows that take tokens of any lock",
        citus::FENCE_ALONE,
    )
    .or_report();
    caller::require(Needs::User)
        .and_then(|()| row_accepts(fence_token, row_token))
        .or_report()
}

/// fence_row's check, for a caller whose privileges were checked.
fn row_accepts(fence_token: Option<i64>, row_token: Option<i64>) -> Result<bool, LockError> {
    declare(fence_token)?;
    Ok(match (fence_token, row_token) {
        (Some(writer), Some(row)) if writer < row => {
            stats::count(Counter::FenceStale);
            false
        }
        _ => true,
    })
}

// ---- lockext.fence_guard, the trigger ------------------------------------------------

// The lock a resource is bound to, for the detail of a refusal.
static RESOURCE_LOCK: Statement = Statement {
    sql: include_str!("../sql/run/fence/resource_lock.sql"),
    params: &[("resource_id", TEXTOID)],
};

/// `lockext.fence_guard`, the trigger (what it checks: sql/fence.sql). All of it in Rust,
/// on the rows as PostgreSQL hands them over: which columns the UPDATE names
/// (`TriggerData.tg_updatedcols`, which a PL/pgSQL trigger cannot see), the token column of
/// OLD and NEW read by its attribute number, and the writer's token written into NEW with
/// `heap_modify_tuple_by_cols`. No row is converted into anything, so no type's output or
/// input function runs. The trigger is not SECURITY DEFINER: it runs with the writer's
/// rights (a domain's constraints on the token column too), search_path pinned by its SET
/// clause (sql/fence.sql); lockext's own table work runs as the tables' owner, inside
/// `declare` and `fence_only`, as for every other caller of them.
///
/// Not a pgrx function: a stale writer is refused with lockext's own SQLSTATE 55L01, which
/// must reach the client as it is, and a pgrx boundary turns any SQLSTATE it does not know
/// into XX000. So the work runs in `guard`, a guarded function that returns the row or the
/// refusal (an error of lockext's functions it calls, whose codes pgrx knows, is raised at
/// guard's boundary), and this frame raises a refusal itself (`throw`). Nothing here has a
/// destructor: PostgreSQL's longjmp passes through it.
///
/// # Safety
/// Called by PostgreSQL's function manager only, with a valid `fcinfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn lockext_fence_guard(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    let mut outcome = Outcome::Row(pg_sys::Datum::from(0));
    unsafe {
        guard(fcinfo, &mut outcome);
        match outcome {
            Outcome::Row(row) => row,
            Outcome::Refuse(thrown) => throw(thrown),
        }
    }
}

/// Version 1 of the function manager's calling convention, for `lockext_fence_guard`.
#[unsafe(no_mangle)]
pub extern "C" fn pg_finfo_lockext_fence_guard() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// How a trigger call ends. Plain data, no destructor: it crosses `guard`'s boundary.
#[derive(Clone, Copy)]
enum Outcome {
    /// The row to write (a `HeapTuple`), or OLD for a DELETE.
    Row(pg_sys::Datum),
    Refuse(Thrown),
}

/// A refusal ready for `throw`: its SQLSTATE, and its texts palloc'd (NUL-terminated, in
/// the database's encoding; detail and hint may be null).
#[derive(Clone, Copy)]
struct Thrown {
    sqlstate: i32,
    message: *mut c_char,
    detail: *mut c_char,
    hint: *mut c_char,
}

unsafe extern "C-unwind" {
    // PostgreSQL's own, called directly: pg_sys's wrapper of it would catch the longjmp
    // it makes and hand it back to Rust, here where nothing may unwind.
    #[link_name = "ThrowErrorData"]
    fn throw_error_data(edata: *mut pg_sys::ErrorData);
}

/// Raises `thrown` as an ERROR with its own SQLSTATE (ThrowErrorData copies the texts).
unsafe fn throw(thrown: Thrown) -> ! {
    unsafe {
        let mut edata: pg_sys::ErrorData = std::mem::zeroed();
        edata.elevel = PgLogLevel::ERROR as i32;
        edata.sqlerrcode = thrown.sqlstate;
        edata.message = thrown.message;
        edata.detail = thrown.detail;
        edata.hint = thrown.hint;
        edata.filename = c"fence.rs".as_ptr();
        edata.lineno = line!() as i32;
        edata.funcname = c"lockext_fence_guard".as_ptr();
        throw_error_data(&mut edata);
    }
    // An ERROR never returns.
    std::process::abort()
}

/// `lockext_fence_guard`'s work, in a guarded function: writes the row to return or the
/// refusal to raise into `outcome`.
#[pg_guard]
unsafe extern "C-unwind" fn guard(fcinfo: pg_sys::FunctionCallInfo, outcome: *mut Outcome) {
    unsafe {
        let result = match Call::of(fcinfo) {
            Some(call) => guard_row(&call),
            None => Err(Refusal::new(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                b"trigger functions can only be called as triggers".to_vec(),
            )),
        };
        *outcome = match result {
            Ok(row) => Outcome::Row(row),
            Err(refusal) => Outcome::Refuse(refusal.palloc()),
        };
    }
}

/// An error the trigger raises itself, texts in the database's encoding (names of tables
/// and columns are, and go in as they are).
struct Refusal {
    sqlstate: i32,
    message: Vec<u8>,
    detail: Option<Vec<u8>>,
    hint: Option<Vec<u8>>,
}

/// lockext's own SQLSTATE for a stale token (docs/errors.md).
const STALE_TOKEN: i32 = sqlstate(*b"55L01");

/// PostgreSQL's encoding of a SQLSTATE (MAKE_SQLSTATE).
const fn sqlstate(code: [u8; 5]) -> i32 {
    let mut value = 0;
    let mut i = 0;
    while i < 5 {
        value |= ((code[i].wrapping_sub(b'0') & 0x3F) as i32) << (6 * i);
        i += 1;
    }
    value
}

const STALE_HINT: &[u8] = b"This client's lease was lost: stop, and acquire the lock again.";

impl Refusal {
    fn new(code: PgSqlErrorCode, message: Vec<u8>) -> Refusal {
        Refusal {
            sqlstate: code as i32,
            message,
            detail: None,
            hint: None,
        }
    }

    fn stale(message: Vec<u8>, detail: Vec<u8>) -> Refusal {
        Refusal {
            sqlstate: STALE_TOKEN,
            message,
            detail: Some(detail),
            hint: Some(STALE_HINT.to_vec()),
        }
    }

    fn detail(mut self, detail: Vec<u8>) -> Refusal {
        self.detail = Some(detail);
        self
    }

    fn hint(mut self, hint: Vec<u8>) -> Refusal {
        self.hint = Some(hint);
        self
    }

    /// The same, its texts copied into the current memory context for `throw`.
    fn palloc(&self) -> Thrown {
        Thrown {
            sqlstate: self.sqlstate,
            message: palloc_text(&self.message),
            detail: self
                .detail
                .as_deref()
                .map_or(std::ptr::null_mut(), palloc_text),
            hint: self
                .hint
                .as_deref()
                .map_or(std::ptr::null_mut(), palloc_text),
        }
    }
}

/// `bytes` as a NUL-terminated string in the current memory context (a NUL inside, which
/// no name or number has, would end it early).
fn palloc_text(bytes: &[u8]) -> *mut c_char {
    unsafe {
        let text = pg_sys::palloc(bytes.len() + 1).cast::<u8>();
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), text, bytes.len());
        *text.add(bytes.len()) = 0;
        text.cast()
    }
}

/// What fired the trigger.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Insert,
    Update,
    Delete,
    Truncate,
}

/// One call of the trigger: PostgreSQL's `TriggerData`, valid for the call.
struct Call {
    data: *const pg_sys::TriggerData,
}

impl Call {
    /// The call's trigger data; None when the function was not called as a trigger.
    fn of(fcinfo: pg_sys::FunctionCallInfo) -> Option<Call> {
        unsafe {
            let context = (*fcinfo).context;
            if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_TriggerData {
                return None;
            }
            Some(Call {
                data: context.cast(),
            })
        }
    }

    fn event(&self) -> u32 {
        unsafe { (*self.data).tg_event }
    }

    fn op(&self) -> Op {
        match self.event() & pg_sys::TRIGGER_EVENT_OPMASK {
            pg_sys::TRIGGER_EVENT_INSERT => Op::Insert,
            pg_sys::TRIGGER_EVENT_UPDATE => Op::Update,
            pg_sys::TRIGGER_EVENT_DELETE => Op::Delete,
            _ => Op::Truncate,
        }
    }

    /// Fired BEFORE the write, FOR EACH ROW.
    fn before_row(&self) -> bool {
        let event = self.event();
        event & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_BEFORE
            && event & pg_sys::TRIGGER_EVENT_ROW != 0
    }

    /// The trigger's arguments (`TG_ARGV`), each a C string in the database's encoding.
    fn args(&self) -> &[*mut c_char] {
        unsafe {
            let trigger = (*self.data).tg_trigger;
            if trigger.is_null() || (*trigger).tgnargs <= 0 || (*trigger).tgargs.is_null() {
                return &[];
            }
            std::slice::from_raw_parts((*trigger).tgargs, (*trigger).tgnargs as usize)
        }
    }

    fn arg(&self, at: usize) -> &[u8] {
        unsafe { CStr::from_ptr(self.args()[at]).to_bytes() }
    }

    fn relation(&self) -> pg_sys::Relation {
        unsafe { (*self.data).tg_relation }
    }

    fn tupdesc(&self) -> pg_sys::TupleDesc {
        unsafe { (*self.relation()).rd_att }
    }

    /// The table's schema and name as `TG_TABLE_SCHEMA` and `TG_TABLE_NAME` give them, for
    /// an error only.
    fn schema(&self) -> Vec<u8> {
        unsafe { palloced(pg_sys::SPI_getnspname(self.relation())) }
    }

    fn table(&self) -> Vec<u8> {
        unsafe { palloced(pg_sys::SPI_getrelname(self.relation())) }
    }

    /// `schema.table`, as the messages name the table (`%.%`).
    fn table_named(&self) -> Vec<u8> {
        [self.schema(), b".".to_vec(), self.table()].concat()
    }

    /// `schema.table` with each quoted as an identifier if it must be (`%I.%I`).
    fn table_quoted(&self) -> Vec<u8> {
        [quoted(&self.schema()), b".".to_vec(), quoted(&self.table())].concat()
    }

    /// The attribute number of column `name` in the table (dropped columns do not count;
    /// system columns, which no row value has, are refused as missing).
    fn column(&self, name: &CStr) -> Option<i32> {
        let attnum = unsafe { pg_sys::SPI_fnumber(self.tupdesc(), name.as_ptr()) };
        (attnum > 0).then_some(attnum)
    }

    fn column_type(&self, attnum: i32) -> pg_sys::Oid {
        unsafe { pg_sys::SPI_gettypeid(self.tupdesc(), attnum) }
    }

    /// OLD for an UPDATE or a DELETE, NEW for an INSERT (`tg_trigtuple`).
    fn trigger_tuple(&self) -> pg_sys::HeapTuple {
        unsafe { (*self.data).tg_trigtuple }
    }

    /// NEW for an UPDATE (`tg_newtuple`).
    fn new_tuple(&self) -> pg_sys::HeapTuple {
        unsafe { (*self.data).tg_newtuple }
    }

    /// Whether the UPDATE names column `attnum` in its SET list.
    fn names(&self, attnum: i32) -> bool {
        unsafe {
            pg_sys::bms_is_member(
                attnum - pg_sys::FirstLowInvalidHeapAttributeNumber,
                (*self.data).tg_updatedcols,
            )
        }
    }

    /// The token in column `attnum` of `tuple` (NULL: None).
    fn token(&self, tuple: pg_sys::HeapTuple, attnum: i32, width: Width) -> Option<i64> {
        let mut isnull = false;
        let value = unsafe { pg_sys::SPI_getbinval(tuple, self.tupdesc(), attnum, &mut isnull) };
        (!isnull).then(|| width.token(value))
    }

    /// `tuple` with `value` in column `attnum`, in the current memory context (the
    /// trigger call's, which the executor keeps until it has stored the row).
    fn with_value(
        &self,
        tuple: pg_sys::HeapTuple,
        attnum: i32,
        value: pg_sys::Datum,
    ) -> pg_sys::HeapTuple {
        let mut columns = [attnum];
        let mut values = [value];
        let mut nulls = [false];
        unsafe {
            pg_sys::heap_modify_tuple_by_cols(
                tuple,
                self.tupdesc(),
                1,
                columns.as_mut_ptr(),
                values.as_mut_ptr(),
                nulls.as_mut_ptr(),
            )
        }
    }
}

/// A copy of a palloc'd C string.
unsafe fn palloced(text: *mut c_char) -> Vec<u8> {
    if text.is_null() {
        return Vec::new();
    }
    unsafe { CStr::from_ptr(text).to_bytes().to_vec() }
}

/// `name` quoted as an identifier if it must be, as `format('%I')` and `quote_ident` do.
fn quoted(name: &[u8]) -> Vec<u8> {
    let Ok(name) = std::ffi::CString::new(name) else {
        return name.to_vec();
    };
    unsafe {
        CStr::from_ptr(pg_sys::quote_identifier(name.as_ptr()))
            .to_bytes()
            .to_vec()
    }
}

/// The integer types a token column may have (or a domain over one), read and written as
/// PostgreSQL keeps them.
#[derive(Clone, Copy)]
enum Width {
    Int8,
    Int4,
    Int2,
}

impl Width {
    /// The width of a column of type `type_oid`, or None when it holds no fence tokens.
    fn of(type_oid: pg_sys::Oid) -> Option<(Width, bool)> {
        let width = |oid| match oid {
            INT8OID => Some(Width::Int8),
            INT4OID => Some(Width::Int4),
            INT2OID => Some(Width::Int2),
            _ => None,
        };
        let oid = PgOid::from(type_oid);
        if let PgOid::BuiltIn(builtin) = oid {
            if let Some(w) = width(builtin) {
                return Some((w, false));
            }
        }
        // A domain over one of them.
        let base = unsafe { pg_sys::getBaseType(type_oid) };
        if base == type_oid {
            return None;
        }
        match PgOid::from(base) {
            PgOid::BuiltIn(builtin) => width(builtin).map(|w| (w, true)),
            _ => None,
        }
    }

    fn token(self, value: pg_sys::Datum) -> i64 {
        match self {
            Width::Int8 => value.value() as i64,
            Width::Int4 => i64::from(value.value() as i32),
            Width::Int2 => i64::from(value.value() as i16),
        }
    }

    /// `token` as a value of this width, or the error of a value out of its range.
    fn datum(self, token: i64) -> Result<pg_sys::Datum, Refusal> {
        let (fits, name) = match self {
            Width::Int8 => (true, "bigint"),
            Width::Int4 => (i32::try_from(token).is_ok(), "integer"),
            Width::Int2 => (i16::try_from(token).is_ok(), "smallint"),
        };
        if !fits {
            // What the type's input function says of it (as jsonb_populate_record, which
            // 0.3.0's trigger wrote the token with, raised it).
            return Err(Refusal::new(
                PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
                format!("value \"{token}\" is out of range for type {name}").into_bytes(),
            ));
        }
        Ok(pg_sys::Datum::from(token))
    }
}

/// The trigger's checks, in the order 0.3.0's PL/pgSQL body made them, with its errors
/// word for word; the row to return, or the refusal.
fn guard_row(call: &Call) -> Result<pg_sys::Datum, Refusal> {
    if let Err(LockError::CitusUnsupported { what, hint }) = citus::refuse(
        "lockext.fence_guard guards rows that take tokens of any lock",
        citus::FENCE_ALONE,
    ) {
        return Err(Refusal::new(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("on a Citus cluster, {what}").into_bytes(),
        )
        .hint(hint.as_bytes().to_vec()));
    }
    // The writer needs lockext_user, which declare and fence_only would check too; said
    // here, the error names the table instead of one of them.
    let user = backend::current_user();
    if !catalog::has_privileges_of_named(user, c"lockext_user") {
        let name = unsafe { palloced(pg_sys::GetUserNameFromId(user, false)) };
        return Err(Refusal::new(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            [
                b"permission denied to write ".as_slice(),
                &call.table_named(),
                b", which lockext.fence_guard guards",
            ]
            .concat(),
        )
        .detail(
            [
                b"Role \"".as_slice(),
                &name,
                b"\" does not have the privileges of role lockext_user.",
            ]
            .concat(),
        )
        .hint(
            [
                b"An administrator grants them with: GRANT lockext_user TO ".as_slice(),
                &quoted(&name),
                b";",
            ]
            .concat(),
        ));
    }
    if !call.before_row() {
        return Err(Refusal::new(
            PgSqlErrorCode::ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
            b"lockext.fence_guard must be a BEFORE INSERT OR UPDATE OR DELETE ... FOR EACH ROW trigger"
                .to_vec(),
        )
        .hint(
            [
                b"CREATE TRIGGER ... BEFORE INSERT OR UPDATE OR DELETE ON ".as_slice(),
                &call.table_quoted(),
                b" FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token')",
            ]
            .concat(),
        ));
    }
    let args = call.args();
    if args.len() != 1 && args.len() != 2 {
        return Err(Refusal::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            b"lockext.fence_guard takes the name of the token column, and optionally a resource id"
                .to_vec(),
        )
        .hint(
            b"EXECUTE FUNCTION lockext.fence_guard('fence_token') or \
              lockext.fence_guard('fence_token', 'resource id')"
                .to_vec(),
        ));
    }
    let column_name = unsafe { CStr::from_ptr(args[0]) };
    let column = column_name.to_bytes();
    let Some(attnum) = call.column(column_name) else {
        return Err(Refusal::new(
            PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
            [
                b"table ".as_slice(),
                &call.table_named(),
                b" has no column \"",
                column,
                b"\" for lockext.fence_guard",
            ]
            .concat(),
        )
        .hint(
            [
                b"Add it (ALTER TABLE ".as_slice(),
                &call.table_quoted(),
                b" ADD COLUMN ",
                &quoted(column),
                b" bigint), or name the table's token column in the trigger's first argument.",
            ]
            .concat(),
        ));
    };
    let column_type = call.column_type(attnum);
    let Some((width, domain)) = Width::of(column_type) else {
        return Err(Refusal::new(
            PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
            [
                b"column \"".as_slice(),
                column,
                b"\" of ",
                &call.table_named(),
                b" must hold fence tokens (bigint)",
            ]
            .concat(),
        )
        .hint(
            b"Name a bigint column in the trigger's first argument: it holds the fence token \
              of the row's writer."
                .to_vec(),
        ));
    };
    let op = call.op();
    // The row as it will be written (NEW), and the row as it was (OLD): tg_trigtuple is NEW
    // for an INSERT, OLD otherwise.
    let (new_row, old_row) = match op {
        Op::Insert => (Some(call.trigger_tuple()), None),
        Op::Update => (Some(call.new_tuple()), Some(call.trigger_tuple())),
        Op::Delete | Op::Truncate => (None, Some(call.trigger_tuple())),
    };
    let new_token = new_row.and_then(|row| call.token(row, attnum, width));
    let old_token = old_row.and_then(|row| call.token(row, attnum, width));
    let carries = match op {
        Op::Insert => true,
        // An UPDATE that names the column carries the token it sets, even the row's own.
        Op::Update => call.names(attnum) || new_token != old_token,
        Op::Delete | Op::Truncate => false,
    };
    let writer = if carries {
        new_token.ok_or_else(|| {
            let mut hint = [
                b"Set \"".as_slice(),
                column,
                b"\" to the lock holder's fence token (the one lock_acquire returned)",
            ]
            .concat();
            hint.extend_from_slice(if op == Op::Insert {
                b"."
            } else {
                b", or leave it out of the UPDATE and declare the token first: \
                  SELECT lockext.declare_token(<token>)."
            });
            Refusal::new(
                PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                [
                    b"a row of ".as_slice(),
                    &call.table_named(),
                    b" must carry a fence token in \"",
                    column,
                    b"\"",
                ]
                .concat(),
            )
            .hint(hint)
        })?
    } else {
        declared_by(user).ok_or_else(|| {
            let (message, hint) = if op == Op::Delete {
                (
                    [b"a DELETE on ".as_slice(), &call.table_named()].concat(),
                    b"SELECT lockext.declare_token(<token>) first, in the same transaction and \
                      as the same role."
                        .to_vec(),
                )
            } else {
                (
                    [
                        b"an UPDATE on ".as_slice(),
                        &call.table_named(),
                        b" that leaves \"",
                        column,
                        b"\" out of its SET list",
                    ]
                    .concat(),
                    [
                        b"SELECT lockext.declare_token(<token>) first, in the same transaction \
                          and as the same role, or SET \""
                            .as_slice(),
                        column,
                        b"\" = <token> in the UPDATE.",
                    ]
                    .concat(),
                )
            };
            Refusal::new(
                PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                [
                    message.as_slice(),
                    b" must declare the writer's fence token",
                ]
                .concat(),
            )
            .detail(
                b"The row carries no token of its writer: without one, a holder whose lease \
                  was lost could write over a newer holder's row."
                    .to_vec(),
            )
            .hint(hint)
        })?
    };
    // Declares the writer's token (refusing one never issued): this transaction's later
    // writes by this role that carry none of their own (a DELETE, a row moved to another
    // partition) use it. A refusal is counted in lockext.stats.
    if !row_accepts(Some(writer), old_token).or_report() {
        return Err(Refusal::stale(
            [
                format!("fence token {writer} is stale for this row of ").as_bytes(),
                &call.table_named(),
            ]
            .concat(),
            format!(
                "The row was written with fence token {}.",
                old_token.unwrap_or_default()
            )
            .into_bytes(),
        ));
    }
    if args.len() == 2 {
        fence_resource(Text::new(call.arg(1)), writer)?;
    }
    Ok(match (op, new_row) {
        (Op::Insert | Op::Update, Some(row)) if new_token != Some(writer) => {
            // A declared token newer than the row's is written into the row, checked as the
            // column's type checks a value: its range, and a domain's constraints.
            let value = width.datum(writer)?;
            if domain {
                unsafe {
                    pg_sys::domain_check(
                        value,
                        false,
                        column_type,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                };
            }
            pg_sys::Datum::from(call.with_value(row, attnum, value))
        }
        (_, Some(row)) => pg_sys::Datum::from(row),
        (_, None) => pg_sys::Datum::from(call.trigger_tuple()),
    })
}

/// `lockext.fence(resource_id, writer)`, for a trigger with a resource id: the same check,
/// and the same refusal.
fn fence_resource(resource_id: Text<'_>, writer: i64) -> Result<(), Refusal> {
    // The caller's privileges were checked (guard_row's first check): the owner's part.
    let Some(newer) = caller::as_owner(|| fence_only(Some(resource_id), Some(writer))).or_report()
    else {
        return Ok(());
    };
    let detail = if newer > writer {
        format!("A holder with fence token {newer} has written since.").into_bytes()
    } else {
        let lock = caller::as_owner(|| {
            Spi::connect_mut(|client| {
                let rows =
                    RESOURCE_LOCK.run(client, Args::new().set("resource_id", resource_id))?;
                Ok(first_named::<TextBuf>(rows, "lock_id")?)
            })
        })
        .or_report();
        [
            b"The resource is bound to lock \"".as_slice(),
            lock.as_ref().map_or(&b""[..], |l| l.as_text().bytes()),
            format!("\", and fence token {writer} is not its live grant held by this role.")
                .as_bytes(),
        ]
        .concat()
    };
    Err(Refusal::stale(
        [
            format!("fence token {writer} is stale for resource \"").as_bytes(),
            resource_id.bytes(),
            b"\"",
        ]
        .concat(),
        detail,
    ))
}

fn declare(fence_token: Option<i64>) -> Result<(), LockError> {
    let fence_token = error::token("fence_token", fence_token)?;
    let role = backend::current_user();
    let sub = backend::subtransaction();
    // Already this role's newest declaration, made in this subtransaction: checked then,
    // and declaring it again would change nothing (every write of a transaction that
    // declared its token, or wrote with it, gets here).
    if with_declared(|declared| {
        declared
            .iter()
            .rev()
            .find(|d| d.role == role)
            .is_some_and(|d| d.sub == sub && d.token == fence_token)
    }) {
        return Ok(());
    }
    // Reading the token sequence takes the tables' owner.
    caller::as_owner(|| Spi::connect_mut(|client| token::require_issued(client, fence_token)))?;
    watch_subtransactions();
    with_declared(|declared| {
        declared.retain(|d| !(d.role == role && d.sub == sub));
        declared.push(Declared {
            role,
            sub,
            token: fence_token,
        });
    });
    Ok(())
}

/// Raises an error unless `fence_token` is a token lockext could have issued. (Not
/// SECURITY DEFINER: inside, the caller would be lost to the privilege check.)
// Its C symbol, check_token_0_3_wrapper, is one no older library has (compat.rs).
#[pg_extern(volatile, parallel_unsafe, name = "check_token")]
#[search_path(pg_catalog, pg_temp)]
fn check_token_0_3(fence_token: Option<i64>) {
    citus::refuse(
        "check_token checks a token without its lock, and tokens are ordered per lock id only",
        "Check the grant with lockext.lock_check(lock_id, fence_token), which Citus runs on \
         the node of its lock id.",
    )
    .or_report();
    caller::as_member(|| checked_token(fence_token)).or_report();
}

/// True while the grant with `fence_token` of `lock_id` is its live exclusive lease, by the
/// server's clock and the newest snapshot; a bound resource's writes check it (WRITE),
/// and again on the row a writer before them left. Not granted to anyone: lockext's own.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn exclusive_grant_live(lock_id: Text<'_>, fence_token: i64, holder_role: pg_sys::Oid) -> bool {
    read_now(
        &EXCLUSIVE_GRANT_LIVE,
        lock_id,
        fence_token,
        Some(holder_role),
    )
}

/// True while the grant with `fence_token` still holds a live lease on `lock_id`, by the
/// server's clock and the newest snapshot, whatever the caller's transaction has seen
/// (Chubby's CheckSequencer).
// Parallel unsafe: the newest snapshot cannot be taken during a parallel operation.
// Its C symbol, lock_check_0_3_wrapper, is one no older library has (compat.rs).
#[pg_extern(volatile, parallel_unsafe, name = "lock_check")]
#[search_path(pg_catalog, pg_temp)]
fn lock_check_0_3(lock_id: Option<Text<'_>>, fence_token: Option<i64>) -> bool {
    // As the tables' owner, as every routed call: on a Citus cluster, routing takes the
    // shard's metadata lock, which Citus grants only to the table's owner.
    caller::as_member(|| {
        let _routed = citus::route_arg("lock_id", lock_id, Access::Read)?;
        lease_is_live(lock_id, fence_token)
    })
    .or_report()
}

/// Binds `resource_id` to the lock that guards it, `lock_id` (NULL: unbinds it): from then
/// on the resource accepts only that lock's live exclusive grant, presented by the role
/// that took it (`WRITE`). An operator's decision, so `lockext_admin`'s only; the caller
/// is checked before the function becomes the tables' owner, which SECURITY DEFINER would
/// not allow.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn bind_resource(resource_id: Option<Text<'_>>, lock_id: Option<Text<'_>>) {
    caller::require(Needs::Admin {
        action: "bind a resource to a lock",
    })
    .and_then(|()| {
        caller::as_owner(|| {
            let routed = citus::route_arg("resource_id", resource_id, Access::Write)?;
            bind(resource_id, lock_id, Scope::of(&routed))
        })
    })
    .or_report()
}

pub fn fenced_write(
    resource_id: Option<Text<'_>>,
    fence_token: Option<i64>,
    data: Option<Jsonb>,
    scope: Scope,
) -> Result<bool, LockError> {
    let resource_id = error::identifier("resource_id", resource_id)?;
    let fence_token = error::token("fence_token", fence_token)?;
    let data = data.ok_or(LockError::NullArgument { arg: "data" })?;
    advance(resource_id, fence_token, Some(data), scope)
}

/// Where a fencing call's resource lives: on one server, beside every lock, its tokens
/// ordered with every lock's; on a Citus cluster (`citus::route`), in the shard of the lock
/// of its own id, and fenced by that lock's grants only (`citus::require_own_lock`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Server,
    Shard,
}

impl Scope {
    pub fn of(routed: &Option<citus::Routed>) -> Scope {
        if routed.is_some() {
            Scope::Shard
        } else {
            Scope::Server
        }
    }
}

fn fence_only(
    resource_id: Option<Text<'_>>,
    fence_token: Option<i64>,
) -> Result<Option<i64>, LockError> {
    let resource_id = error::identifier("resource_id", resource_id)?;
    let fence_token = error::token("fence_token", fence_token)?;
    if advance(resource_id, fence_token, None, Scope::Server)? {
        return Ok(None);
    }
    Spi::connect_mut(|client| {
        let args = Args::new()
            .set("resource_id", resource_id)
            .set("fence_token", fence_token);
        Ok(first_named::<i64>(
            HIGH_WATER_MARK.run(client, args)?,
            "mark",
        )?)
    })
}

fn bind(
    resource_id: Option<Text<'_>>,
    lock_id: Option<Text<'_>>,
    scope: Scope,
) -> Result<(), LockError> {
    let resource_id = error::identifier("resource_id", resource_id)?;
    let lock_id = lock_id
        .map(|id| error::identifier("lock_id", Some(id)))
        .transpose()?;
    if scope == Scope::Shard && lock_id.is_some() {
        citus::require_own_lock(resource_id, lock_id)?;
    }
    backend::writable_server()?;
    Spi::connect_mut(|client| {
        let args = Args::new()
            .set("resource_id", resource_id)
            .set("lock_id", lock_id);
        BIND.run(client, args)?;
        Ok(())
    })
}

fn checked_token(fence_token: Option<i64>) -> Result<(), LockError> {
    let fence_token = error::token("fence_token", fence_token)?;
    Spi::connect_mut(|client| token::require_issued(client, fence_token))
}

/// The one path every fenced write takes: refuse forged tokens, then move the resource's
/// high-water mark up (or keep it), storing `data` when given. False when stale.
fn advance(
    resource_id: Text<'_>,
    fence_token: i64,
    data: Option<Jsonb>,
    scope: Scope,
) -> Result<bool, LockError> {
    backend::writable_server()?;
    let accepted = Spi::connect_mut(|client| {
        // On a Citus cluster the node's ledger says nothing of a lock whose shard moved in:
        // the live grant the bound resource demands is the check.
        let statements: &'static [Statement] = match scope {
            Scope::Server => {
                token::require_issued(client, fence_token)?;
                &WRITE
            }
            Scope::Shard => {
                let rows =
                    RESOURCE_LOCK.run(client, Args::new().set("resource_id", resource_id))?;
                let bound = first_named::<TextBuf>(rows, "lock_id")?;
                citus::require_own_lock(resource_id, bound.as_ref().map(TextBuf::as_text))?;
                &WRITE_OWN_LOCK
            }
        };
        let replace = data.is_some();
        let args = || {
            Args::new()
                .set("resource_id", resource_id)
                .set("fence_token", fence_token)
                .set("data", data)
                .set("replace", replace)
                .set("role", caller::role())
        };
        // A refused write may still hold the resource's row (ON CONFLICT locks it before its
        // WHERE says no; an UPDATE that waited for it keeps the lock of the row whose recheck
        // said no): undone, so that a refused writer whose transaction stays open
        // (fenced_update answers false, it raises nothing) holds up no one.
        let stored = xact::first_found(client, statements, args, |rows| {
            Ok((!rows.is_empty()).then_some(()))
        })?;
        Ok::<_, LockError>(stored.is_some())
    })?;
    if !accepted {
        stats::count(Counter::FenceStale);
    }
    Ok(accepted)
}

fn lease_is_live(lock_id: Option<Text<'_>>, fence_token: Option<i64>) -> Result<bool, LockError> {
    let lock_id = error::identifier("lock_id", lock_id)?;
    let fence_token = error::token("fence_token", fence_token)?;
    Ok(read_now(&LEASE_IS_LIVE, lock_id, fence_token, None))
}

fn read_check(
    resource_id: Option<Text<'_>>,
    fence_token: Option<i64>,
    scope: Scope,
) -> Result<Option<TextBuf>, LockError> {
    let resource_id = error::identifier("resource_id", resource_id)?;
    let fence_token = error::token("fence_token", fence_token)?;
    // The share lock is kept only for a reader who may read: a refused one (who may not
    // hold the lock at all) must not hold up the resource's writers.
    let mut why = None;
    xact::kept_if_found(|| {
        why = refusal(resource_id, fence_token, scope)?;
        Ok(why.is_none().then_some(()))
    })?;
    if why.is_some() {
        stats::count(Counter::FenceStale);
    }
    Ok(why)
}

/// Why a reader may not read `resource_id` with `fence_token`, if it may not; takes the
/// resource's row share-locked.
fn refusal(
    resource_id: Text<'_>,
    fence_token: i64,
    scope: Scope,
) -> Result<Option<TextBuf>, LockError> {
    let (mark, guard) = Spi::connect_mut(|client| {
        if scope == Scope::Server {
            token::require_issued(client, fence_token)?;
        }
        let rows = READ_MARK.run(client, Args::new().set("resource_id", resource_id))?;
        let (mark, guard) = if rows.is_empty() {
            (None, None)
        } else {
            let row = rows.first();
            (
                row.get_by_name::<i64, _>("fence_token")?,
                row.get_by_name::<TextBuf, _>("lock_id")?,
            )
        };
        // Its binding read under the row's share lock: it holds to the end of the reader's
        // transaction.
        if scope == Scope::Shard {
            citus::require_own_lock(resource_id, guard.as_ref().map(TextBuf::as_text))?;
        }
        Ok::<_, LockError>((mark, guard))
    })?;
    if let Some(guard) = guard {
        if !read_now(
            &OWN_LEASE_LIVE,
            guard.as_text(),
            fence_token,
            Some(caller::role()),
        ) {
            // Text in the database's encoding, the lock id's bytes as they are: the SQL
            // wrapper raises it as the error's detail.
            return Ok(Some(TextBuf::from_bytes(
                [
                    &b"The resource is bound to lock \""[..],
                    guard.as_text().bytes(),
                    format!(
                        "\", and fence token {fence_token} is not a live lease of it held by this role."
                    )
                    .as_bytes(),
                ]
                .concat(),
            )));
        }
    }
    Ok(match mark {
        Some(mark) if mark > fence_token => Some(TextBuf::from_bytes(
            format!("A writer with fence token {mark} has written since.").into_bytes(),
        )),
        _ => None,
    })
}

/// A yes-or-no question about a grant (of `role`'s, when given), under the newest snapshot:
/// its column `live`.
fn read_now(
    question: &'static Statement,
    lock_id: Text<'_>,
    fence_token: i64,
    role: Option<pg_sys::Oid>,
) -> bool {
    let mut args = Args::new()
        .set("lock_id", lock_id)
        .set("fence_token", fence_token);
    if let Some(role) = role {
        args = args.set("role", role);
    }
    Spi::connect_mut(|_| {
        question
            .read_latest(args)
            .and_then(|row| row.get::<bool>("live"))
    }) == Some(true)
}
