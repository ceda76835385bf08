//! The reaper: background workers that delete expired leases, so that a dead client's
//! lease is cleaned up by the server and no DBA has to schedule a job or name a database.
//!
//! Wording: the **launcher** is one process, started with the server when lockext is
//! preloaded, connected to no database; a **round** is one short-lived worker that the
//! launcher starts for one database, which connects to it, deletes what has expired and
//! exits; a database is **served** while the launcher starts rounds for it.
//! - The launcher reads the shared catalog pg_database every `SCAN_INTERVAL` and serves
//!   every database that `lockext.database` lets it (`*`, the default: all of them) that
//!   allows connections, is no template and is not half-dropped. It cannot see a database's
//!   pg_extension, so the first round of each database looks: a database without lockext is
//!   looked at again every `PROBE_INTERVAL`, with a DEBUG line at most, and a database
//!   whose lockext was dropped is let go (its reaper_status row freed) the same way.
//! - A round deletes expired leases in batches of `lockext.reap_batch_size`, each batch its
//!   own short transaction, skipping rows that a client has locked (`SKIP LOCKED`): it
//!   never waits for a client and a client never waits for it, and at most
//!   `lockext.reap_round_batches` batches. It ends by publishing when the database is next
//!   **due** (`status.rs`: the earliest time anything there becomes reapable), which a
//!   transaction that writes an earlier expiry lowers when it commits.
//! - The launcher starts a round where the due time has passed, at least
//!   `lockext.reap_interval` after the database's last round ended; and, whatever the due
//!   time says, a database's first round (after start, a probe, a failure) and one every
//!   `SWEEP_INTERVAL`. So an idle database costs nothing between sweeps, and the rounds
//!   follow the expiries, not the number of databases. A database without an entry in
//!   `status` (more databases than `lockext.reaper_databases`) gets a round every interval.
//! - A value (`election.rs`) goes with its lease, in the statement that deletes or replaces
//!   the lease, so a round's cost follows what it deletes, not the values kept. Only a
//!   **sweep round** (a database's first, then one at least every `SWEEP_INTERVAL`:
//!   whichever round comes then) also reads every value, for those left behind
//!   (`reap_values.sql`).
//!
//! Why a process per round: PostgreSQL refuses DROP DATABASE (and ALTER DATABASE RENAME or
//! SET TABLESPACE, and CREATE DATABASE from it as a template) while another process is
//! connected to the database, after waiting 5 s for it to leave; it asks only autovacuum to
//! go. Between rounds no lockext process is connected, so the database is as free as one
//! without sessions. Those commands all lock the database object against new connections
//! first, and lockext watches that lock (`wanted_elsewhere`): the launcher starts no round
//! while it is held, and a running round stops at its next batch, so a round that is running
//! when the command comes delays it by one batch.
//!
//! Failures do not loop: a round that fails (or dies) makes its database wait twice as long
//! each time, up to `MAX_BACKOFF`. No free background worker slot is not the database's
//! failure: the launcher tries again an interval later, with no back-off, and takes at most
//! `MAX_ROUNDS` slots (plus its own). The launcher starts only once the server accepts writes,
//! so a hot standby runs none; after promotion the postmaster starts it. Both kinds of
//! process reload settings on SIGHUP and leave on SIGTERM or when the postmaster dies.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::pg_sys::BuiltinOid::*;
use pgrx::prelude::*;

use crate::backend;
use crate::caller::{self, Needs};
use crate::catalog;
use crate::error::{LockError, OrReport};
use crate::locktable::{self, Tried};
use crate::settings;
use crate::shmem::{self, Table};
use crate::statements::{first_named, Args, Statement};
use crate::status::{self, Reporter};
use crate::text::TextBuf;
use crate::worker;
use crate::xact::in_transaction;

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
        params: &[
            ("limit", INT4OID),
            ("notify", BOOLOID),
            ("now", TIMESTAMPTZOID),
        ],
    },
    Statement {
        sql: include_str!("../sql/run/reaper/reap_shared_leases.sql"),
        params: &[
            ("limit", INT4OID),
            ("notify", BOOLOID),
            ("now", TIMESTAMPTZOID),
        ],
    },
];

// And keep-alives (src/keepalive.rs): those expired are ended, then the leases attached
// to ended ones deleted once free, then the ended ones without leases, in two steps (why
// two: lock_ended_keepalives.sql).
static END_KEEPALIVES: Statement = Statement {
    sql: include_str!("../sql/run/reaper/end_keepalives.sql"),
    params: &[("limit", INT4OID), ("now", TIMESTAMPTZOID)],
};

static REAP_ATTACHED: [Statement; 2] = [
    Statement {
        sql: include_str!("../sql/run/reaper/reap_attached_locks.sql"),
        params: &[
            ("limit", INT4OID),
            ("notify", BOOLOID),
            ("now", TIMESTAMPTZOID),
        ],
    },
    Statement {
        sql: include_str!("../sql/run/reaper/reap_attached_shared_leases.sql"),
        params: &[
            ("limit", INT4OID),
            ("notify", BOOLOID),
            ("now", TIMESTAMPTZOID),
        ],
    },
];

static LOCK_ENDED_KEEPALIVES: Statement = Statement {
    sql: include_str!("../sql/run/reaper/lock_ended_keepalives.sql"),
    params: &[("limit", INT4OID)],
};

static PURGE_KEEPALIVES: Statement = Statement {
    sql: include_str!("../sql/run/reaper/purge_keepalives.sql"),
    params: &[("keepalives", INT8ARRAYOID)],
};

