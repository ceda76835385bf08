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

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PgAtomic};

use crate::backend;
use crate::catalog;
use crate::error::MAX_ID_BYTES;
use crate::settings;
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

impl Default for Detail {
    fn default() -> Self {
        Detail {
            since: 0,
            encoding: 0,
            id_len: 0,
            id: [0; MAX_ID_BYTES],
        }
    }
}

impl Detail {
    fn lock_id(&self) -> Text<'_> {
        Text::new(&self.id[..self.id_len as usize])
    }
}

/// What precedes the places, then the details, in shared memory.
#[repr(C)]
struct Header {
    next_ticket: u64,
}

/// The queue: a header, then one place (and one detail) per backend that can run SQL, the slot of the
/// backend whose `pgprocno` is its index. PostgreSQL numbers client backends, autovacuum,
/// background workers and WAL senders 0 to `MaxBackends - 1` (auxiliary processes and
/// prepared transactions come after, and never wait), so every backend has a place of its
/// own whatever the others wait for, and taking a place is not a search. The size is
/// known only once the server has read its settings, so it is requested in
/// `shmem_request_hook` (pgrx's `pg_shmem_init!` takes fixed-size types only).
const NAME: &std::ffi::CStr = c"lockext_wait_queue";

static HEADER: AtomicPtr<Header> = AtomicPtr::new(std::ptr::null_mut());
static LOCK: AtomicPtr<pg_sys::LWLock> = AtomicPtr::new(std::ptr::null_mut());
static SLOTS: AtomicUsize = AtomicUsize::new(0);
// How many tickets are out: lets every acquire skip the queue's lock when nobody waits.
static WAITING: PgAtomic<AtomicU32> = unsafe { PgAtomic::new(c"lockext_waiting") };

static mut PREV_SHMEM_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_SHMEM_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

pub fn init_shared_memory() {
    pg_shmem_init!(WAITING);
    unsafe {
        PREV_SHMEM_REQUEST_HOOK = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request_shared_memory);
        PREV_SHMEM_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(attach_shared_memory);
    }
}

/// The queue's size in shared memory for `slots` places.
fn queue_bytes(slots: usize) -> usize {
    std::mem::size_of::<Header>()
        + slots * (std::mem::size_of::<Place>() + std::mem::size_of::<Detail>())
}

/// How many slots: `MaxBackends`, which the server has computed from its settings
/// (`max_connections`, `autovacuum_max_workers`, `max_worker_processes`,
/// `max_wal_senders`) before it asks for shared memory.
fn slots_wanted() -> usize {
    usize::try_from(backend::max_backends()).unwrap_or(0)
}

#[pg_guard]
unsafe extern "C-unwind" fn request_shared_memory() {
    unsafe {
        if let Some(prev) = PREV_SHMEM_REQUEST_HOOK {
            pg_sys::ffi::pg_guard_ffi_boundary(|| prev());
        }
        pg_sys::RequestAddinShmemSpace(queue_bytes(slots_wanted()));
        pg_sys::RequestNamedLWLockTranche(NAME.as_ptr(), 1);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn attach_shared_memory() {
    unsafe {
        if let Some(prev) = PREV_SHMEM_STARTUP_HOOK {
            pg_sys::ffi::pg_guard_ffi_boundary(|| prev());
        }
        let slots = slots_wanted();
        // AddinShmemInitLock, a macro in lwlock.h: the 21st of the main LWLocks.
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let header =
            pg_sys::ShmemInitStruct(NAME.as_ptr(), queue_bytes(slots), &mut found).cast::<Header>();
        if !found {
            header.write(Header { next_ticket: 1 });
            let places = header.add(1).cast::<Place>();
            let details = places.add(slots).cast::<Detail>();
            for i in 0..slots {
                places.add(i).write(Place::default());
                details.add(i).write(Detail::default());
            }
        }
        let lock = &raw mut (*pg_sys::GetNamedLWLockTranche(NAME.as_ptr())).lock;
        pg_sys::LWLockRelease(init_lock);
        LOCK.store(lock, Ordering::Release);
        SLOTS.store(slots, Ordering::Release);
        HEADER.store(header, Ordering::Release);
    }
}

/// The queue under its lock, shared (`read`) or exclusive (`write`); the lock is released
/// when the guard is dropped, and by PostgreSQL's error recovery on an ERROR.
struct Locked {
    header: *mut Header,
    slots: usize,
}

impl Locked {
    fn take(mode: pg_sys::LWLockMode::Type) -> Locked {
        let header = HEADER.load(Ordering::Acquire);
        assert!(!header.is_null(), "the wait queue is not in shared memory");
        unsafe { pg_sys::LWLockAcquire(LOCK.load(Ordering::Acquire), mode) };
        Locked {
            header,
            slots: SLOTS.load(Ordering::Acquire),
        }
    }

    fn places_ptr(&self) -> *mut Place {
        unsafe { self.header.add(1).cast::<Place>() }
    }

    fn details_ptr(&self) -> *mut Detail {
        unsafe { self.places_ptr().add(self.slots).cast::<Detail>() }
    }

    fn places(&self) -> &[Place] {
        unsafe { std::slice::from_raw_parts(self.places_ptr(), self.slots) }
    }

    fn details(&self) -> &[Detail] {
        unsafe { std::slice::from_raw_parts(self.details_ptr(), self.slots) }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        unsafe { pg_sys::LWLockRelease(LOCK.load(Ordering::Acquire)) };
    }
}

fn read() -> Locked {
    Locked::take(pg_sys::LWLockMode::LW_SHARED)
}

/// The queue, exclusively: its slots may be written.
struct Writing(Locked);

impl Writing {
    fn parts(&mut self) -> (&mut Header, &mut [Place], &mut [Detail]) {
        let n = self.0.slots;
        unsafe {
            (
                &mut *self.0.header,
                std::slice::from_raw_parts_mut(self.0.places_ptr(), n),
                std::slice::from_raw_parts_mut(self.0.details_ptr(), n),
            )
        }
    }
}

fn write() -> Writing {
    Writing(Locked::take(pg_sys::LWLockMode::LW_EXCLUSIVE))
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
        .places()
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
    unsafe { pg_sys::LWLockReleaseAll() };
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
        .places()
        .iter()
        .enumerate()
        .filter(|(_, s)| s.ticket != 0 && s.database == database && s.key == key)
        .min_by_key(|(_, s)| s.ticket)
        .map(|(i, _)| i);
    if let Some(procno) = procno {
        unsafe {
            let proc_ = (*pg_sys::ProcGlobal).allProcs.add(procno);
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
    let mut slots: Vec<(Place, Detail)> = {
        let queue = read();
        queue
            .places()
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
