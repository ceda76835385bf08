//! Every setting lockext reads, in one place. All are reloadable with SIGHUP (pg_reload_conf)
//! and shown by SHOW; README lists them.

use std::ffi::CString;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};

pub static DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));
pub static REAP_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);
pub static REAP_BATCH_SIZE: GucSetting<i32> = GucSetting::<i32>::new(1000);

pub fn define() {
    GucRegistry::define_string_guc(
        c"lockext.database",
        c"Databases whose expired leases the reaper clears (comma-separated).",
        c"One reaper process runs per listed database that exists.",
        &DATABASE,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lockext.reap_interval",
        c"How long the reaper sleeps between rounds.",
        c"A round deletes expired leases in batches until none are left.",
        &REAP_INTERVAL_MS,
        10,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"lockext.reap_batch_size",
        c"How many expired leases the reaper deletes in one transaction.",
        c"Small batches keep the reaper's transactions, and its row locks, short.",
        &REAP_BATCH_SIZE,
        1,
        100_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

/// The database names in `lockext.database`, trimmed, without empties or repeats.
pub fn databases() -> Vec<String> {
    let raw = DATABASE.get().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let mut names: Vec<String> = Vec::new();
    for name in raw.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    names
}
