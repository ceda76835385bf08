//! Background workers as PostgreSQL runs them, in one place: a worker started from Rust
//! (`Started`, whose handle is freed when it is dropped), asked whether it stopped, and
//! stopped; and what a worker process does to itself: leave on SIGTERM through
//! PostgreSQL's own `die`, reload its settings, override a setting for itself, name itself
//! in pg_stat_activity, and forget the activity snapshot it read; and the C symbol a
//! worker is started by (`entry_point!`). The reaper asks here instead of calling `pg_sys`
//! itself.
//!
//! Why the calls are sound: each is one PostgreSQL documents for a background worker (or
//! its launcher) and takes only values we own for the call (NUL-terminated strings,
//! out-parameters on our stack) or the handle `Started` owns; the handle is allocated in
//! TopMemoryContext, which lives as long as the process, and freed once, by `Drop`.

use std::ffi::CStr;

use pgrx::bgworkers::BackgroundWorkerBuilder;
use pgrx::pg_sys;

use crate::pgversion;

unsafe extern "C-unwind" {
    // PostgreSQL's own SIGTERM handler (tcop/postgres.c), by its C symbol: pg_sys::die is a
    // Rust wrapper around it, which must not run as a signal handler.
    #[link_name = "die"]
    fn postgres_die(signal: std::ffi::c_int);
}

/// Leaves on SIGTERM (a shutdown, `pg_terminate_backend`) as a backend does, through
/// PostgreSQL's own `die`: it sets `ProcDiePending`, so the next CHECK_FOR_INTERRUPTS ends
/// the process with FATAL wherever it is.
pub fn leave_on_sigterm() {
    pgversion::on_sigterm(Some(postgres_die));
}

/// Reads the configuration files again (after a SIGHUP).
pub fn reload_settings() {
    unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
}

/// Sets `name` to `value` for this process, above every other source (as a superuser's
/// override: the configuration files, ALTER DATABASE ... SET, ALTER ROLE ... SET).
pub fn override_setting(name: &CStr, value: &CStr) {
    unsafe {
        pg_sys::SetConfigOption(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_OVERRIDE,
        )
    };
}

/// Shows this process as `name` (application_name in pg_stat_activity).
pub fn report_name(name: &CStr) {
    unsafe { pg_sys::pgstat_report_appname(name.as_ptr()) };
}

/// Forgets the backend table this transaction read (pg_stat_activity's snapshot), so that
/// the next read sees it as it is now.
pub fn forget_activity_snapshot() {
    unsafe { pg_sys::pgstat_clear_backend_activity_snapshot() };
}

/// A dynamic background worker this process started.
pub struct Started {
    handle: *mut pg_sys::BackgroundWorkerHandle,
}

impl Started {
    /// Starts the worker `builder` describes; None when no background worker slot is free.
    pub fn start(builder: &BackgroundWorkerBuilder) -> Option<Started> {
        let mut worker: pg_sys::BackgroundWorker = builder.into();
        let mut handle: *mut pg_sys::BackgroundWorkerHandle = std::ptr::null_mut();
        // The handle outlives this call (the worker's life): not in a transaction's memory.
        let registered = unsafe {
            let old = pg_sys::MemoryContextSwitchTo(pg_sys::TopMemoryContext);
            let ok = pg_sys::RegisterDynamicBackgroundWorker(&mut worker, &mut handle);
            pg_sys::MemoryContextSwitchTo(old);
            ok
        };
        // Lazily: a `Started` made of the null handle of a failed start would be freed.
        registered.then(|| Started { handle })
    }

    /// Whether the worker has stopped (or the postmaster died).
    pub fn stopped(&self) -> bool {
        let mut pid: pg_sys::pid_t = 0;
        let status = unsafe { pg_sys::GetBackgroundWorkerPid(self.handle, &mut pid) };
        matches!(
            status,
            pg_sys::BgwHandleStatus::BGWH_STOPPED | pg_sys::BgwHandleStatus::BGWH_POSTMASTER_DIED
        )
    }

    /// Asks the postmaster to stop the worker (SIGTERM).
    pub fn terminate(&self) {
        unsafe { pg_sys::TerminateBackgroundWorker(self.handle) };
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        // Allocated by RegisterDynamicBackgroundWorker in TopMemoryContext (`start`).
        unsafe { pg_sys::pfree(self.handle.cast()) };
    }
}

/// `entry_point!(lockext_x_main => body)`: the function PostgreSQL starts a background
/// worker with (`BackgroundWorkerBuilder::set_function("lockext_x_main")`), exported by
/// that name, `#[pg_guard]`ed, running `body(arg)`. Sound: an exported name must be
/// unique among the symbols the server loads; every entry point's is `lockext_`-prefixed,
/// and two of one name in lockext fail to link.
macro_rules! entry_point {
    ($name:ident => $body:path) => {
        #[::pgrx::pg_guard]
        #[unsafe(no_mangle)]
        pub extern "C-unwind" fn $name(arg: ::pgrx::pg_sys::Datum) {
            $body(arg)
        }
    };
}
pub(crate) use entry_point;
