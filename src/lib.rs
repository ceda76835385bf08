//! lockext: leases on named locks, with fencing tokens, inside PostgreSQL.
//!
//! This file only wires the modules together; each concern lives in its own file.

use pgrx::prelude::*;

mod adopted;
mod backend;
mod caller;
mod catalog;
mod citus;
mod claims;
mod commit;
mod compat;
mod election;
mod error;
mod events;
mod explore;
mod fence;
mod grant;
mod guc;
mod keepalive;
mod kind;
mod lease;
mod ledger;
mod locktable;
mod pgversion;
mod reaper;
mod session;
mod sets;
mod settings;
mod shmem;
mod statements;
mod stats;
mod status;
mod text;
mod token;
mod wait;
mod worker;
mod xact;

::pgrx::pg_module_magic!(name, version);

// Types, tables, sequence and privileges, created before the functions that use them.
extension_sql_file!("../sql/lockext.sql", name = "schema", bootstrap);
// lockext.fence and the fence_guard trigger, over the Rust fence functions.
extension_sql_file!(
    "../sql/fence.sql",
    name = "fence",
    requires = [
        fence::fence_advance_0_3,
        fence::check_token_0_3,
        fence::lock_check_0_3,
        fence::fence_read_check,
        fence::declare_token,
        fence::declared_token,
        fence::fence_row
    ]
);
// lock_set_value, over the Rust function that stores the value.
extension_sql_file!(
    "../sql/election.sql",
    name = "election",
    requires = [election::set_lease_value]
);
// The reaper's index, over a Rust function.
extension_sql_file!(
    "../sql/indexes.sql",
    name = "indexes",
    requires = [reaper::free_at]
);
// Views for operators.
extension_sql_file!(
    "../sql/views.sql",
    name = "views",
    requires = [stats::stats, wait::waiters]
);
// A warning when the server did not preload lockext: what is missing, and how to fix it.
extension_sql_file!(
    "../sql/preload.sql",
    name = "preload",
    requires = [stats::stats]
);
// lockext.citus_distribute(), over the lease functions it has Citus delegate.
extension_sql_file!(
    "../sql/citus.sql",
    name = "citus",
    requires = [
        lease::lock_acquire_0_3,
        lease::lock_renew_0_3,
        lease::lock_release_0_3,
        token::highest_issued_token
    ]
);
// Roles and EXECUTE grants, once the functions exist.
extension_sql_file!("../sql/privileges.sql", name = "privileges", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    error::keep_backtraces_out_of_errors();
    // Shared memory and background workers can only be set up at server start.
    let preloading = backend::preloading();
    if preloading {
        settings::mark_preloaded();
    }
    // Before settings::define, which reserves the lockext prefix.
    explore::define_settings();
    settings::define();
    if preloading {
        status::init_shared_memory();
        stats::init_shared_memory();
        ledger::init_shared_memory();
        ledger::register_rmgr();
        wait::init_shared_memory();
        claims::init_shared_memory();
        adopted::init_shared_memory();
        reaper::init_shared_memory();
        reaper::register_launcher();
        reaper::watch_drops();
    }
}

#[cfg(any(test, feature = "pg_test"))]
mod tests;

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        // Tokens come from the ledger, which needs the library preloaded.
        vec!["shared_preload_libraries = 'lockext'"]
    }
}
