//! This backend and its server, as PostgreSQL's globals describe them, read in one place:
//! its process, its database, its start, its role, its transaction, its latch and client,
//! the server's identity, timeline, data directory and limits, and the server's clock; and
//! the hooks it runs our code from (at exit, when an extension is dropped or a database
//! made, at the end of a transaction). Everything else asks here
//! instead of reading `pg_sys` globals itself.
//!
//! Why reading them is sound, once for all: every global read here is a plain value
//! (an integer, an oid, a flag, a pointer PostgreSQL sets once at start-up) of this
//! process, set before any extension code runs and only ever written by this process's
//! own thread (PostgreSQL backends are single-threaded; pgrx calls us on that thread).
//! Every function called here takes no pointer from us, or one to a value we own for the
//! call, and is one PostgreSQL documents as callable from any backend code.

use std::ffi::CStr;
use std::path::PathBuf;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::error::LockError;
use crate::pgversion;

/// This backend's process id.
pub fn pid() -> i32 {
    unsafe { pg_sys::MyProcPid }
}

/// This backend's slot in the server's process array (what a latch is set through).
pub fn procno() -> i32 {
    pgversion::procno()
}

/// The database this backend is connected to.
pub fn database() -> pg_sys::Oid {
    unsafe { pg_sys::MyDatabaseId }
}

/// When this backend started: with the pid, the name of one backend (pids are reused).
pub fn started() -> Result<TimestampWithTimeZone, LockError> {
    TimestampWithTimeZone::try_from(unsafe { pg_sys::MyStartTimestamp })
        .map_err(|_| LockError::ClockOutOfRange)
}

/// The current user: the role whose code is running now.
pub fn current_user() -> pg_sys::Oid {
    unsafe { pg_sys::GetUserId() }
}

/// This backend's number for its current transaction (not a transaction id: every
/// transaction has one, writing or not).
pub fn local_transaction() -> pg_sys::LocalTransactionId {
    pgversion::local_transaction()
}

/// Whether the transaction reads one snapshot throughout (REPEATABLE READ, SERIALIZABLE).
pub fn snapshot_per_transaction() -> bool {
    (unsafe { pg_sys::XactIsoLevel }) > pg_sys::XACT_READ_COMMITTED as i32
}

/// Whether the server is a hot standby (or still replaying WAL at start-up).
pub fn in_recovery() -> bool {
    unsafe { pg_sys::RecoveryInProgress() }
}

/// lockext writes on every call but lock_check-style reads; a standby cannot take writes,
/// and would otherwise fail deep inside with a message that names no lease.
pub fn writable_server() -> Result<(), LockError> {
    if in_recovery() {
        return Err(LockError::ReadOnlyServer);
    }
    Ok(())
}