// Whether the schema is still the extension owner's.
static OWN_SCHEMA: Statement = Statement {
    sql: include_str!("../sql/run/reaper/own_schema.sql"),
    params: &[],
};

// And, in a sweep round only, values whose grant is gone that the statement which ended it
// left behind (src/election.rs), which nobody shows.
static REAP_VALUES: Statement = Statement {
    sql: include_str!("../sql/run/reaper/reap_values.sql"),
    params: &[("limit", INT4OID)],
};

// When the database next needs a round, read once a round has reaped.
static NEXT_DUE: Statement = Statement {
    sql: include_str!("../sql/run/reaper/next_due.sql"),
    params: &[("now", TIMESTAMPTZOID)],
};

// And session-bound leases whose session has ended without releasing them, in two steps
// (why two: lock_ended_sessions.sql): lock the rows that look dead, then delete those of
// them that still look dead.
static LOCK_ENDED_SESSIONS: Statement = Statement {
    sql: include_str!("../sql/run/reaper/lock_ended_sessions.sql"),
    params: &[("limit", INT4OID)],
};

static END_LOCKED_SESSIONS: Statement = Statement {
    sql: include_str!("../sql/run/reaper/end_locked_sessions.sql"),
    params: &[
        ("notify", BOOLOID),
        ("lock_ids", TEXTARRAYOID),
        ("owners", TEXTARRAYOID),
        ("shared_lock_ids", TEXTARRAYOID),
        ("shared_owners", TEXTARRAYOID),
    ],
};

/// How often the launcher reads pg_database for databases created, dropped or changed.
const SCAN_INTERVAL: Duration = Duration::from_secs(1);
/// How soon a database without lockext (or with lockext at another version) is looked at
/// again: CREATE EXTENSION is noticed this long after it commits, at most.
const PROBE_INTERVAL: Duration = Duration::from_secs(3);
/// How soon the launcher looks again at a database that a DROP DATABASE (or the like) has
/// locked: well within the 5 s that the command waits for others to leave.
const BUSY_RETRY: Duration = Duration::from_millis(500);
/// The longest a failing database waits between rounds (each failure doubles the wait).
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Rounds that run at once: each takes a background worker slot (max_worker_processes)
/// while it runs; more databases take turns. docs/errors.md, "Limits", names this number.
const MAX_ROUNDS: usize = 4;
/// How often a database that is not due gets a round anyway: for rows no lockext function
/// wrote (an INSERT by hand, a pg_restore into a served database), a due time missed
/// because the clock was set back. And how often, at least, a round is a sweep, which
/// also looks for values left behind (`reap_values.sql`). docs/errors.md, "Limits", names this number.
const SWEEP_INTERVAL: Duration = Duration::from_secs(600);
/// How soon the postmaster restarts the launcher after a crash.
const LAUNCHER_RESTART: Duration = Duration::from_secs(5);

/// What a round tells the launcher, in shared memory: one slot per round running at once.
/// The launcher fills a slot (the database, whether it was named) before it starts the
/// round, which writes its outcome before it exits; a slot still `Started` when its round
/// has stopped means the round died (FATAL, crash) before it could say.
#[derive(Clone, Copy, Default)]
struct Handoff {
    database: u32, // oid; 0 = free
    owner: u32,
    named: bool,
    /// A sweep round: also deletes the values left behind (`reap_values.sql`).
    sweep: bool,
    outcome: u8,
    detail_len: usize,
    detail: [u8; 32],
}

#[derive(Clone, Copy, Default)]
struct Handoffs {
    slots: [Handoff; MAX_ROUNDS],
}

shmem::plain!(Handoff {
    database,
    owner,
    named,
    sweep,
    outcome,
    detail_len,
    detail,
});
shmem::plain!(Handoffs { slots });

/// The hand-offs: a header and no rows.
static HANDOFFS: Table<Handoffs, ()> = Table::new(
    c"lockext_reaper_rounds",
    || 0,
    |_| Handoffs::default(),
    (),
    (),
);

pub fn init_shared_memory() {
    HANDOFFS.request();
}

/// The hand-offs under their lock, exclusive. The launcher and its rounds run only where
/// lockext is preloaded, so they are in shared memory.
fn handoffs() -> shmem::Write<Handoffs, ()> {
    HANDOFFS
        .write()
        .expect("the reaper's hand-offs are in shared memory")
}

/// How a round ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// Not written: the round has not ended, or died before it could say.
    Started,
    Reaped,
    Failed,
    NoExtension,
    /// lockext's SQL there is at this other version (see `RoundError::OtherVersion`).
    OtherVersion(String),
    /// A DROP DATABASE (or the like) wants the database: the round left it.
    SteppedAside,
    Standby,
}

impl Outcome {
    fn code(&self) -> u8 {
        match self {
            Outcome::Started => 0,
            Outcome::Reaped => 1,
            Outcome::Failed => 2,
            Outcome::NoExtension => 3,
            Outcome::OtherVersion(_) => 4,
            Outcome::SteppedAside => 5,
            Outcome::Standby => 6,
        }
    }

    fn read(slot: &Handoff) -> Outcome {
        match slot.outcome {
            1 => Outcome::Reaped,
            2 => Outcome::Failed,
            3 => Outcome::NoExtension,
            4 => Outcome::OtherVersion(
                String::from_utf8_lossy(&slot.detail[..slot.detail_len]).into_owned(),
            ),
            5 => Outcome::SteppedAside,
            6 => Outcome::Standby,
            _ => Outcome::Started,
        }
    }
}

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

