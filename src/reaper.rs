//! The reaper: background workers that delete expired leases, so that a dead client's
//! lease is cleaned up by the server and no DBA has to schedule a job.
//!
//! Two kinds of process, after the pattern of a launcher and its per-database workers:
//! - the **launcher** (one, started with the server when lockext is preloaded) connects to
//!   no database. It starts one reaper per database named in `lockext.database` that
//!   exists, restarts a reaper that died, and stops one whose database left the list. A
//!   missing database is logged once and looked for again later: nothing crash-loops.
//! - a **reaper** connects to its database, and every `lockext.reap_interval` deletes
//!   expired leases in batches of `lockext.reap_batch_size`, each batch its own short
//!   transaction, skipping rows that a client has locked (`SKIP LOCKED`): it never waits
//!   for a client and a client never waits for it.
//!
//! Both sleep on their latch, reload settings on SIGHUP, exit on SIGTERM or when the
//! postmaster dies. They start only once the server accepts writes, so a hot standby runs
//! none; after promotion the postmaster starts them.

use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::time::Duration;

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BackgroundWorkerStatus, BgWorkerStartTime,
    DynamicBackgroundWorker, SignalWakeFlags,
};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::BuiltinOid::*;
use pgrx::prelude::*;

use crate::backend;
use crate::error::LockError;
use crate::settings;
use crate::statements::Statement;
use crate::status::Reporter;
use crate::text::TextBuf;
use crate::xact::in_transaction;

/// How often the launcher looks at its reapers and the database list.
const LAUNCHER_NAP: Duration = Duration::from_secs(5);
/// How soon the postmaster restarts the launcher after a crash.
const LAUNCHER_RESTART: Duration = Duration::from_secs(5);

/// When a lease's lock is free for others unless renewed: its expiry plus its lock-delay.
/// Indexed (`locks_free_at_idx`), for the reaper. `timestamptz + interval` is only STABLE
/// (a day or a month is not always as long, by the time zone); this adds the interval as
/// plain microseconds (a day 24 hours, a month 30 days), which no setting changes, so it is
/// IMMUTABLE. lockext stores every lock-delay as plain microseconds, where both agree.
#[pg_extern(immutable, strict, parallel_safe)]
fn free_at(expires_at: TimestampWithTimeZone, lock_delay: Interval) -> TimestampWithTimeZone {
    const DAY: i64 = 86_400_000_000;
    let delay = lock_delay
        .micros()
        .saturating_add(i64::from(lock_delay.days()).saturating_mul(DAY))
        .saturating_add(i64::from(lock_delay.months()).saturating_mul(30 * DAY));
    let at = pg_sys::TimestampTz::from(expires_at).saturating_add(delay);
    // Out of timestamptz's range only for rows no lockext function wrote: clamp to the end.
    TimestampWithTimeZone::try_from(at).unwrap_or(if delay >= 0 {
        TimestampWithTimeZone::positive_infinity()
    } else {
        TimestampWithTimeZone::negative_infinity()
    })
}

// What one batch deletes: expired exclusive leases, expired shared leases and permits.
static REAP: [Statement; 2] = [
    Statement {
        sql: include_str!("../sql/run/reaper/reap_locks.sql"),
        params: &[INT4OID, BOOLOID, TIMESTAMPTZOID],
    },
    Statement {
        sql: include_str!("../sql/run/reaper/reap_shared_leases.sql"),
        params: &[INT4OID, BOOLOID, TIMESTAMPTZOID],
    },
];

// And values whose grant is no longer live (src/election.rs), which nobody shows.
static REAP_VALUES: Statement = Statement {
    sql: include_str!("../sql/run/reaper/reap_values.sql"),
    params: &[INT4OID, TIMESTAMPTZOID],
};

// And session-bound leases whose session has ended without releasing them, in two steps
// (why two: lock_ended_sessions.sql): lock the rows that look dead, then delete those of
// them that still look dead.
static LOCK_ENDED_SESSIONS: Statement = Statement {
    sql: include_str!("../sql/run/reaper/lock_ended_sessions.sql"),
    params: &[INT4OID],
};

static END_LOCKED_SESSIONS: Statement = Statement {
    sql: include_str!("../sql/run/reaper/end_locked_sessions.sql"),
    params: &[
        BOOLOID,
        TEXTARRAYOID,
        TEXTARRAYOID,
        TEXTARRAYOID,
        TEXTARRAYOID,
    ],
};

