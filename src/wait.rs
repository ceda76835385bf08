//! Waiting for a lock: a FIFO queue per lock in shared memory, and latches.
//!
//! A caller of `lock_acquire(..., wait => ...)` takes a ticket in the queue of its lock and
//! sleeps on its own latch. Only the oldest ticket of a lock tries to take it (of a
//! semaphore of n permits, the oldest n); when that lock is released (at commit), its
//! reaper deletes it, or a waiter leaves, the new head of the queue is woken by setting its
//! latch. A waiter that times out, is cancelled
//! (`pg_cancel_backend`, `statement_timeout`) or fails leaves the queue on the way out.
//! While anyone waits for a lock, callers that do not wait are refused it: they would jump
//! the queue.
//!
//! The queue has a place for every backend that can run SQL, the one indexed by its
//! `pgprocno`: no role or database can take another's place, however many wait.
//!
//! Without shared memory (lockext not preloaded) there is no queue: a waiter polls, with
//! a back-off from 5 ms to 200 ms, still interruptible, and no order is promised.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pgrx::pg_shmem_init;
use pgrx::prelude::*;

use crate::backend;
use crate::catalog;
use crate::error::MAX_ID_BYTES;
use crate::settings;
use crate::shmem::{self, Table, WAITING};
use crate::text::{Text, TextBuf};

/// A backend's place in line: what every look at the queue reads, kept small (24 bytes)
/// so that a look at every backend's place reads little memory.
#[derive(Clone, Copy, Default)]
struct Place {
    ticket: u64, // 0 = free
    key: u64,
    database: u32,
    pid: i32,
}

/// What only `lockext.waiters` and the exit hook read of a waiter, beside its place.
#[derive(Clone, Copy)]
struct Detail {
    since: i64,    // TimestampTz
    encoding: i32, // the database's, which the id's bytes are in
    id_len: u16,
    id: [u8; MAX_ID_BYTES],
}

const FREE_PLACE: Place = Place {
    ticket: 0,
    key: 0,
    database: 0,
    pid: 0,
};

const NO_DETAIL: Detail = Detail {
    since: 0,
    encoding: 0,
    id_len: 0,
    id: [0; MAX_ID_BYTES],
};

shmem::plain!(Place {
    ticket,
    key,
    database,
    pid
});
shmem::plain!(Detail {
    since,
    encoding,
    id_len,
    id
});
shmem::plain!(Header { next_ticket });

impl Detail {
    fn lock_id(&self) -> Text<'_> {
        Text::new(&self.id[..self.id_len as usize])
    }
}

/// What precedes the places, then the details, in shared memory.
#[repr(C)]
#[derive(Clone, Copy)]
struct Header {
    next_ticket: u64,
}

/// The queue: a header, then one place (and one detail) per backend that can run SQL, the slot of the
/// backend whose `pgprocno` is its index. PostgreSQL numbers client backends, autovacuum,
/// background workers and WAL senders 0 to `MaxBackends - 1` (auxiliary processes and
/// prepared transactions come after, and never wait), so every backend has a place of its
/// own whatever the others wait for, and taking a place is not a search. The size is
/// known only once the server has read its settings, so it is requested at start-up
/// (`shmem::Table`; pgrx's `pg_shmem_init!` takes fixed-size types only).
static QUEUE: Table<Header, Place, Detail> = Table::new(
    c"lockext_wait_queue",
    slots_wanted,
    |_| Header { next_ticket: 1 },
    FREE_PLACE,
    NO_DETAIL,
);

pub fn init_shared_memory() {
    pg_shmem_init!(WAITING);
    QUEUE.request();
}

/// How many slots: `MaxBackends`, which the server has computed from its settings
/// (`max_connections`, `autovacuum_max_workers`, `max_worker_processes`,
/// `max_wal_senders`) before it asks for shared memory.
fn slots_wanted() -> usize {
    usize::try_from(backend::max_backends()).unwrap_or(0)
}

/// The queue under its lock, shared: its places and details may be read. Only when
/// lockext is preloaded (every caller asks `settings::preloaded()` first).
fn read() -> shmem::Read<Header, Place, Detail> {
    QUEUE.read().expect("the wait queue is in shared memory")
}

/// The queue, exclusively: its slots may be written.
fn write() -> shmem::Write<Header, Place, Detail> {
    QUEUE.write().expect("the wait queue is in shared memory")
}

/// The queue key of a lock id in this database.
fn key_of(lock_id: Text<'_>) -> (u32, u64) {
    (
        backend::database().to_u32(),
        crate::claims::fnv1a(lock_id.bytes()),
    )
}