/// Both kinds of process reload settings on SIGHUP, and leave on SIGTERM (a shutdown,
/// `pg_terminate_backend`) as a backend does, through PostgreSQL's own `die`: it sets
/// `ProcDiePending`, so the next CHECK_FOR_INTERRUPTS ends the process with FATAL wherever
/// it is, inside a running statement, a lock wait or a latch wait. A flag of our own would
/// be read only between statements, and a statement that ran for minutes kept the server
/// from stopping.
fn attach_signal_handlers() {
    worker::leave_on_sigterm();
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
}

/// A worker runs as the bootstrap superuser, with the database's own search_path (and any
/// `ALTER DATABASE ... SET search_path`) unless told otherwise: a member who can create
/// objects in a schema on it (`public`, in many databases) could plant an `array_agg(text)`
/// or an operator that our statements would call as superuser. lockext's SQL functions pin
/// the path with their SET clause; a worker pins it here, above every other source.
fn pin_search_path() {
    worker::override_setting(c"search_path", c"pg_catalog, pg_temp");
}

worker::entry_point!(lockext_launcher_main => launcher_main);

fn launcher_main(_arg: pg_sys::Datum) {
    attach_signal_handlers();
    // No database: the launcher reads only pg_database, a shared catalog.
    BackgroundWorker::connect_worker_to_spi(None, None);
    pin_search_path();
    let mut launcher = Launcher::new();
    let forget = ForgetRounds;
    backend::at_exit(stop_rounds_at_exit);
    loop {
        launcher.tick();
        // Woken early by a reload, or by the postmaster when a round starts or stops
        // (SIGUSR1, as the rounds' notify pid).
        if !BackgroundWorker::wait_latch(Some(launcher.nap())) {
            break;
        }
        if BackgroundWorker::sighup_received() {
            worker::reload_settings();
            launcher.reloaded();
        }
    }
    launcher.stop_all();
    drop(forget);
}

thread_local! {
    // The launcher's running rounds: kept here, not in the launcher's frame, so that its
    // exit hook (`stop_rounds_at_exit`) finds them. Borrowed only for a moment, never
    // across anything that can end the process.
    static ROUNDS: RefCell<Vec<Round>> = const { RefCell::new(Vec::new()) };
}

/// Forgets the running rounds without stopping them when the launcher's loop unwinds from
/// a panic (its exit hook then has none to stop); after a clean stop there are none.
struct ForgetRounds;

impl Drop for ForgetRounds {
    fn drop(&mut self) {
        ROUNDS.with(|rounds| {
            if let Ok(mut rounds) = rounds.try_borrow_mut() {
                rounds.clear();
            }
        });
    }
}

/// A launcher that leaves in the middle of its loop (SIGTERM, FATAL) stops its rounds as
/// one that leaves its loop does: a launcher started again would not know them. An exit
/// does not unwind the loop, so `ROUNDS` still has them.
fn stop_rounds_at_exit() {
    ROUNDS.with(|rounds| {
        if let Ok(mut rounds) = rounds.try_borrow_mut() {
            for round in rounds.drain(..) {
                round.terminate();
            }
        }
    });
}

/// Why a served database waits for its next round.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiting {
    /// `lockext.reap_interval` after its last round ended (re-read at a reload).
    Interval,
    /// Anything else: a look for lockext, a busy database, a back-off.
    Fixed,
}

/// A database the launcher serves.
struct Served {
    name: String,
    /// The database's owner (`datdba`): see `answer_to_owner`.
    owner: u32,
    /// Named in `lockext.database` (not only matched by `*`): a missing extension there
    /// is worth a LOG line, once.
    named: bool,
    next_round: Instant,
    last_end: Instant,
    waiting: Waiting,
    failures: u32,
    /// Its last round reaped and published when the database is next due (its entry in
    /// `status`): until then (a first round, a probe, a retry) rounds run whatever the
    /// entry says.
    settled: bool,
    /// When its last sweep round reaped (`None`: none yet, so its next round sweeps).
    last_sweep: Option<Instant>,
    /// Whether its running round, if any, is a sweep.
    sweeping: bool,
    /// What the launcher last logged about it, so that each thing is logged once.
    logged: Option<Outcome>,
}

/// A round running now: its worker and its handoff slot.
struct Round {
    database: u32,
    slot: usize,
    worker: worker::Started,
}

impl Round {
    fn stopped(&self) -> bool {
        self.worker.stopped()
    }

    fn terminate(&self) {
        self.worker.terminate();
    }
}

struct Launcher {
    served: HashMap<u32, Served>,
    next_scan: Instant,
    /// Whether the last round that could not start found no background worker slot free
    /// (logged once until a round starts again).
    slots_full: bool,
    /// Named databases the launcher cannot serve, with what it logged about each.
    unservable: HashMap<String, &'static str>,
}

impl Launcher {
    fn new() -> Launcher {
        Launcher {
            served: HashMap::new(),
            next_scan: Instant::now(),
            slots_full: false,
            unservable: HashMap::new(),
        }
    }

    fn tick(&mut self) {
        self.collect_finished();
        if Instant::now() >= self.next_scan {
            self.scan();
            self.next_scan = Instant::now() + SCAN_INTERVAL;
        }
        self.start_due();
    }

