//! What differs between the PostgreSQL major versions lockext builds for (15 to 18), and
//! nothing else: every `#[cfg(feature = "pgNN")]` of the extension is in this file, so a
//! new major version is read about, and handled, here. The rest of the code asks these
//! functions and never names a version.
//!
//! | here | 15, 16 | 17 | 18 |
//! |---|---|---|---|
//! | `procno` | `MyProc->pgprocno` | `MyProcNumber` (the field is gone) | as 17 |
//! | `local_transaction` | `MyProc->lxid` | `MyProc->vxid.lxid` | as 17 |
//! | `on_sigterm` | `pqsignal` | as 15 | `pqsignal_be` (`pqsignal` is a macro for it in a backend) |
//! | `wal_register` | `XLogRegisterData(char *, int)`; 16: `(char *, uint32)` | as 16 | `(const void *, uint32)` |
//! | `on_statement_checked` | `ExecutorCheckPerms_hook(rangeTable, ...)`, each `RangeTblEntry`'s `requiredPerms`; 16: `(rangeTable, rtePermInfos, ...)`, each `RTEPermissionInfo`'s | as 16 | as 16 |

use pgrx::pg_sys;

/// This backend's slot in the server's process array (`ProcGlobal->allProcs`).
pub fn procno() -> i32 {
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    return unsafe { (*pg_sys::MyProc).pgprocno };
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    return unsafe { pg_sys::MyProcNumber };
}

/// This backend's number for its current transaction.
pub fn local_transaction() -> pg_sys::LocalTransactionId {
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    return unsafe { (*pg_sys::MyProc).lxid };
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    return unsafe { (*pg_sys::MyProc).vxid.lxid };
}

/// Installs `handler` for SIGTERM in this process.
pub fn on_sigterm(handler: pg_sys::pqsigfunc) {
    #[cfg(not(feature = "pg18"))]
    unsafe {
        pg_sys::pqsignal(pg_sys::SIGTERM as i32, handler)
    };
    #[cfg(feature = "pg18")]
    unsafe {
        pg_sys::pqsignal_be(pg_sys::SIGTERM as i32, handler)
    };
}

/// Adds `bytes` to the WAL record being built (after `XLogBeginInsert`). The record copies
/// nothing until `XLogInsert`, so `bytes` must live until then.
///
/// # Safety
/// Between `XLogBeginInsert` and `XLogInsert`, as PostgreSQL's own callers.
pub unsafe fn wal_register(bytes: &[u8]) {
    #[cfg(not(feature = "pg18"))]
    pg_sys::XLogRegisterData(
        bytes.as_ptr() as *mut std::os::raw::c_char,
        bytes.len() as _,
    );
    #[cfg(feature = "pg18")]
    pg_sys::XLogRegisterData(
        bytes.as_ptr() as *const std::ffi::c_void,
        bytes.len() as u32,
    );
}

static ON_STATEMENT_CHECKED: std::sync::OnceLock<fn(&[pg_sys::Oid])> = std::sync::OnceLock::new();
static mut PREV_CHECK_PERMISSIONS: pg_sys::ExecutorCheckPerms_hook_type = None;

/// Calls `checked` once for every statement about to run, with the relations it inserts
/// into or updates (`INSERT`, `UPDATE`, `MERGE`, `SELECT ... FOR UPDATE`, `COPY FROM`; none
/// for a read), in any process, whoever runs it, once PostgreSQL has found the privileges
/// it needs: the executor's permission hook, which every plan's start and every `COPY
/// FROM` passes, and which SQL cannot turn off. Call once, at preload. Sound: the previous hook is kept and
/// called first, with the arguments as given; the lists are PostgreSQL's, read while the
/// hook runs and never kept, each element of the node type the list holds (15: the range
/// table's `RangeTblEntry`s; 16 on: `RTEPermissionInfo`s, where each relation's required
/// privileges moved); the hook is `#[pg_guard]`.
pub fn on_statement_checked(checked: fn(&[pg_sys::Oid])) {
    if ON_STATEMENT_CHECKED.set(checked).is_ok() {
        unsafe {
            PREV_CHECK_PERMISSIONS = pg_sys::ExecutorCheckPerms_hook;
            pg_sys::ExecutorCheckPerms_hook = Some(check_permissions);
        }
    }
}

/// The elements of a `List` of pointers (null: none). Sound for a list PostgreSQL made, as
/// long as it is not changed while read: a `List` keeps its `length` cells in `elements`.
unsafe fn list_pointers<T>(list: *mut pg_sys::List) -> impl Iterator<Item = *mut T> {
    let (cells, length) = if list.is_null() {
        (std::ptr::null_mut(), 0)
    } else {
        ((*list).elements, (*list).length.max(0) as usize)
    };
    (0..length).map(move |i| (*cells.add(i)).ptr_value.cast::<T>())
}

/// The privileges that make a relation written.
const WRITES: pg_sys::AclMode = (pg_sys::ACL_INSERT | pg_sys::ACL_UPDATE) as pg_sys::AclMode;

#[cfg(feature = "pg15")]
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_permissions(
    range_table: *mut pg_sys::List,
    ereport_on_violation: bool,
) -> bool {
    if let Some(prev) = PREV_CHECK_PERMISSIONS {
        let allowed = pg_sys::submodules::ffi::pg_guard_ffi_boundary(|| {
            prev(range_table, ereport_on_violation)
        });
        if !allowed {
            return false;
        }
    }
    if let Some(checked) = ON_STATEMENT_CHECKED.get() {
        let written: Vec<pg_sys::Oid> = list_pointers::<pg_sys::RangeTblEntry>(range_table)
            .filter(|&entry| {
                (*entry).rtekind == pg_sys::RTEKind::RTE_RELATION
                    && (*entry).requiredPerms & WRITES != 0
            })
            .map(|entry| (*entry).relid)
            .collect();
        checked(&written);
    }
    true
}

#[cfg(not(feature = "pg15"))]
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_permissions(
    range_table: *mut pg_sys::List,
    permissions: *mut pg_sys::List,
    ereport_on_violation: bool,
) -> bool {
    if let Some(prev) = PREV_CHECK_PERMISSIONS {
        let allowed = pg_sys::submodules::ffi::pg_guard_ffi_boundary(|| {
            prev(range_table, permissions, ereport_on_violation)
        });
        if !allowed {
            return false;
        }
    }
    if let Some(checked) = ON_STATEMENT_CHECKED.get() {
        let written: Vec<pg_sys::Oid> = list_pointers::<pg_sys::RTEPermissionInfo>(permissions)
            .filter(|&info| (*info).requiredPerms & WRITES != 0)
            .map(|info| (*info).relid)
            .collect();
        checked(&written);
    }
    true
}
