//! Session-bound leases (ZooKeeper's ephemeral nodes): a lease that also ends when the
//! backend that took it exits, whatever the reason, with its TTL still the upper bound.
//!
//! A session-bound lease records its backend as the pid and the backend's start time (pids
//! are reused). Two things end it:
//! - the backend itself, on its way out (`before_shmem_exit`, as PostgreSQL drops a
//!   session's temporary tables): a normal close, `pg_terminate_backend`, a client that
//!   died (the backend reads end-of-file from the socket) all come through here;
//! - the reaper, for a backend that could not (it crashed, and with it the server's
//!   shared memory): each round it deletes session-bound leases whose backend is gone.
//!
//! Behind a transaction-pooling PgBouncer a server session serves many clients and outlives
//! them, so "the session" means nothing; `lockext.session_leases = off` refuses them there.

use std::cell::Cell;
use std::time::{Duration, Instant};

use pgrx::pg_sys::BuiltinOid::*;
use pgrx::prelude::*;

use crate::backend;
use crate::error::LockError;
use crate::settings;
use crate::statements::{first_named, Args, Statement};
use crate::text::TextBuf;
use crate::xact::{self, in_transaction};

static END_MINE: Statement = Statement {
    sql: include_str!("../sql/run/session/end_mine.sql"),
    params: &[
        ("pid", INT4OID),
        ("started", TIMESTAMPTZOID),
        ("notify", BOOLOID),
    ],
};

static MINE_LEFT: Statement = Statement {
    sql: include_str!("../sql/run/session/mine_left.sql"),
    params: &[("pid", INT4OID), ("started", TIMESTAMPTZOID)],
};

static EXIT_SETTINGS: Statement = Statement {
    sql: include_str!("../sql/run/session/exit_settings.sql"),
    params: &[],
};

thread_local! {
    // Whether this backend has taken a session-bound lease (and so has its exit hook).
    static BOUND: Cell<bool> = const { Cell::new(false) };
}

/// The session a lease asked to be bound to: this backend's start time, to be recorded with
/// its pid. Only a check: nothing changes until a bound lease is granted (`bind`).
pub fn this_session() -> Result<TimestampWithTimeZone, LockError> {
    if !settings::SESSION_LEASES.get() {
        return Err(LockError::SessionLeasesOff);
    }
    backend::started()
}

/// Makes sure this backend ends its session-bound leases when it exits: call once a bound
/// lease is granted.
pub fn bind() {
    if !BOUND.get() {
        backend::at_exit(end_at_exit);
        BOUND.set(true);
    }
}

/// How long the exit waits for lease rows of its session that other transactions hold (a
/// renewal or release in flight): long enough for one to commit, short enough that a
/// transaction left open on a row does not keep the backend (and a smart shutdown) waiting.
const EXIT_WAIT: Duration = Duration::from_secs(1);
/// How often it looks again meanwhile.
const EXIT_RETRY_MS: i64 = 5;

/// The exit hook: ends this backend's session-bound leases in a transaction of its own,
/// as the superuser (the session's role may not write lockext's tables). A row another
/// transaction holds is skipped and tried again, a new transaction every few milliseconds,
/// until none is left or `EXIT_WAIT` has passed: a lock wait cannot be bounded here
/// (exit_settings.sql says why). A failure, or a row still held, is only logged: the
/// reaper ends what is left.
fn end_at_exit() {
    xact::abort_any();
    let since = Instant::now();
    loop {
        let gave_up = match in_transaction(end_mine) {
            Ok(0) => return,
            Ok(_) if since.elapsed() < EXIT_WAIT && backend::nap_at_exit(EXIT_RETRY_MS) => continue,
            Ok(left) => format!(
                "{left} of them held by other transactions after {} ms",
                since.elapsed().as_millis()
            ),
            Err(message) => message,
        };
        // Leases whose session is gone are due now (no expiry covers them).
        crate::status::publish(backend::clock());
        warning!(
            "lockext: could not end this session's leases at exit ({gave_up}); the reaper will"
        );
        return;
    }
}

/// One try of the exit: ends the session's leases that no other transaction holds, wakes
/// their locks' waiters at commit, and returns how many rows of the session are left.
fn end_mine() -> Result<i64, LockError> {
    backend::set_user_and_context(
        pg_sys::Oid::from(pg_sys::BOOTSTRAP_SUPERUSERID),
        pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
    );
    Spi::connect_mut(|client| {
        EXIT_SETTINGS.run(client, Args::new())?;
        let started = backend::started().ok();
        let args = Args::new()
            .set("pid", backend::pid())
            .set("started", started)
            .set("notify", settings::NOTIFY.get());
        let rows = END_MINE.run(client, args)?;
        for row in rows {
            if let Some(lock_id) = row.get_by_name::<TextBuf, _>("lock_id")? {
                crate::wait::wake_head_at_commit(lock_id.as_text());
            }
        }
        let args = Args::new()
            .set("pid", backend::pid())
            .set("started", started);
        let left = MINE_LEFT.run(client, args)?;
        Ok(first_named::<i64>(left, "rows_left")?.unwrap_or(0))
    })
}