    /// How long the launcher may sleep: until the next scan or the next due round, and at
    /// most `lockext.reap_interval`, after which it reads the due times again (a
    /// transaction may have published an earlier one meanwhile).
    fn nap(&self) -> Duration {
        let now = Instant::now();
        let mut until = self.next_scan.min(now + reap_interval());
        if rounds_running() < MAX_ROUNDS {
            let dues = status::dues();
            let clock = backend::clock();
            for (oid, db) in &self.served {
                if !self.running(*oid) {
                    until = until.min(db.next_round.max(self.due_at(*oid, db, &dues, clock, now)));
                }
            }
        }
        until
            .saturating_duration_since(now)
            .max(Duration::from_millis(1))
    }

    /// When `db` needs its next round, whatever its spacing: now if it is not settled or
    /// has no entry (not due-tracked: every interval), else when its entry says, or at its
    /// sweep. `clock` and `now` are the same moment on both clocks.
    fn due_at(
        &self,
        oid: u32,
        db: &Served,
        dues: &HashMap<u32, i64>,
        clock: pg_sys::TimestampTz,
        now: Instant,
    ) -> Instant {
        let Some(&due) = dues.get(&oid).filter(|_| db.settled) else {
            return now;
        };
        let sweep = db.last_end + SWEEP_INTERVAL;
        if due <= clock {
            return now;
        }
        let wait = Duration::from_micros(u64::try_from(due.saturating_sub(clock)).unwrap_or(0));
        now.checked_add(wait).map_or(sweep, |at| at.min(sweep))
    }

    /// A reload may change the list and the interval: look again now, and move the rounds
    /// that wait for the interval to the new one (from an hour to a second, say).
    fn reloaded(&mut self) {
        self.next_scan = Instant::now();
        let interval = reap_interval();
        for db in self.served.values_mut() {
            if db.waiting == Waiting::Interval {
                db.next_round = db.last_end + interval;
            }
        }
    }

    fn running(&self, oid: u32) -> bool {
        ROUNDS.with_borrow(|rounds| rounds.iter().any(|r| r.database == oid))
    }

    /// Reads pg_database and settles which databases are served.
    fn scan(&mut self) {
        // pg_upgrade's server (-b) restores schemas, and drops and creates databases: no
        // round belongs there.
        let wanted = if backend::binary_upgrade() {
            settings::Databases::Named(Vec::new())
        } else {
            settings::databases()
        };
        let rows = match in_transaction(|| Ok(catalog::databases())) {
            Ok(rows) => rows,
            Err(message) => {
                log!("lockext: the launcher could not read pg_database: {message}");
                return;
            }
        };
        let now = Instant::now();
        let mut serving = HashSet::new();
        for row in &rows {
            if !wanted.includes(&row.name) {
                continue;
            }
            let named = matches!(wanted, settings::Databases::Named(_));
            if let Some(why) = row.not_enterable() {
                if named {
                    self.cannot_serve(&row.name, why);
                }
                continue;
            }
            self.unservable.remove(&row.name);
            serving.insert(row.oid);
            let db = self.served.entry(row.oid).or_insert_with(|| Served {
                name: row.name.clone(),
                owner: row.owner,
                named,
                next_round: now,
                last_end: now,
                waiting: Waiting::Fixed,
                failures: 0,
                settled: false,
                last_sweep: None,
                sweeping: false,
                logged: None,
            });
            db.name.clone_from(&row.name);
            db.owner = row.owner;
            db.named = named;
        }
        if let settings::Databases::Named(names) = &wanted {
            for name in names {
                if !rows.iter().any(|row| &row.name == name) {
                    self.cannot_serve(name, "does not exist; its reaper will start when it does");
                }
            }
        }
        // Let go of the rest: a dropped database, one no longer wanted.
        let gone: Vec<u32> = self
            .served
            .keys()
            .copied()
            .filter(|oid| !serving.contains(oid))
            .collect();
        for oid in gone {
            self.served.remove(&oid);
            let running = ROUNDS.with_borrow(|rounds| {
                rounds
                    .iter()
                    .find(|r| r.database == oid)
                    .map(Round::terminate)
                    .is_some()
            });
            // Its status row goes when the round has ended (`collect_finished`).
            if !running {
                status::forget(pg_sys::Oid::from(oid));
            }
        }
        self.unservable.retain(|name, _| wanted.includes(name));
    }

    fn cannot_serve(&mut self, name: &str, why: &'static str) {
        if self.unservable.get(name) != Some(&why) {
            log!("lockext: database \"{name}\" named in lockext.database {why}");
            self.unservable.insert(name.to_string(), why);
        }
    }

    /// Starts the rounds that are due, earliest first, while slots are free.
    fn start_due(&mut self) {
        let dues = status::dues();
        while rounds_running() < MAX_ROUNDS {
            let now = Instant::now();
            let clock = backend::clock();
            let Some(oid) = self
                .served
                .iter()
                .filter(|(oid, db)| {
                    db.next_round <= now
                        && !self.running(**oid)
                        && self.due_at(**oid, db, &dues, clock, now) <= now
                })
                .min_by_key(|(_, db)| db.next_round)
                .map(|(oid, _)| *oid)
            else {
                return;
            };
            let busy =
                in_transaction(|| Ok(wanted_elsewhere(pg_sys::Oid::from(oid)))).unwrap_or(true);
            if busy {
                self.wait(oid, BUSY_RETRY);
                continue;
            }
            match self.start(oid) {
                Ok(()) => self.slots_full = false,
                // Not the database's failure: no back-off. It is tried again an interval
                // later (not at once: the launcher would spin), and so is every database
                // due meanwhile; the slots are the server's (docs/errors.md, "Limits").
                Err(StartError::NoWorkerSlot) => {
                    crate::stats::count(crate::stats::Counter::ReaperSlotWaits);
                    if !self.slots_full {
                        log!(
                            "lockext: no background worker slot is free for a reaper round \
                             (max_worker_processes); the reaper tries again every \
                             lockext.reap_interval"
                        );
                        self.slots_full = true;
                    }
                    let retry = reap_interval();
                    for db in self.served.values_mut() {
                        if db.next_round <= now {
                            db.next_round = now + retry;
                        }
                    }
                    return;
                }
                Err(StartError::Other(why)) => {
                    let db = &self.served[&oid];
                    log!(
                        "lockext: could not start a reaper round for database \"{}\": {why}",
                        db.name
                    );
                    self.failed(oid);
                }
            }
        }
    }

