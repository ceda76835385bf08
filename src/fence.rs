//! Fencing: the resource side of the bargain. A write carries the writer's token, and a
//! resource accepts it only if no higher token has written there before.
//!
//! Three ways in, one code path (`advance`):
//! - `fenced_update` stores a JSON document for the resource (the article's resource);
//! - `lockext.fence` (sql/fence.sql) checks and records the token inside the caller's own
//!   transaction, so any write to any table in that transaction is fenced with it;
//! - `lockext.fence_guard` (sql/fence.sql), a trigger keeping a fence per row of a user
//!   table, whose writes without a token in the row use the one `declare_token` recorded.
//!
//! Readers check with `fence_read_check`. The SQL wrappers raise the stale-token error
//! themselves, with lockext's own SQLSTATE 55L01, which pgrx cannot carry through a Rust
//! function.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::{register_subxact_callback, PgSqlErrorCode, PgSubXactCallbackEvent};

use crate::backend;
use crate::caller::{self, Needs};
use crate::error::{self, LockError, OrReport};
use crate::statements::{first_named, Args, Statement};
use crate::stats::{self, Counter};
use crate::text::{Jsonb, Text, TextBuf};
use crate::token;
use crate::xact;

// The check and the write are one statement (why, and what a bound resource demands: the
// file's header).
static ADVANCE: Statement = Statement {
    sql: include_str!("../sql/run/fence/advance.sql"),
    params: &[
        ("resource_id", TEXTOID),
        ("fence_token", INT8OID),
        ("data", JSONBOID),
        ("replace", BOOLOID),
        ("role", OIDOID),
    ],
};

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
    caller::as_member(|| fenced_write(resource_id, fence_token, data)).or_report()
}

/// Records `fence_token` as `resource_id`'s high-water mark, in the caller's transaction
/// and under the resource's row lock. Returns NULL when accepted, or the newer token that
/// makes it stale. (`lockext.fence` turns the latter into an error.)
// Its C symbol, fence_advance_0_3_wrapper, is one no older library has (compat.rs).
#[pg_extern(volatile, parallel_unsafe, name = "fence_advance")]
#[search_path(pg_catalog, pg_temp)]
fn fence_advance_0_3(resource_id: Option<Text<'_>>, fence_token: Option<i64>) -> Option<i64> {
    caller::as_member(|| fence_only(resource_id, fence_token)).or_report()
}

/// A reader's check (`lockext.fence_read`): NULL when the reader may read `resource_id`
/// with `fence_token`, or why not (the 55L01 error's detail, which the SQL wrapper raises).
/// Keeps the resource's row share-locked to the end of the transaction.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn fence_read_check(resource_id: Option<Text<'_>>, fence_token: Option<i64>) -> Option<TextBuf> {
    caller::as_member(|| read_check(resource_id, fence_token)).or_report()
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
    caller::require(Needs::User)
        .and_then(|()| declare(fence_token))
        .or_report();
}

/// The token this transaction declared for the current role (`declare_token`), if any.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn declared_token() -> Option<i64> {
    caller::require(Needs::User).or_report();
    let role = backend::current_user();
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
    caller::require(Needs::User)
        .and_then(|()| declare(fence_token))
        .map(|()| match (fence_token, row_token) {
            (Some(writer), Some(row)) if writer < row => {
                stats::count(Counter::FenceStale);
                false
            }
            _ => true,
        })
        .or_report()
}

thread_local! {
    // Whether the UPDATE that fired fence_guard names the token column in its SET list,
    // for the trigger's body to read once (`token_column_named`); None outside an UPDATE.
    static NAMED: Cell<Option<bool>> = const { Cell::new(None) };
}

/// fence_guard's body (`lockext.fence_guard_row`, sql/fence.sql) asks, first thing, whether
/// the UPDATE that fired it names the token column in its SET list: true, false, or NULL
/// when it was not fired through `lockext.fence_guard` by an UPDATE. Answers once (a
/// second call says NULL). Reveals nothing of anyone else's, so PUBLIC's.
#[pg_extern(volatile, parallel_unsafe)]
fn token_column_named() -> Option<bool> {
    NAMED.take()
}