pub fn register_launcher() {
    BackgroundWorkerBuilder::new("lockext launcher")
        .set_type("lockext launcher")
        .set_library("lockext")
        .set_function("lockext_launcher_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(LAUNCHER_RESTART))
        .load();
}

/// A worker runs as the bootstrap superuser, with the database's own search_path (and any
/// `ALTER DATABASE ... SET search_path`) unless told otherwise: a member who can create
/// objects in a schema on it (`public`, in many databases) could plant an `array_agg(text)`
/// or an operator that our statements would call as superuser. lockext's SQL functions pin
/// the path with their SET clause; a worker pins it here, above every other source.
fn pin_search_path() {
    unsafe {
        pg_sys::SetConfigOption(
            c"search_path".as_ptr(),
            c"pg_catalog, pg_temp".as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_OVERRIDE,
        )
    };
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn lockext_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // No database: the launcher reads only pg_database, a shared catalog.
    BackgroundWorker::connect_worker_to_spi(None, None);
    pin_search_path();
    let mut launcher = Launcher::default();
    loop {
        launcher.reconcile();
        if !BackgroundWorker::wait_latch(Some(LAUNCHER_NAP)) {
            break;
        }
        reload_settings_if_asked();
    }
    launcher.stop_all();
}

#[derive(Default)]
struct Launcher {
    reapers: HashMap<String, DynamicBackgroundWorker>,
    reported_missing: HashSet<String>,
}

impl Launcher {
    fn reconcile(&mut self) {
        let wanted = settings::databases();
        // Drop reapers that stopped (they are started again below) or are no longer wanted.
        let stale: Vec<String> = self
            .reapers
            .iter()
            .filter(|(db, worker)| !wanted.contains(db) || has_stopped(worker))
            .map(|(db, _)| db.clone())
            .collect();
        for db in stale {
            if let Some(worker) = self.reapers.remove(&db) {
                if !has_stopped(&worker) {
                    log!("lockext: stopping the reaper of database \"{db}\"");
                    worker.terminate();
                }
            }
        }
        for db in wanted {
            if !self.reapers.contains_key(&db) {
                self.start(db);
            }
        }
    }

    fn start(&mut self, db: String) {
        if !database_exists(&db) {
            if self.reported_missing.insert(db.clone()) {
                log!(
                    "lockext: database \"{db}\" named in lockext.database does not exist; \
                     its reaper will start when it does"
                );
            }
            return;
        }
        self.reported_missing.remove(&db);
        let started = BackgroundWorkerBuilder::new(&format!("lockext reaper {db}"))
            .set_type("lockext reaper")
            .set_library("lockext")
            .set_function("lockext_reaper_main")
            .enable_spi_access()
            .set_extra(&db)
            .set_notify_pid(backend::pid())
            .set_restart_time(None)
            .load_dynamic();
        match started {
            Ok(worker) => {
                self.reapers.insert(db, worker);
            }
            Err(e) => {
                log!("lockext: could not start the reaper of database \"{db}\": {e:?}")
            }
        }
    }

    fn stop_all(&mut self) {
        for (_, worker) in self.reapers.drain() {
            worker.terminate();
        }
    }
}

/// Whether `db` exists, read from pg_database with a plain scan: a process connected to no
/// database cannot use catalog indexes until some backend has cached them.
/// A reaper registered a moment ago has not started yet: that is not a dead one.
fn has_stopped(worker: &DynamicBackgroundWorker) -> bool {
    matches!(
        worker.pid(),
        Err(BackgroundWorkerStatus::Stopped | BackgroundWorkerStatus::PostmasterDied)
    )
}

fn database_exists(db: &str) -> bool {
    in_transaction(|| Ok(database_names().iter().any(|name| name == db))).unwrap_or(false)
}

fn database_names() -> Vec<String> {
    let mut names = Vec::new();
    unsafe {
        let rel = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as _);
        let scan = pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut());
        loop {
            let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tuple.is_null() {
                break;
            }
            let header = (*tuple).t_data;
            let row = (header as *const u8).add((*header).t_hoff as usize)
                as *const pg_sys::FormData_pg_database;
            let name = CStr::from_ptr((*row).datname.data.as_ptr());
            names.push(name.to_string_lossy().into_owned());
        }
        pg_sys::table_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as _);
    }
    names
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn lockext_reaper_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let db = BackgroundWorker::get_extra().to_string();
    BackgroundWorker::connect_worker_to_spi(Some(&db), None);
    unsafe { pg_sys::pgstat_report_appname(c"lockext reaper".as_ptr()) };
    pin_search_path();
    // Reaping is cleanup: a batch lost in a crash is deleted again in the next round.
    unsafe {
        pg_sys::SetConfigOption(
            c"synchronous_commit".as_ptr(),
            c"off".as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_OVERRIDE,
        )
    };
    let reporter = Reporter::claim(backend::database(), backend::pid());
    let mut reported_no_extension = false;
    let mut reported_version = None;
    loop {
        if !backend::in_recovery() {
            match reap_round(&reporter) {
                Ok(reaped) => {
                    reported_no_extension = false;
                    reported_version = None;
                    reporter.round_done(reaped, None);
                }
                Err(RoundError::NoExtension) => {
                    if !reported_no_extension {
                        log!("lockext: extension lockext is not installed in database \"{db}\"; the reaper waits for it");
                        reported_no_extension = true;
                    }
                    reporter.round_done(
                        0,
                        Some("extension lockext is not installed in this database"),
                    );
                }
                Err(RoundError::OtherVersion(version)) => {
                    let waits = crate::compat::reaper_waits(&version);
                    if reported_version.as_ref() != Some(&version) {
                        log!("lockext: database \"{db}\": {waits}");
                        reported_version = Some(version);
                    }
                    reporter.round_done(0, Some(&waits));
                }
                Err(RoundError::Failed { reaped, message }) => {
                    log!("lockext: the reaper of database \"{db}\" failed: {message}");
                    reporter.round_done(reaped, Some(&message));
                }
            }
        }
        let interval = Duration::from_millis(settings::REAP_INTERVAL_MS.get().max(1) as u64);
        if !BackgroundWorker::wait_latch(Some(interval)) {
            break;
        }
        reload_settings_if_asked();
    }
}