    fn start(&mut self, oid: u32) -> Result<(), StartError> {
        let free = ROUNDS
            .with_borrow(|rounds| (0..MAX_ROUNDS).find(|i| !rounds.iter().any(|r| r.slot == *i)));
        let Some(slot) = free else {
            return Err(StartError::Other("every round slot is taken"));
        };
        let Some(db) = self.served.get_mut(&oid) else {
            return Err(StartError::Other("it is no longer served"));
        };
        db.sweeping = db
            .last_sweep
            .is_none_or(|at| at.elapsed() >= SWEEP_INTERVAL);
        handoffs().header().slots[slot] = Handoff {
            database: oid,
            owner: db.owner,
            named: db.named,
            sweep: db.sweeping,
            ..Handoff::default()
        };
        let builder = BackgroundWorkerBuilder::new(&format!("lockext reaper {}", db.name))
            .set_type("lockext reaper")
            .set_library("lockext")
            .set_function("lockext_reaper_main")
            .enable_spi_access()
            .set_argument(Some(pg_sys::Datum::from(slot)))
            .set_extra(&db.name)
            .set_notify_pid(backend::pid())
            .set_restart_time(None);
        let Some(worker) = worker::Started::start(&builder) else {
            handoffs().header().slots[slot] = Handoff::default();
            return Err(StartError::NoWorkerSlot);
        };
        ROUNDS.with_borrow_mut(|rounds| {
            rounds.push(Round {
                database: oid,
                slot,
                worker,
            })
        });
        Ok(())
    }

    /// Takes in the rounds that have ended and schedules each database's next one.
    fn collect_finished(&mut self) {
        let mut i = 0;
        loop {
            let round = match ROUNDS.with_borrow_mut(|rounds| match rounds.get(i) {
                None => Err(()),
                Some(round) if !round.stopped() => Ok(None),
                Some(_) => Ok(Some(rounds.swap_remove(i))),
            }) {
                Err(()) => break,
                Ok(None) => {
                    i += 1;
                    continue;
                }
                Ok(Some(round)) => round,
            };
            let outcome = {
                let mut handoffs = handoffs();
                let slots = &mut handoffs.header().slots;
                let outcome = Outcome::read(&slots[round.slot]);
                slots[round.slot] = Handoff::default();
                outcome
            };
            if self.served.contains_key(&round.database) {
                self.ended(round.database, outcome);
            } else {
                status::forget(pg_sys::Oid::from(round.database));
            }
        }
    }

    fn ended(&mut self, oid: u32, outcome: Outcome) {
        let Some(db) = self.served.get_mut(&oid) else {
            return;
        };
        let now = Instant::now();
        db.last_end = now;
        db.settled = outcome == Outcome::Reaped;
        if db.settled && db.sweeping {
            db.last_sweep = Some(now);
        }
        match &outcome {
            Outcome::Reaped => {
                db.failures = 0;
                db.logged = None;
                db.waiting = Waiting::Interval;
                db.next_round = now + reap_interval();
            }
            Outcome::NoExtension | Outcome::OtherVersion(_) => {
                db.failures = 0;
                if db.logged.as_ref() != Some(&outcome) {
                    match &outcome {
                        Outcome::OtherVersion(version) => log!(
                            "lockext: database \"{}\": {}",
                            db.name,
                            crate::compat::reaper_waits(version)
                        ),
                        // Only a database the setting names is expected to have it.
                        _ if db.named => log!(
                            "lockext: extension lockext is not installed in database \"{}\"; \
                             the reaper waits for it",
                            db.name
                        ),
                        _ => {}
                    }
                    db.logged = Some(outcome.clone());
                }
                if outcome == Outcome::NoExtension && !db.named {
                    // Never installed, or dropped: nothing to report until it comes.
                    status::forget(pg_sys::Oid::from(oid));
                }
                db.waiting = Waiting::Fixed;
                db.next_round = now + PROBE_INTERVAL;
            }
            Outcome::SteppedAside => self.wait(oid, BUSY_RETRY),
            Outcome::Standby => self.wait(oid, PROBE_INTERVAL),
            // The round said why in the log, or died (and the server said why).
            Outcome::Failed | Outcome::Started => self.failed(oid),
        }
    }

    fn wait(&mut self, oid: u32, wait: Duration) {
        if let Some(db) = self.served.get_mut(&oid) {
            db.waiting = Waiting::Fixed;
            db.next_round = Instant::now() + wait;
        }
    }

    /// A failed round: the next waits twice as long as the last, up to `MAX_BACKOFF`.
    fn failed(&mut self, oid: u32) {
        if let Some(db) = self.served.get_mut(&oid) {
            db.failures = db.failures.saturating_add(1);
            let base = reap_interval().max(Duration::from_secs(1));
            let wait = base
                .saturating_mul(1u32 << db.failures.min(16).saturating_sub(1))
                .min(MAX_BACKOFF);
            db.waiting = Waiting::Fixed;
            db.next_round = Instant::now() + wait;
        }
    }