/// `lockext.fence_guard`, the trigger: learns from PostgreSQL which columns the UPDATE
/// names (`TriggerData.tg_updatedcols`, which a PL/pgSQL trigger cannot see), so that
/// `SET fence_token = <the row's own token>` counts as the writer's token, then runs the
/// body, `lockext.fence_guard_row`, as the same trigger call. Not a pgrx function: the
/// body raises lockext's own SQLSTATE 55L01, which must reach the client as it is, and a
/// pgrx boundary would turn any SQLSTATE it does not know into XX000. So nothing here has a
/// destructor: an ERROR of the body passes through this frame as PostgreSQL's own
/// longjmp, and the setup that may fail runs in `prepare_guard`, a guarded function.
///
/// # Safety
/// Called by PostgreSQL's function manager only, with a valid `fcinfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn lockext_fence_guard(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    unsafe {
        let mut body: pg_sys::FmgrInfo = std::mem::zeroed();
        prepare_guard(fcinfo, &mut body);
        let mut call: pg_sys::FunctionCallInfoBaseData = std::mem::zeroed();
        call.flinfo = &mut body;
        call.context = (*fcinfo).context;
        call.fncollation = pg_sys::InvalidOid;
        let Some(run) = body.fn_addr else {
            return pg_sys::Datum::from(0);
        };
        let result = run(&mut call);
        NAMED.set(None);
        (*fcinfo).isnull = call.isnull;
        result
    }
}

/// Version 1 of the function manager's calling convention, for `lockext_fence_guard`.
#[unsafe(no_mangle)]
pub extern "C" fn pg_finfo_lockext_fence_guard() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// What `lockext_fence_guard` does before the body runs: records whether the UPDATE names
/// the token column (`NAMED`), and finds the body (by its qualified name: no search path).
#[pg_guard]
unsafe extern "C-unwind" fn prepare_guard(
    fcinfo: pg_sys::FunctionCallInfo,
    body: *mut pg_sys::FmgrInfo,
) {
    unsafe {
        NAMED.set(update_names_token_column(fcinfo));
        let name = |part: &CStr| pg_sys::makeString(pg_sys::pstrdup(part.as_ptr())).cast();
        let names = pg_sys::lappend(
            pg_sys::lappend(std::ptr::null_mut(), name(c"lockext")),
            name(c"fence_guard_row"),
        );
        let oid = pg_sys::LookupFuncName(names, 0, std::ptr::null(), true);
        if oid == pg_sys::InvalidOid {
            NAMED.set(None);
            // Only a hand-made change to lockext's own objects gets here.
            ErrorReport::new(
                PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                "function lockext.fence_guard_row() does not exist",
                "lockext",
            )
            .set_hint("Create the extension again: lockext.fence_guard runs it.")
            .report(PgLogLevel::ERROR);
        }
        pg_sys::fmgr_info(oid, body);
    }
}

/// Whether the UPDATE that fired this trigger call names the column that the trigger's
/// first argument names; None for anything else (the body reports a misuse itself).
unsafe fn update_names_token_column(fcinfo: pg_sys::FunctionCallInfo) -> Option<bool> {
    unsafe {
        let context = (*fcinfo).context;
        if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_TriggerData {
            return None;
        }
        let data = context.cast::<pg_sys::TriggerData>();
        if (*data).tg_event & pg_sys::TRIGGER_EVENT_OPMASK != pg_sys::TRIGGER_EVENT_UPDATE {
            return None;
        }
        let trigger = (*data).tg_trigger;
        if trigger.is_null() || (*trigger).tgnargs < 1 || (*trigger).tgargs.is_null() {
            return None;
        }
        let attnum = pg_sys::SPI_fnumber((*(*data).tg_relation).rd_att, *(*trigger).tgargs);
        if attnum <= 0 {
            return None;
        }
        Some(pg_sys::bms_is_member(
            attnum - pg_sys::FirstLowInvalidHeapAttributeNumber,
            (*data).tg_updatedcols,
        ))
    }
}

fn declare(fence_token: Option<i64>) -> Result<(), LockError> {
    let fence_token = error::token("fence_token", fence_token)?;
    let role = backend::current_user();
    // Reading the token sequence takes the tables' owner.
    caller::as_owner(|| Spi::connect_mut(|client| token::require_issued(client, fence_token)))?;
    watch_subtransactions();
    let sub = backend::subtransaction();
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
    caller::as_member(|| checked_token(fence_token)).or_report();
}

