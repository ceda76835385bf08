//! Every setting lockext reads, in one place. All are reloadable with SIGHUP (pg_reload_conf)
//! and shown by SHOW; docs/settings.md lists them.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::PostgresGucEnum;

use crate::guc;

/// What a grant's commit waits for. docs/settings.md explains the trade-off.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum Durability {
    /// Every granting transaction commits synchronously.
    #[name = c"grant"]
    Grant,
    /// Grants commit as the session says: a crash may lose a grant, never repeat a token.
    #[name = c"epoch"]
    Epoch,
}

pub static DURABILITY: GucSetting<Durability> = GucSetting::<Durability>::new(Durability::Grant);

// Set in the postmaster before it forks, so every backend of a preloading server sees it.
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Whether lockext was loaded by shared_preload_libraries (shared memory, workers).
pub fn preloaded() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

pub fn mark_preloaded() {
    PRELOADED.store(true, Ordering::Relaxed);
}

pub fn durability() -> Durability {
    DURABILITY.get()
}

pub static DATABASE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"*"));
pub static REAP_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);
pub static REAP_BATCH_SIZE: GucSetting<i32> = GucSetting::<i32>::new(1000);
pub static REAP_ROUND_BATCHES: GucSetting<i32> = GucSetting::<i32>::new(100);
pub static REAPER_DATABASES: GucSetting<i32> = GucSetting::<i32>::new(1024);
pub static LOCK_DELAY_MS: GucSetting<i32> = GucSetting::<i32>::new(0);
pub static NOTIFY: GucSetting<bool> = GucSetting::<bool>::new(false);
pub static NOTIFY_QUEUE_LIMIT: GucSetting<f64> = GucSetting::<f64>::new(0.5);
pub static SESSION_LEASES: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static VALUE_MAX_SIZE: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);

pub static ROLE_VALUES_SIZE: GucSetting<i32> = GucSetting::<i32>::new(16 * 1024 * 1024);

/// How many bytes of values one role may store in a database (`lockext.role_values_size`).
pub fn role_values_size() -> usize {
    usize::try_from(ROLE_VALUES_SIZE.get()).unwrap_or(0)
}

/// Largest value a grant may carry, in bytes of its jsonb (`lockext.value_max_size`).
pub fn value_max_size() -> usize {
    usize::try_from(VALUE_MAX_SIZE.get()).unwrap_or(0)
}

pub fn define() {
    GucRegistry::define_enum_guc(
        c"lockext.durability",
        c"What a grant's commit waits for: grant (flush every grant) or epoch.",
        c"epoch commits grants as the session's synchronous_commit says: a crash may \
          end a lease early, never repeat a token.",
        &DURABILITY,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"lockext.database",
        c"Databases whose expired leases the reaper clears: * (every database with lockext), \
          a comma-separated list, or empty for none.",
        c"The reaper enters no template and no database that does not allow connections.",
        &DATABASE,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lockext.reap_interval",
        c"The least time between two reaper rounds in one database.",
        c"A round runs where something is due (and in every database every 10 minutes); \
          the launcher notices a due database within this interval.",
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
    GucRegistry::define_int_guc(
        c"lockext.reap_round_batches",
        c"How many batches one round of the reaper runs at most.",
        c"A round ends after that many (or once a batch comes back short); what is left \
          waits for the next round, lockext.reap_interval later.",
        &REAP_ROUND_BATCHES,
        1,
        1_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // A postmaster setting can only be defined while the server starts: a backend that
    // loads lockext later (no preload) would fail with "cannot create PGC_POSTMASTER
    // variables after startup". Without preload there is no reaper to size anyway.
    if preloaded() {
        define_reaper_databases();
    }
    GucRegistry::define_int_guc(
        c"lockext.lock_delay",
        c"How long a lock stays unavailable after a lease expires without a release.",
        c"Gives resources that cannot check fence tokens a margin after a holder dies. \
          A clean release never delays. lock_acquire's lock_delay argument overrides it.",
        &LOCK_DELAY_MS,
        0,
        86_400_000,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_bool_guc(
        c"lockext.notify",
        c"Send NOTIFY lockext events on release, take-over and expiry.",
        c"Events are JSON objects, sent when the transaction commits.",
        &NOTIFY,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_float_guc(
        c"lockext.notify_queue_limit",
        c"From this fraction of the server's NOTIFY queue in use on, lockext sends no events.",
        c"A listener that never reads fills the cluster-wide queue, and a full queue fails \
          every notifying commit: lockext skips its events (counted in lockext.stats as \
          events_skipped) long before.",
        &NOTIFY_QUEUE_LIMIT,
        0.0,
        1.0,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"lockext.session_leases",
        c"Allow session-bound leases (lock_acquire's session_bound).",
        c"Turn it off for roles or databases whose clients come through a transaction-pooling \
          PgBouncer: there a server session outlives, and is shared by, its clients. Only a \
          superuser can change it, so ALTER ROLE ... SET sticks.",
        &SESSION_LEASES,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"lockext.value_max_size",
        c"Largest value a grant may carry (lock_campaign, lock_set_value), as jsonb.",
        c"A value is an address or a shard map that every follower reads at each change, \
          and each set writes it whole to the WAL. Only a superuser can change it, so \
          ALTER ROLE ... SET sticks.",
        &VALUE_MAX_SIZE,
        1,
        // The largest jsonb PostgreSQL stores (its entries' offsets are 28 bits).
        (1 << 28) - 1,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_int_guc(
        c"lockext.role_values_size",
        c"How many bytes of values one role may store in a database.",
        c"Each value counts as at least 1 kB, so checking it reads a bounded number of \
          rows. Only a superuser can change it, so ALTER ROLE ... SET sticks.",
        &ROLE_VALUES_SIZE,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    // Only after every setting is defined: reserving the prefix removes any lockext.*
    // value read from postgresql.conf that is not (yet) a defined setting.
    guc::reserve_prefix(c"lockext");
}

fn define_reaper_databases() {
    GucRegistry::define_int_guc(
        c"lockext.reaper_databases",
        c"How many databases reaper_status shows, and the reaper knows when each is due.",
        c"Set at server start (about 330 bytes of shared memory each). Databases beyond it \
          are still reaped, every lockext.reap_interval, idle or not, and are not shown.",
        &REAPER_DATABASES,
        16,
        100_000,
        GucContext::Postmaster,
        GucFlags::default(),
    );
}

/// Which databases `lockext.database` lets the reaper serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Databases {
    /// `*`: every database that allows connections, is no template and has lockext.
    Every,
    /// These names (trimmed, without empties or repeats); an empty list serves none.
    Named(Vec<String>),
}

impl Databases {
    pub fn includes(&self, name: &str) -> bool {
        match self {
            Databases::Every => true,
            Databases::Named(names) => names.iter().any(|n| n == name),
        }
    }
}

/// What `lockext.database` says now. A `*` anywhere in the list means every database,
/// like `listen_addresses = '*'`; names are compared as written (PostgreSQL's database
/// names are case-sensitive once created).
pub fn databases() -> Databases {
    let raw = DATABASE
        .get()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut names: Vec<String> = Vec::new();
    for name in raw.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if name == "*" {
            return Databases::Every;
        }
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    Databases::Named(names)
}