    fn stop_all(&mut self) {
        for round in ROUNDS.take() {
            round.terminate();
        }
    }
}

/// Why a round could not start.
enum StartError {
    /// RegisterDynamicBackgroundWorker found every max_worker_processes slot taken.
    NoWorkerSlot,
    Other(&'static str),
}

/// How many rounds the launcher has running.
fn rounds_running() -> usize {
    ROUNDS.with_borrow(Vec::len)
}

fn reap_interval() -> Duration {
    Duration::from_millis(settings::REAP_INTERVAL_MS.get().max(1) as u64)
}

impl catalog::Database {
    fn not_enterable(&self) -> Option<&'static str> {
        if self.template {
            Some("is a template; the reaper never enters one")
        } else if !self.allows_connections {
            Some("does not allow connections; the reaper does not enter it")
        } else if self.invalid {
            Some("is invalid (a DROP DATABASE was interrupted); the reaper does not enter it")
        } else {
            None
        }
    }
}

/// Whether someone holds or waits for the database object `database` in a mode that keeps
/// new connections out: DROP DATABASE, ALTER DATABASE RENAME and SET TABLESPACE (access
/// exclusive), CREATE DATABASE with it as the template (share). Each of them then waits
/// for the database's other processes to leave. Tried with the lock every connection takes
/// at start-up (row exclusive), without waiting, and released at once. In a transaction.
fn wanted_elsewhere(database: pg_sys::Oid) -> bool {
    let tag = pg_sys::LOCKTAG {
        locktag_field1: 0, // a shared object: no database
        locktag_field2: pg_sys::DatabaseRelationId.to_u32(),
        locktag_field3: database.to_u32(),
        locktag_field4: 0,
        locktag_type: pg_sys::LockTagType::LOCKTAG_OBJECT as u8,
        locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
    };
    let mode = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
    if locktable::try_lock(&tag, mode) == Tried::NotAvailable {
        return true;
    }
    locktable::unlock(&tag, mode);
    false
}

/// What a round was started with, from its handoff slot.
struct Job {
    database: pg_sys::Oid,
    owner: pg_sys::Oid,
    named: bool,
    sweep: bool,
}

fn job(slot: usize) -> Option<Job> {
    let handoffs = HANDOFFS
        .read()
        .expect("the reaper's hand-offs are in shared memory");
    let job = handoffs.header().slots.get(slot)?;
    (job.database != 0).then(|| Job {
        database: pg_sys::Oid::from(job.database),
        owner: pg_sys::Oid::from(job.owner),
        named: job.named,
        sweep: job.sweep,
    })
}

/// Makes this round a process of the database's owner for PostgreSQL's signalling rules,
/// while it keeps running as the bootstrap superuser. A background worker belongs to no
/// role (`roleId` 0), and DROP DATABASE ... WITH (FORCE) refuses (42501) to end a process
/// of a role its caller is not a member of; so a round connected at that moment would make
/// the owner's FORCE fail where a database without sessions lets it through. As the
/// owner's, the round is ended by the owner's FORCE (and pg_terminate_backend), as the
/// owner's own sessions are. Nothing else reads it of a background worker: connection
/// limits do not count background workers, and pg_stat_activity shows the session user.
fn answer_to_owner(owner: pg_sys::Oid) {
    if owner != pg_sys::InvalidOid {
        backend::set_process_role(owner);
    }
}

fn finish(slot: usize, outcome: &Outcome) {
    let mut handoffs = handoffs();
    if let Some(job) = handoffs.header().slots.get_mut(slot) {
        job.outcome = outcome.code();
        if let Outcome::OtherVersion(version) = outcome {
            let bytes = version.as_bytes();
            let len = bytes.len().min(job.detail.len());
            job.detail[..len].copy_from_slice(&bytes[..len]);
            job.detail_len = len;
        }
    }
}

worker::entry_point!(lockext_reaper_main => round_main);

/// One round in one database: the worker the launcher starts, which exits when done.
fn round_main(arg: pg_sys::Datum) {
    attach_signal_handlers();
    let slot = arg.value();
    let Some(Job {
        database,
        owner,
        named,
        sweep,
    }) = job(slot)
    else {
        return;
    };
    // By oid: a database renamed since the launcher's scan is still the one meant. One
    // dropped since makes PostgreSQL end this process (FATAL, "does not exist").
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(database), None);
    answer_to_owner(owner);
    worker::report_name(c"lockext reaper");
    pin_search_path();
    // A round never queues behind a lock (a DDL statement, or a database owner's VACUUM
    // FULL waiting behind its own open transaction) for long: it fails, backs off, and
    // gives its slot to another database's round.
    worker::override_setting(c"lock_timeout", c"1s");
    // Reaping is cleanup: a batch lost in a crash is deleted again in the next round.
    worker::override_setting(c"synchronous_commit", c"off");
    let outcome = if backend::in_recovery() {
        Outcome::Standby
    } else {
        one_round(database, named, sweep)
    };
    finish(slot, &outcome);
}