/// Whether `ticket` (0: a caller not in the queue) may try for `lock_id` now: fewer than
/// `window` queue ahead of it.
pub fn may_try(lock_id: Text<'_>, ticket: u64, window: usize) -> bool {
    queued_ahead(lock_id, ticket) < window
}

/// How many queue for `lock_id` ahead of `ticket` (0: ahead of anyone new).
fn queued_ahead(lock_id: Text<'_>, ticket: u64) -> usize {
    if !settings::preloaded() || WAITING.get().load(Ordering::Acquire) == 0 {
        return 0;
    }
    let (database, key) = key_of(lock_id);
    read()
        .rows()
        .iter()
        .filter(|s| {
            s.ticket != 0
                && s.database == database
                && s.key == key
                && (ticket == 0 || s.ticket < ticket)
        })
        .count()
}

/// A place in the queue of one lock; leaving it (drop, including on error) wakes the next.
pub struct Ticket {
    number: u64,
    slot: Option<usize>,
    lock_id: TextBuf,
    window: usize,
}

impl Ticket {
    /// Queues for `lock_id` in this backend's own slot, to try for it while fewer than
    /// `window` wait ahead (1: only at the head). Without shared memory the ticket holds no
    /// place and its holder polls; so it does, with a WARNING, if this backend's slot is
    /// taken by a wait of its own already (a wait inside a wait: lockext's functions never
    /// nest one, only a trigger someone put on lockext's tables could).
    pub fn take(lock_id: Text<'_>, window: usize) -> Ticket {
        let mut ticket = Ticket {
            number: 0,
            slot: None,
            lock_id: lock_id.to_buf(),
            window,
        };
        if !settings::preloaded() {
            return ticket;
        }
        let (database, key) = key_of(lock_id);
        let pid = backend::pid();
        let mut id = [0u8; MAX_ID_BYTES];
        id[..lock_id.len()].copy_from_slice(lock_id.bytes());
        let detail = Detail {
            since: backend::clock(),
            encoding: backend::database_encoding(),
            id_len: lock_id.len() as u16,
            id,
        };
        let i = usize::try_from(backend::procno()).unwrap_or(usize::MAX);
        let number = {
            let mut queue = write();
            let (header, places, details) = queue.parts();
            match places.get(i).map(|p| (p.ticket, p.pid)) {
                Some((taken, by)) if taken == 0 || by != pid => {
                    // A ticket of another pid in this backend's place is a dead process's
                    // (a PGPROC has one process at a time): it is replaced, and counted once.
                    let number = header.next_ticket;
                    header.next_ticket += 1;
                    places[i] = Place {
                        ticket: number,
                        key,
                        database,
                        pid,
                    };
                    details[i] = detail;
                    if taken == 0 {
                        WAITING.get().fetch_add(1, Ordering::AcqRel);
                    }
                    Some(number)
                }
                _ => None,
            }
        };
        let Some(number) = number else {
            warning!(
                "lockext: this wait for lock \"{lock_id}\" has no place in line: it polls, \
                 in no order, and lockext.waiters does not list it"
            );
            return ticket;
        };
        leave_queue_at_exit();
        ticket.number = number;
        ticket.slot = Some(i);
        ticket
    }

    /// Whether this ticket may try for its lock now (always, for a placeless ticket).
    pub fn may_try(&self) -> bool {
        self.slot.is_none() || may_try(self.lock_id.as_text(), self.number, self.window)
    }

    pub fn number(&self) -> u64 {
        self.number
    }

    pub fn queued(&self) -> bool {
        self.slot.is_some()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let Some(i) = self.slot else { return };
        {
            let mut queue = write();
            let (_, places, _) = queue.parts();
            if places[i].ticket == self.number {
                places[i] = Place::default();
                WAITING.get().fetch_sub(1, Ordering::AcqRel);
            }
        }
        // If we were at the head, the next in line may now be free to go.
        wake_head(self.lock_id.as_text());
    }
}