enum RoundError {
    NoExtension,
    /// The database's SQL objects are of another version than this library (between
    /// installing a package and ALTER EXTENSION UPDATE): the reaper's statements need this
    /// version's, and no backend of this library grants a lease there meanwhile.
    OtherVersion(String),
    Failed {
        reaped: u64,
        message: String,
    },
}

/// Deletes batches of expired leases until a batch comes back short. Returns how many.
fn reap_round(reporter: &Reporter) -> Result<u64, RoundError> {
    let installed = in_transaction(crate::compat::installed_version)
        .map_err(|message| RoundError::Failed { reaped: 0, message })?;
    match installed {
        None => return Err(RoundError::NoExtension),
        Some(version) if version != crate::compat::LIBRARY_VERSION => {
            return Err(RoundError::OtherVersion(version))
        }
        Some(_) => {}
    }
    let mut reaped = 0u64;
    loop {
        let batch_size = settings::REAP_BATCH_SIZE.get();
        let (n, more) = in_transaction(|| reap_batch(batch_size))
            .map_err(|message| RoundError::Failed { reaped, message })?;
        reaped += n;
        reporter.batch(n);
        crate::stats::add(crate::stats::Counter::LeasesReaped, n);
        if !more || BackgroundWorker::sigterm_received() {
            return Ok(reaped);
        }
    }
}

/// Deletes up to `limit` leases of each kind that `REAP` clears, and wakes their waiters at
/// commit. Returns how many, and whether any kind had more. Exposed to the tests, which
/// run it in a backend.
pub fn reap_batch(limit: i32) -> Result<(u64, bool), LockError> {
    Spi::connect_mut(|client| {
        let now = backend::now()?;
        let args = [
            DatumWithOid::from(limit),
            settings::NOTIFY.get().into(),
            now.into(),
        ];
        let (mut total, mut more) = (0, false);
        let ended = |rows: pgrx::spi::SpiTupleTable<'_>| -> Result<u64, LockError> {
            let n = rows.len() as u64;
            for row in rows {
                if let Some(lock_id) = row.get::<TextBuf>(1)? {
                    crate::wait::wake_head_at_commit(lock_id.as_text());
                }
            }
            Ok(n)
        };
        for statement in &REAP {
            let n = ended(statement.run(client, &args)?)?;
            more |= n >= limit as u64;
            total += n;
        }
        let values = REAP_VALUES.run(client, &[DatumWithOid::from(limit), now.into()])?;
        more |= values.len() >= limit as usize;
        // Session-bound leases whose session is gone: lock them, read the backend table
        // afresh, then end those still without a session.
        let locked = LOCK_ENDED_SESSIONS.run(client, &[DatumWithOid::from(limit)])?;
        let keys: Vec<Vec<TextBuf>> = if locked.is_empty() {
            vec![Vec::new(); 4]
        } else {
            let row = locked.first();
            (1..=4)
                .map(|i| {
                    Ok(row
                        .get::<Vec<Option<TextBuf>>>(i)?
                        .unwrap_or_default()
                        .into_iter()
                        .flatten()
                        .collect())
                })
                .collect::<Result<_, LockError>>()?
        };
        if keys.iter().any(|k| !k.is_empty()) {
            more |= keys[0].len() >= limit as usize || keys[2].len() >= limit as usize;
            unsafe { pg_sys::pgstat_clear_backend_activity_snapshot() };
            let [a, b, c, d] = <[Vec<TextBuf>; 4]>::try_from(keys)
                .map_err(|_| LockError::MissingColumn { name: "keys" })?;
            total += ended(END_LOCKED_SESSIONS.run(
                client,
                &[
                    settings::NOTIFY.get().into(),
                    a.into(),
                    b.into(),
                    c.into(),
                    d.into(),
                ],
            )?)?;
        }
        Ok((total, more))
    })
}

/// A worker must re-read postgresql.conf itself when told to (pg_reload_conf, SIGHUP).
fn reload_settings_if_asked() {
    if BackgroundWorker::sighup_received() {
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    }
}