fn one_round(database: pg_sys::Oid, named: bool, sweep: bool) -> Outcome {
    let reporter = || Reporter::claim(database, backend::pid());
    match reap_round(database, sweep, &reporter) {
        Ok(None) => Outcome::SteppedAside,
        Ok(Some((reporter, reaped))) => {
            reporter.round_done(reaped, None);
            Outcome::Reaped
        }
        Err(RoundError::NoExtension) => {
            debug1!(
                "lockext: no extension lockext in database \"{}\"; looked for again in {} s",
                database_name(),
                PROBE_INTERVAL.as_secs()
            );
            if named {
                reporter().round_done(
                    0,
                    Some("extension lockext is not installed in this database"),
                );
            }
            Outcome::NoExtension
        }
        Err(RoundError::OtherVersion(version)) => {
            reporter().round_done(0, Some(&crate::compat::reaper_waits(&version)));
            Outcome::OtherVersion(version)
        }
        Err(RoundError::Failed { reaped, message }) => {
            log!(
                "lockext: the reaper of database \"{}\" failed: {message}",
                database_name()
            );
            reporter().round_done(reaped, Some(&message));
            Outcome::Failed
        }
    }
}

/// The name the launcher knew the database by (a catalog lookup needs a transaction).
fn database_name() -> &'static str {
    BackgroundWorker::get_extra()
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

/// Deletes batches of expired leases until a batch comes back short or
/// `lockext.reap_round_batches` of them ran, or until a DROP DATABASE (or the like) wants
/// the database (then `None`). A sweep round's batches also delete values left behind.
/// Returns the round's reporter and how many it deleted.
fn reap_round(
    database: pg_sys::Oid,
    sweep: bool,
    reporter: &impl Fn() -> Reporter,
) -> Result<Option<(Reporter, u64)>, RoundError> {
    // What the database has, in the round's first transaction: lockext's version, and
    // whether its schema is still the extension owner's (`own_schema.sql`).
    let installed = in_transaction(|| {
        if wanted_elsewhere(database) {
            return Ok(None);
        }
        let Some(version) = crate::compat::installed_version()? else {
            return Ok(Some(None));
        };
        let own = Spi::connect_mut(|client| {
            Ok::<_, LockError>(first_named::<bool>(
                OWN_SCHEMA.run(client, Args::new())?,
                "own",
            )?)
        })?;
        if own == Some(true) && !backend::in_recovery() {
            // The token ledger learns of this database's history within a round of the
            // server's start, whatever version its SQL is: before a reinstall or a DROP
            // DATABASE could take that evidence away (`token.rs`).
            Spi::connect_mut(|_| crate::token::adopt())?;
        }
        Ok(Some(Some((version, own))))
    })
    .map_err(|message| RoundError::Failed { reaped: 0, message })?;
    let own = match installed {
        None => return Ok(None),
        Some(None) => return Err(RoundError::NoExtension),
        Some(Some((version, _))) if version != crate::compat::LIBRARY_VERSION => {
            return Err(RoundError::OtherVersion(version))
        }
        Some(Some((_, own))) => own,
    };
    if own != Some(true) {
        return Err(RoundError::Failed {
            reaped: 0,
            message: "schema lockext is not owned by the extension's owner (or was \
                      renamed): its objects could be another role's, and the reaper runs as \
                      superuser, so it does not reap this database"
                .to_string(),
        });
    }
    let reporter = reporter();
    let mut reaped = 0u64;
    let mut batches = 0;
    loop {
        let batch_size = settings::REAP_BATCH_SIZE.get();
        let batch = in_transaction(|| {
            if wanted_elsewhere(database) {
                return Ok(None);
            }
            reap_batch(batch_size, sweep).map(Some)
        });
        let (n, more) = match batch {
            Ok(Some(batch)) => batch,
            Ok(None) => {
                reporter.round_done(reaped, None);
                return Ok(None);
            }
            Err(message) => {
                reporter.round_done(reaped, Some(&message));
                return Err(RoundError::Failed { reaped, message });
            }
        };
        reaped += n;
        reporter.batch(n);
        crate::stats::add(crate::stats::Counter::LeasesReaped, n);
        // Bounded by the operator's setting: each batch is bounded (its statements' plans
        // are), so a round ends within reap_round_batches of them.
        batches += 1;
        if !more || batches >= settings::REAP_ROUND_BATCHES.get() {
            // Publications from here on are kept apart: the snapshot of `next_due` might
            // not see what they wrote (`status`).
            reporter.computing_due();
            return match in_transaction(next_due) {
                Ok(due) => {
                    reporter.due(due);
                    Ok(Some((reporter, reaped)))
                }
                Err(message) => {
                    reporter.round_done(reaped, Some(&message));
                    Err(RoundError::Failed { reaped, message })
                }
            };
        }
        pg_sys::check_for_interrupts!();
        if BackgroundWorker::sighup_received() {
            worker::reload_settings();
        }
    }
}

/// Watches for an extension being dropped (`DROP EXTENSION`, and `DROP SCHEMA ... CASCADE`
/// or `DROP OWNED` that take one with them): its database becomes due when the dropping
/// transaction commits, so that a round finds lockext gone and the launcher lets the
/// database go (its reaper_status row with it) at once, as when a round ran every
/// interval; an idle database would otherwise keep its row until its sweep. Any
/// extension: a round too many costs one round. An object access hook
/// (`backend::on_extension_drop`), not a utility hook: it is called for the one object,
/// and wraps no statement's execution (whose errors would pass through it).
pub fn watch_drops() {
    backend::on_extension_drop(status::due_now);
}

/// When the database next needs a round (a TimestampTz; timestamptz's infinity: never).
fn next_due() -> Result<pg_sys::TimestampTz, LockError> {
    let dues = crate::citus::on_each_local_shard(next_due_here)?;
    Ok(dues.into_iter().min().unwrap_or(status::NEVER))
}