/// True while the grant with `fence_token` of `lock_id` is its live exclusive lease, by the
/// server's clock and the newest snapshot; a bound resource's writes check it (ADVANCE)
/// once they hold the resource's row. Not granted to anyone: lockext's own.
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
    caller::require(Needs::User)
        .and_then(|()| lease_is_live(lock_id, fence_token))
        .or_report()
}

/// Binds `resource_id` to the lock that guards it, `lock_id` (NULL: unbinds it): from then
/// on the resource accepts only that lock's live exclusive grant, presented by the role
/// that took it (`ADVANCE`). An operator's decision, so `lockext_admin`'s only; the caller
/// is checked before the function becomes the tables' owner, which SECURITY DEFINER would
/// not allow.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn bind_resource(resource_id: Option<Text<'_>>, lock_id: Option<Text<'_>>) {
    caller::require(Needs::Admin {
        action: "bind a resource to a lock",
    })
    .and_then(|()| caller::as_owner(|| bind(resource_id, lock_id)))
    .or_report()
}

pub fn fenced_write(
    resource_id: Option<Text<'_>>,
    fence_token: Option<i64>,
    data: Option<Jsonb>,
) -> Result<bool, LockError> {
    let resource_id = error::identifier("resource_id", resource_id)?;
    let fence_token = error::token("fence_token", fence_token)?;
    let data = data.ok_or(LockError::NullArgument { arg: "data" })?;
    advance(resource_id, fence_token, Some(data))
}

fn fence_only(
    resource_id: Option<Text<'_>>,
    fence_token: Option<i64>,
) -> Result<Option<i64>, LockError> {
    let resource_id = error::identifier("resource_id", resource_id)?;
    let fence_token = error::token("fence_token", fence_token)?;
    if advance(resource_id, fence_token, None)? {
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

fn bind(resource_id: Option<Text<'_>>, lock_id: Option<Text<'_>>) -> Result<(), LockError> {
    let resource_id = error::identifier("resource_id", resource_id)?;
    let lock_id = lock_id
        .map(|id| error::identifier("lock_id", Some(id)))
        .transpose()?;
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
) -> Result<bool, LockError> {
    backend::writable_server()?;
    let accepted = Spi::connect_mut(|client| {
        token::require_issued(client, fence_token)?;
        let replace = data.is_some();
        let args = Args::new()
            .set("resource_id", resource_id)
            .set("fence_token", fence_token)
            .set("data", data)
            .set("replace", replace)
            .set("role", caller::role());
        // A refused upsert still holds the resource's row (ON CONFLICT locks it before its
        // WHERE says no): undone, so that a refused writer whose transaction stays open
        // (fenced_update answers false, it raises nothing) holds up no one.
        Ok::<_, LockError>(
            xact::kept_if_found(|| Ok((!ADVANCE.run(client, args)?.is_empty()).then_some(())))?
                .is_some(),
        )
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
) -> Result<Option<TextBuf>, LockError> {
    let resource_id = error::identifier("resource_id", resource_id)?;
    let fence_token = error::token("fence_token", fence_token)?;
    // The share lock is kept only for a reader who may read: a refused one (who may not
    // hold the lock at all) must not hold up the resource's writers.
    let mut why = None;
    xact::kept_if_found(|| {
        why = refusal(resource_id, fence_token)?;
        Ok(why.is_none().then_some(()))
    })?;
    if why.is_some() {
        stats::count(Counter::FenceStale);
    }
    Ok(why)
}

/// Why a reader may not read `resource_id` with `fence_token`, if it may not; takes the
/// resource's row share-locked.
fn refusal(resource_id: Text<'_>, fence_token: i64) -> Result<Option<TextBuf>, LockError> {
    let (mark, guard) = Spi::connect_mut(|client| {
        token::require_issued(client, fence_token)?;
        let rows = READ_MARK.run(client, Args::new().set("resource_id", resource_id))?;
        if rows.is_empty() {
            return Ok::<_, LockError>((None, None));
        }
        let row = rows.first();
        Ok((
            row.get_by_name::<i64, _>("fence_token")?,
            row.get_by_name::<TextBuf, _>("lock_id")?,
        ))
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
