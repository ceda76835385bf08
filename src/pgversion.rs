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