fn next_due_here() -> Result<pg_sys::TimestampTz, LockError> {
    Spi::connect_mut(|client| {
        let now = backend::now()?;
        let due = first_named::<TimestampWithTimeZone>(
            NEXT_DUE.run(client, Args::new().set("now", now))?,
            "due",
        )?;
        Ok(due.map_or(status::NEVER, pg_sys::TimestampTz::from))
    })
}

/// Ends this database's expired leases now, in the caller's transaction: one batch of the
/// reaper's own (`reap_batch`, up to `lockext.reap_batch_size` of each kind, values left
/// behind swept too), and answers how many leases it ended. Rows a client has locked are
/// skipped, as in a round. For an operator who wants them gone before the next round, and
/// for the schedule explorer, which stops a batch at each of its pause points (a round runs
/// in a background worker, which no client can stop and let go on). Deleting only what has
/// expired is what every round does, but when is an operator's decision: lockext_admin's.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn reap() -> i64 {
    caller::require(Needs::Admin {
        action: "end expired leases with lockext.reap()",
    })
    .and_then(|()| caller::as_owner(|| reap_batch(settings::REAP_BATCH_SIZE.get(), true)))
    .map(|(ended, _)| i64::try_from(ended).unwrap_or(i64::MAX))
    .or_report()
}

/// Deletes up to `limit` leases of each kind that `REAP` clears (with their values), and
/// wakes their waiters at commit; in a `sweep`, also up to `limit` values left behind.
/// Returns how many leases, and whether any kind had more. Also run by `lockext.reap()`,
/// in a client's backend.
pub fn reap_batch(limit: i32, sweep: bool) -> Result<(u64, bool), LockError> {
    let batches = crate::citus::on_each_local_shard(|| reap_batch_here(limit, sweep))?;
    Ok(batches
        .into_iter()
        .fold((0, false), |(total, more), (n, m)| (total + n, more || m)))
}

/// `reap_batch` on the tables as the statements name them (on a Citus worker, one group of
/// its shards: `citus::on_each_local_shard`).
fn reap_batch_here(limit: i32, sweep: bool) -> Result<(u64, bool), LockError> {
    Spi::connect_mut(|client| {
        let now = backend::now()?;
        let notify = crate::events::enabled();
        let batch = || {
            Args::new()
                .set("limit", limit)
                .set("notify", notify)
                .set("now", now)
        };
        let (mut total, mut more) = (0, false);
        let ended = |rows: pgrx::spi::SpiTupleTable<'_>| -> Result<u64, LockError> {
            let n = rows.len() as u64;
            for row in rows {
                if let Some(lock_id) = row.get_by_name::<TextBuf, _>("lock_id")? {
                    crate::wait::wake_head_at_commit(lock_id.as_text());
                }
            }
            Ok(n)
        };
        for statement in &REAP {
            let n = ended(statement.run(client, batch())?)?;
            more |= n >= limit as u64;
            total += n;
        }
        let expired =
            END_KEEPALIVES.run(client, Args::new().set("limit", limit).set("now", now))?;
        more |= expired.len() >= limit as usize;
        for statement in &REAP_ATTACHED {
            let n = ended(statement.run(client, batch())?)?;
            more |= n >= limit as u64;
            total += n;
        }
        let locked = LOCK_ENDED_KEEPALIVES.run(client, Args::new().set("limit", limit))?;
        let keepalives: Vec<i64> = first_named::<Vec<Option<i64>>>(locked, "keepalives")?
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .collect();
        if !keepalives.is_empty() {
            let locked_all = keepalives.len() >= limit as usize;
            let purged = PURGE_KEEPALIVES
                .run(client, Args::new().set("keepalives", keepalives))?
                .len();
            more |= locked_all && purged > 0; // a full batch that made progress: go on
        }
        if sweep {
            let values = REAP_VALUES.run(client, Args::new().set("limit", limit))?;
            more |= values.len() >= limit as usize;
        }
        // Session-bound leases whose session is gone: lock them, read the backend table
        // afresh, then end those still without a session.
        let locked = LOCK_ENDED_SESSIONS.run(client, Args::new().set("limit", limit))?;
        const KEYS: [&str; 4] = ["lock_ids", "owners", "shared_lock_ids", "shared_owners"];
        let keys: Vec<Vec<TextBuf>> = if locked.is_empty() {
            vec![Vec::new(); 4]
        } else {
            let row = locked.first();
            KEYS.iter()
                .map(|&column| {
                    Ok(row
                        .get_by_name::<Vec<Option<TextBuf>>, _>(column)?
                        .unwrap_or_default()
                        .into_iter()
                        .flatten()
                        .collect())
                })
                .collect::<Result<_, LockError>>()?
        };
        if keys.iter().any(|k| !k.is_empty()) {
            more |= keys[0].len() >= limit as usize || keys[2].len() >= limit as usize;
            worker::forget_activity_snapshot();
            let [a, b, c, d] = <[Vec<TextBuf>; 4]>::try_from(keys)
                .map_err(|_| LockError::MissingColumn { name: "keys" })?;
            total += ended(
                END_LOCKED_SESSIONS.run(
                    client,
                    Args::new()
                        .set("notify", notify)
                        .set(KEYS[0], a)
                        .set(KEYS[1], b)
                        .set(KEYS[2], c)
                        .set(KEYS[3], d),
                )?,
            )?;
        }
        Ok((total, more))
    })
}
