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
//! Without shared memory (lockext not preloaded) there is no queue: a waiter polls, with
//! a back-off from 5 ms to 200 ms, still interruptible, and no order is promised.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};

use crate::backend;
use crate::error::MAX_ID_BYTES;
use crate::settings;
use crate::text::{Text, TextBuf};

/// Waiters that can queue at once, all databases together; more wait by polling.
const SLOTS: usize = 1024;

#[derive(Clone, Copy)]
pub struct Slot {
    ticket: u64, // 0 = free
    database: u32,
    key: u64,
    procno: i32,
    pid: i32,
    since: i64,    // TimestampTz
    encoding: i32, // the database's, which the id's bytes are in
    id_len: u16,
    id: [u8; MAX_ID_BYTES],
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            ticket: 0,
            database: 0,
            key: 0,
            procno: 0,
            pid: 0,
            since: 0,
            encoding: 0,
            id_len: 0,
            id: [0; MAX_ID_BYTES],
        }
    }
}

#[derive(Clone, Copy)]
pub struct Queue {
    next_ticket: u64,
    slots: [Slot; SLOTS],
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            next_ticket: 1,
            slots: [Slot::default(); SLOTS],
        }
    }
}

// Plain data, no pointers: safe in shared memory.
unsafe impl PGRXSharedMemory for Queue {}

static QUEUE: PgLwLock<Queue> = unsafe { PgLwLock::new(c"lockext_wait_queue") };
// How many tickets are out: lets every acquire skip the queue's lock when nobody waits.
static WAITING: PgAtomic<AtomicU32> = unsafe { PgAtomic::new(c"lockext_waiting") };

pub fn init_shared_memory() {
    pg_shmem_init!(QUEUE);
    pg_shmem_init!(WAITING);
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
    let queue = QUEUE.share();
    queue
        .slots
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
    /// Queues for `lock_id`, to try for it while fewer than `window` wait ahead (1: only
    /// at the head); without shared memory, or with the queue full, the ticket holds no
    /// place and its holder polls.
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
        let mut queue = QUEUE.exclusive();
        let Some(i) = queue.slots.iter().position(|s| s.ticket == 0) else {
            return ticket;
        };
        let number = queue.next_ticket;
        queue.next_ticket += 1;
        let mut id = [0u8; MAX_ID_BYTES];
        id[..lock_id.len()].copy_from_slice(lock_id.bytes());
        queue.slots[i] = Slot {
            ticket: number,
            database,
            key,
            procno: backend::procno(),
            pid: backend::pid(),
            since: backend::clock(),
            encoding: unsafe { pg_sys::GetDatabaseEncoding() },
            id_len: lock_id.len() as u16,
            id,
        };
        WAITING.get().fetch_add(1, Ordering::AcqRel);
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
            let mut queue = QUEUE.exclusive();
            if queue.slots[i].ticket == self.number {
                queue.slots[i] = Slot::default();
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
        unsafe { pg_sys::before_shmem_exit(Some(leave_at_exit), pg_sys::Datum::from(0)) };
        EXIT_HOOK.set(true);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn leave_at_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    // An exit can begin anywhere; the queue's lock must not be ours already.
    unsafe { pg_sys::LWLockReleaseAll() };
    let pid = backend::pid();
    let left: Vec<TextBuf> = {
        let mut queue = QUEUE.exclusive();
        let mut left = Vec::new();
        for slot in queue
            .slots
            .iter_mut()
            .filter(|s| s.ticket != 0 && s.pid == pid)
        {
            left.push(TextBuf::from_bytes(
                slot.id[..slot.id_len as usize].to_vec(),
            ));
            *slot = Slot::default();
            WAITING.get().fetch_sub(1, Ordering::AcqRel);
        }
        left
    };
    for lock_id in left {
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
    let procno = {
        let queue = QUEUE.share();
        queue
            .slots
            .iter()
            .filter(|s| s.ticket != 0 && s.database == database && s.key == key)
            .min_by_key(|s| s.ticket)
            .map(|s| s.procno)
    };
    if let Some(procno) = procno {
        unsafe {
            let proc_ = (*pg_sys::ProcGlobal).allProcs.add(procno as usize);
            pg_sys::SetLatch(&mut (*proc_).procLatch);
        }
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
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            ms,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
        // A waiter whose client is gone must not wait on, and above all must not be
        // granted the lock for nobody: end the session as PostgreSQL does when
        // client_connection_check_interval finds the client gone (FATAL "connection to
        // client lost"); the exit hook then leaves the queue.
        if !pg_sys::MyProcPort.is_null()
            && !pg_sys::ffi::pg_guard_ffi_boundary(|| pq_check_connection())
        {
            pg_sys::ClientConnectionLost = 1;
            pg_sys::InterruptPending = 1;
        }
    }
    pg_sys::check_for_interrupts!();
}

// libpq/libpq.h, which pgrx does not bind: whether the client's socket is still open.
unsafe extern "C-unwind" {
    fn pq_check_connection() -> bool;
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
    let mut slots: Vec<Slot> = QUEUE
        .share()
        .slots
        .iter()
        .copied()
        .filter(|s| s.ticket != 0)
        .collect();
    slots.sort_by_key(|s| s.ticket);
    // Like pg_stat_activity: a role sees the lock ids of its own database only, unless it
    // may read all statistics (a lock id can name a customer, a job, a file).
    let all = unsafe {
        pg_sys::has_privs_of_role(
            backend::current_user(),
            pg_sys::Oid::from(pg_sys::ROLE_PG_READ_ALL_STATS),
        )
    };
    let here = backend::database().to_u32();
    let encoding = unsafe { pg_sys::GetDatabaseEncoding() };
    let rows: Vec<_> = slots
        .iter()
        .filter(|s| all || s.database == here)
        .map(|s| {
            let position = slots
                .iter()
                .filter(|o| o.database == s.database && o.key == s.key && o.ticket <= s.ticket)
                .count();
            let id = Text::new(&s.id[..s.id_len as usize]);
            (
                // Another database's id may be in another encoding, invalid in this one.
                if s.encoding == encoding {
                    id.to_buf()
                } else {
                    id.ascii_escaped()
                },
                pg_sys::Oid::from(s.database),
                s.pid,
                TimestampWithTimeZone::try_from(s.since).ok(),
                position as i64,
            )
        })
        .collect();
    TableIterator::new(rows)
}