/// The server's clock now, in PostgreSQL's microseconds: what `clock_timestamp()` reads.
pub fn clock() -> pg_sys::TimestampTz {
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// The server's clock now, as a timestamptz. Never the transaction's start (`now()`), which
/// inside a long transaction would make leases look younger than they are.
pub fn now() -> Result<TimestampWithTimeZone, LockError> {
    let now = TimestampWithTimeZone::try_from(clock()).map_err(|_| LockError::ClockOutOfRange);
    crate::explore::point(|| "after reading the clock".into());
    now
}

/// When the server started (`pg_postmaster_start_time()`), if it is in range.
pub fn server_started() -> Option<TimestampWithTimeZone> {
    TimestampWithTimeZone::try_from(unsafe { pg_sys::PgStartTime }).ok()
}

/// The timeline this server inserts WAL on; 0 in a backend of a server still in recovery.
pub fn wal_timeline() -> u32 {
    unsafe { pg_sys::GetWALInsertionTimeLine() }
}

/// The server's system identifier (pg_control's): a base backup and a standby share their
/// origin's; a new `initdb` makes another.
pub fn system_identifier() -> u64 {
    unsafe { pg_sys::GetSystemIdentifier() }
}

/// Whether the statement runs inside a transaction block (BEGIN ... COMMIT), not on its own.
pub fn in_transaction_block() -> bool {
    unsafe { pg_sys::IsTransactionBlock() }
}

/// Whether `xid` is this backend's current transaction's, or one of its subtransactions'.
pub fn is_current_transaction(xid: u32) -> bool {
    unsafe { pg_sys::TransactionIdIsCurrentTransactionId(xid.into()) }
}

/// The server's data directory. `DataDir` is set (absolute, NUL-terminated) before
/// shared_preload_libraries are loaded, and never changed after.
pub fn data_dir() -> PathBuf {
    let data = unsafe { CStr::from_ptr(pg_sys::DataDir) };
    PathBuf::from(data.to_string_lossy().into_owned())
}

/// Whether this is pg_upgrade's server (started with -b).
pub fn binary_upgrade() -> bool {
    unsafe { pg_sys::IsBinaryUpgrade }
}

/// Whether shared_preload_libraries are being loaded now: only then can an extension ask
/// for shared memory and register background workers.
pub fn preloading() -> bool {
    unsafe { pg_sys::process_shared_preload_libraries_in_progress }
}

/// The session's role as the outermost code sees it (`session_user` after SET ROLE), not
/// a SECURITY DEFINER function's.
pub fn outer_user() -> pg_sys::Oid {
    unsafe { pg_sys::GetOuterUserId() }
}

/// Whether a maintenance operation (ANALYZE, REINDEX, an index expression...) runs the
/// current code as a table owner.
pub fn in_security_restricted_operation() -> bool {
    unsafe { pg_sys::InSecurityRestrictedOperation() }
}

/// Whether a parallel operation is under way (no snapshot can be taken then).
pub fn in_parallel_mode() -> bool {
    unsafe { pg_sys::IsInParallelMode() }
}

/// The current subtransaction's id (1 for the top level).
pub fn subtransaction() -> pg_sys::SubTransactionId {
    unsafe { pg_sys::GetCurrentSubTransactionId() }
}

/// The database's server encoding (a `pg_enc` number).
pub fn database_encoding() -> i32 {
    unsafe { pg_sys::GetDatabaseEncoding() }
}

/// How many backends the server has room for (`MaxBackends`), set before shared memory is
/// asked for.
pub fn max_backends() -> i32 {
    unsafe { pg_sys::MaxBackends }
}

/// max_locks_per_transaction.
pub fn max_locks_per_transaction() -> i32 {
    unsafe { pg_sys::max_locks_per_xact }
}

// access/twophase.h (the max_prepared_transactions setting), which pgrx does not bind.
unsafe extern "C" {
    static max_prepared_xacts: std::os::raw::c_int;
}

/// max_prepared_transactions.
pub fn max_prepared_transactions() -> i32 {
    unsafe { max_prepared_xacts }
}

/// The user and security context the current code runs as.
pub fn user_and_context() -> (pg_sys::Oid, i32) {
    let (mut user, mut context) = (pg_sys::InvalidOid, 0);
    // Two out-parameters we own, written before the call returns.
    unsafe { pg_sys::GetUserIdAndSecContext(&mut user, &mut context) };
    (user, context)
}

/// Makes `user` and `context` current (as SECURITY DEFINER functions do); the caller puts
/// the previous ones back (it owns the restore, on every path out).
pub fn set_user_and_context(user: pg_sys::Oid, context: i32) {
    unsafe { pg_sys::SetUserIdAndSecContext(user, context) };
}

/// Writes `role` into this process's entry of the process array (`MyProc->roleId`), which
/// PostgreSQL's signalling rules read. `MyProc` is this process's own entry, set before a
/// background worker's main function runs; only this process writes its `roleId`.
pub fn set_process_role(role: pg_sys::Oid) {
    unsafe { (*pg_sys::MyProc).roleId = role };
}

/// Asks checkpoints to wait (`DELAY_CHKPT_START`) or stop waiting for this process: set
/// between writing a WAL record and what it describes. A flag of this process's own entry.
pub fn delay_checkpoint_start(delay: bool) {
    let flag = pg_sys::DELAY_CHKPT_START as i32;
    unsafe {
        if delay {
            (*pg_sys::MyProc).delayChkptFlags |= flag;
        } else {
            (*pg_sys::MyProc).delayChkptFlags &= !flag;
        }
    }
}

/// Runs `hook` when this process exits (`before_shmem_exit`: shared memory and the
/// catalogs are still there; hooks run last registered first). Sound: the function
/// pointer travels as the callback's Datum argument, the same size as a pointer, and is
/// turned back into the very `fn()` it was made from; the trampoline is `#[pg_guard]`, so
/// an ERROR or a panic in `hook` never unwinds into PostgreSQL's C frames.
pub fn at_exit(hook: fn()) {
    unsafe { pg_sys::before_shmem_exit(Some(run_exit_hook), pg_sys::Datum::from(hook as usize)) };
}

#[pg_guard]
unsafe extern "C-unwind" fn run_exit_hook(_code: std::ffi::c_int, arg: pg_sys::Datum) {
    let hook = unsafe { std::mem::transmute::<usize, fn()>(arg.value()) };
    hook();
}

/// The fraction of the server's notification queue in use (`pg_notification_queue_usage()`,
/// called directly: a SQL-callable C function of no arguments, which reads shared memory
/// under its own lock and returns a float8 by value).
pub fn notification_queue_usage() -> f64 {
    unsafe { pgrx::direct_function_call::<f64>(pg_sys::pg_notification_queue_usage, &[]) }
        .unwrap_or(0.0)
}

/// Sleeps `ms` milliseconds on this backend's latch in an exit hook, seen as an
/// `Extension` wait in pg_stat_activity; false when the postmaster is gone (there is then
/// nothing to wait for). Answers no interrupt: the backend is already on its way out, and
/// `WL_EXIT_ON_PM_DEATH` would start its exit again from inside it. Sound: `MyLatch` is
/// this process's own latch, set up before any hook can run.
pub fn nap_at_exit(ms: i64) -> bool {
    let events = (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_POSTMASTER_DEATH) as i32;
    let woke = unsafe {
        let woke = pg_sys::WaitLatch(pg_sys::MyLatch, events, ms, pg_sys::PG_WAIT_EXTENSION);
        pg_sys::ResetLatch(pg_sys::MyLatch);
        woke
    };
    woke & pg_sys::WL_POSTMASTER_DEATH as i32 == 0
}

/// Sleeps `micros` microseconds (interrupts are the caller's to check).
pub fn sleep_us(micros: i64) {
    unsafe { pg_sys::pg_usleep(micros as _) };
}

/// Sleeps on this backend's latch for at most `ms` milliseconds (less when it is set), seen
/// as an `Extension` wait in pg_stat_activity; ends the process if the postmaster dies.
/// Interrupts are the caller's to check. Sound: `MyLatch` is this process's own latch.
pub fn nap_on_latch(ms: i64) {
    let events = (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32;
    unsafe {
        pg_sys::WaitLatch(pg_sys::MyLatch, events, ms, pg_sys::PG_WAIT_EXTENSION);
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
}

// libpq/libpq.h, which pgrx does not bind: whether the client's socket is still open.
unsafe extern "C-unwind" {
    fn pq_check_connection() -> bool;
}

/// When this backend's client is gone, ends the session as PostgreSQL does when
/// client_connection_check_interval finds the client gone: FATAL "connection to client
/// lost" at the next CHECK_FOR_INTERRUPTS. Sound: `MyProcPort` is this process's own
/// (null in a background worker, which has no client); the flags are this process's.
pub fn end_if_client_gone() {
    unsafe {
        if !pg_sys::MyProcPort.is_null()
            && !pg_sys::ffi::pg_guard_ffi_boundary(|| pq_check_connection())
        {
            pg_sys::ClientConnectionLost = 1;
            pg_sys::InterruptPending = 1;
        }
    }
}

/// Sets the latch of the backend whose `pgprocno` is `procno` (a backend's place in the
/// server's process array), if there is one. Sound: the entry is looked up within
/// `allProcs`, which lives in shared memory as long as the server, and `SetLatch` may be
/// called on any process's latch.
pub fn set_latch_of(procno: usize) {
    unsafe {
        let procs = &*pg_sys::ProcGlobal;
        if procno < procs.allProcCount as usize {
            let proc_ = procs.allProcs.add(procno);
            pg_sys::SetLatch(&raw mut (*proc_).procLatch);
        }
    }
}

static mut PREV_OBJECT_ACCESS: pg_sys::object_access_hook_type = None;
static ON_EXTENSION_DROP: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();
static ON_DATABASE_CREATED: std::sync::OnceLock<fn(pg_sys::Oid)> = std::sync::OnceLock::new();
static ON_DEFINITIONS_CHANGED: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Runs `hook` in the dropping transaction whenever an extension is dropped on this server
/// (`DROP EXTENSION`, and `DROP SCHEMA ... CASCADE` or `DROP OWNED` that take one with
/// them), through PostgreSQL's object access hook. Call once, at preload.
pub fn on_extension_drop(hook: fn()) {
    if ON_EXTENSION_DROP.set(hook).is_ok() {
        hook_object_access();
    }
}

/// Runs `hook` with the new database's oid in the transaction of every `CREATE DATABASE`
/// on this server, once the database's row is made, through the object access hook. Call
/// once, at preload.
pub fn on_database_created(hook: fn(pg_sys::Oid)) {
    if ON_DATABASE_CREATED.set(hook).is_ok() {
        hook_object_access();
    }
}

/// Runs `hook` in the transaction of every definition made, changed or dropped in this
/// database (PostgreSQL's post-create, post-alter and drop events, of any kind of object:
/// a table, an index, a trigger, a rule, a policy, statistics, a function, an
/// inheritance link, an extension's members), whose object is not always visible to a
/// catalog lookup yet, so `hook` is not told which. Call once, at preload.
pub fn on_definitions_changed(hook: fn()) {
    if ON_DEFINITIONS_CHANGED.set(hook).is_ok() {
        hook_object_access();
    }
}

/// Puts `object_access` in front of the server's object access hook, once. Sound: the
/// previous hook is kept and called first, with the arguments as given; the hook is
/// `#[pg_guard]`, and reads nothing through its pointer argument.
fn hook_object_access() {
    static HOOKED: std::sync::Once = std::sync::Once::new();
    HOOKED.call_once(|| unsafe {
        PREV_OBJECT_ACCESS = pg_sys::object_access_hook;
        pg_sys::object_access_hook = Some(object_access);
    });
}

#[pg_guard]
extern "C-unwind" fn object_access(
    access: pg_sys::ObjectAccessType::Type,
    class_id: pg_sys::Oid,
    object_id: pg_sys::Oid,
    sub_id: std::ffi::c_int,
    arg: *mut std::ffi::c_void,
) {
    unsafe {
        if let Some(prev) = PREV_OBJECT_ACCESS {
            pg_sys::submodules::ffi::pg_guard_ffi_boundary(|| {
                prev(access, class_id, object_id, sub_id, arg)
            });
        }
    }
    if access == pg_sys::ObjectAccessType::OAT_DROP && class_id == pg_sys::ExtensionRelationId {
        if let Some(hook) = ON_EXTENSION_DROP.get() {
            hook();
        }
    }
    if matches!(
        access,
        pg_sys::ObjectAccessType::OAT_POST_CREATE
            | pg_sys::ObjectAccessType::OAT_POST_ALTER
            | pg_sys::ObjectAccessType::OAT_DROP
    ) {
        if let Some(hook) = ON_DEFINITIONS_CHANGED.get() {
            hook();
        }
    }
    if access == pg_sys::ObjectAccessType::OAT_POST_CREATE && class_id == pg_sys::DatabaseRelationId
    {
        if let Some(hook) = ON_DATABASE_CREATED.get() {
            hook(object_id);
        }
    }
}

/// A step of a transaction's end, for `on_transaction_end`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TransactionEnd {
    /// About to commit or to be prepared: nothing of it is visible to others yet, and no
    /// statement runs in it any more (deferred triggers have fired).
    Ending,
    /// Committed, and visible as committed to every snapshot taken from now on.
    Commit,
    /// Prepared for two-phase commit (its end is a later `COMMIT PREPARED`, maybe by
    /// another process, maybe after a restart).
    Prepare,
    Abort,
}

static ON_TRANSACTION_END: std::sync::OnceLock<fn(TransactionEnd)> = std::sync::OnceLock::new();

/// Runs `hook` at each step of the end of every top-level transaction of every process of
/// the server (a transaction callback registered at preload, which every process
/// inherits). A commit's `Commit` step is called after the transaction left the process
/// array (`CommitTransaction` runs the callbacks after `ProcArrayEndTransaction`), so a
/// snapshot taken once it has begun sees the commit; its `Ending` step before the commit
/// record is written. `hook` must not raise an error (a commit's callback is past the point
/// where the transaction could still fail). Call once, at preload. Sound: the callback
/// takes no pointer from us (its argument is null) and is `#[pg_guard]`.
pub fn on_transaction_end(hook: fn(TransactionEnd)) {
    if ON_TRANSACTION_END.set(hook).is_ok() {
        unsafe { pg_sys::RegisterXactCallback(Some(transaction_ended), std::ptr::null_mut()) };
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn transaction_ended(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    let end = match event {
        pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT | pg_sys::XactEvent::XACT_EVENT_PRE_PREPARE => {
            TransactionEnd::Ending
        }
        pg_sys::XactEvent::XACT_EVENT_COMMIT => TransactionEnd::Commit,
        pg_sys::XactEvent::XACT_EVENT_PREPARE => TransactionEnd::Prepare,
        pg_sys::XactEvent::XACT_EVENT_ABORT => TransactionEnd::Abort,
        _ => return,
    };
    if let Some(hook) = ON_TRANSACTION_END.get() {
        hook(end);
    }
}

/// Whether the current transaction has written anything (it has a transaction id: every
/// row it inserted, updated, deleted or locked assigned one, to it or to a subtransaction
/// and so to it).
pub fn transaction_has_written() -> bool {
    unsafe { pg_sys::GetTopTransactionIdIfAny() != pg_sys::InvalidTransactionId }
}

/// Whether this process is a logical replication worker (an apply, table-synchronisation
/// or parallel apply worker), which writes tables without the executor's statements.
pub fn is_logical_replication_worker() -> bool {
    unsafe { pg_sys::IsLogicalWorker() }
}