thread_local! {
    static EXIT_HOOK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A waiter ended by FATAL (`pg_terminate_backend`, a lost client) exits without unwinding,
/// so its ticket's destructor never runs: this exit hook takes its place.
fn leave_queue_at_exit() {
    if !EXIT_HOOK.get() {
        backend::at_exit(leave_at_exit);
        EXIT_HOOK.set(true);
    }
}

fn leave_at_exit() {
    // An exit can begin anywhere; the queue's lock must not be ours already.
    shmem::release_all_locks();
    let pid = backend::pid();
    // Only this backend's own slot can hold its ticket.
    let left = usize::try_from(backend::procno()).ok().and_then(|i| {
        let mut queue = write();
        let (_, places, details) = queue.parts();
        let place = places.get_mut(i)?;
        if place.ticket == 0 || place.pid != pid {
            return None;
        }
        *place = Place::default();
        let lock_id = details[i].lock_id().to_buf();
        WAITING.get().fetch_sub(1, Ordering::AcqRel);
        Some(lock_id)
    });
    if let Some(lock_id) = left {
        wake_head(lock_id.as_text());
    }
}

/// Sets the latch of the oldest waiter for `lock_id` in this database, if any. Only the
/// oldest: the others of a semaphore's window try when their naps end or they reach the
/// head, since waking them all at each release costs more in futile tries than it gains.
pub fn wake_head(lock_id: Text<'_>) {
    if !settings::preloaded() || WAITING.get().load(Ordering::Acquire) == 0 {
        return;
    }
    let (database, key) = key_of(lock_id);
    // A slot's index is its backend's pgprocno.
    let procno = read()
        .rows()
        .iter()
        .enumerate()
        .filter(|(_, s)| s.ticket != 0 && s.database == database && s.key == key)
        .min_by_key(|(_, s)| s.ticket)
        .map(|(i, _)| i);
    if let Some(procno) = procno {
        backend::set_latch_of(procno);
    }
}

/// Wakes the head waiter of `lock_id` once the current transaction commits (a release or
/// a reap is not visible to the waiter before then).
pub fn wake_head_at_commit(lock_id: Text<'_>) {
    if !settings::preloaded() || WAITING.get().load(Ordering::Acquire) == 0 {
        return;
    }
    let lock_id = lock_id.to_buf();
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, move || {
        wake_head(lock_id.as_text())
    });
}

/// Sleeps on this backend's latch for at most `nap`, and at most until `deadline`;
/// answers a cancel or a statement timeout with the usual ERROR.
pub fn nap(deadline: Instant, nap: Duration) {
    let left = deadline.saturating_duration_since(Instant::now()).min(nap);
    let ms = left.as_millis().clamp(1, i64::from(i32::MAX) as u128) as i64;
    backend::nap_on_latch(ms);
    // A waiter whose client is gone must not wait on, and above all must not be granted
    // the lock for nobody: the session ends (FATAL "connection to client lost", at the
    // check below); the exit hook then leaves the queue.
    backend::end_if_client_gone();
    pg_sys::check_for_interrupts!();
}

/// How long a waiter naps before it looks again when nothing wakes it: with a queue a
/// release wakes it, so this is only the safety net (and the wait for a lease to run out
/// when no reaper deletes it); without a queue it is the polling back-off.
pub fn next_nap(queued: bool, previous: Duration) -> Duration {
    if queued {
        Duration::from_millis(500)
    } else {
        (previous * 2).clamp(Duration::from_millis(5), Duration::from_millis(200))
    }
}

/// Who waits for what, oldest first (empty unless lockext is preloaded).
#[pg_extern(volatile, parallel_safe)]
#[search_path(pg_catalog, pg_temp)]
fn waiters() -> TableIterator<
    'static,
    (
        name!(lock_id, TextBuf),
        name!(database, pg_sys::Oid),
        name!(pid, i32),
        name!(waiting_since, Option<TimestampWithTimeZone>),
        name!(position, i64),
    ),
> {
    if !settings::preloaded() {
        return TableIterator::new(Vec::new());
    }
    let mut slots: Vec<(Place, Detail)> = {
        let queue = read();
        queue
            .rows()
            .iter()
            .zip(queue.details())
            .filter(|(p, _)| p.ticket != 0)
            .map(|(p, d)| (*p, *d))
            .collect()
    };
    slots.sort_by_key(|(p, _)| p.ticket);
    // Like pg_stat_activity: a role sees the lock ids of its own database only, unless it
    // may read all statistics (a lock id can name a customer, a job, a file).
    let all = catalog::has_privileges_of(
        backend::current_user(),
        pg_sys::Oid::from(pg_sys::ROLE_PG_READ_ALL_STATS),
    );
    let here = backend::database().to_u32();
    let encoding = backend::database_encoding();
    let rows: Vec<_> = slots
        .iter()
        .filter(|(s, _)| all || s.database == here)
        .map(|(s, d)| {
            let position = slots
                .iter()
                .filter(|(o, _)| o.database == s.database && o.key == s.key && o.ticket <= s.ticket)
                .count();
            let id = d.lock_id();
            (
                // Another database's id may be in another encoding, invalid in this one.
                if d.encoding == encoding {
                    id.to_buf()
                } else {
                    id.ascii_escaped()
                },
                pg_sys::Oid::from(s.database),
                s.pid,
                TimestampWithTimeZone::try_from(d.since).ok(),
                position as i64,
            )
        })
        .collect();
    TableIterator::new(rows)
}
