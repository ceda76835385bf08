//! lockext's own shared memory, set up in one place: the **tables** (a header, then rows,
//! under an LWLock of their own: the reaper's board, `status.rs`; the wait queue,
//! `wait.rs`; the rounds' hand-offs, `reaper.rs`; the adopted installations,
//! `adopted.rs`), sized when the server starts, and the
//! named **atomics** read without a lock (`WAITING`, `BULK_LOADS`). Their owners say what
//! goes in them and when; the request and start-up hooks, the pointers and the locks are
//! here. Shared memory exists only when lockext is preloaded: a table's `read` and
//! `write` answer None without it.
//!
//! Why it is sound, once for all:
//! - What a table holds is `Plain` (no pointer, no reference, nothing to drop: a value
//!   written by one process means the same in another). `plain!` is the only way to say
//!   a type is, and it checks every field of the type's definition.
//! - A table's memory is asked for at preload (`shmem_request_hook`) and found or made,
//!   then filled once, under `AddinShmemInitLock` (`shmem_startup_hook`), as PostgreSQL
//!   documents for an extension; its header and rows are laid out at offsets aligned for
//!   their types (at most 8 bytes, checked when the table is declared; shared memory is
//!   aligned at least so), and its pointer and size are set before the processes that use
//!   them are forked, and never change.
//! - A table is read only under its LWLock, shared (`Read`: `&` to its parts) or exclusive
//!   (`Write`: `&mut`), which the guard releases when dropped: every process reaches the
//!   memory through these guards only, so no `&mut` aliases another reference.
//! - A named atomic is one of pgrx's `PgAtomic`s; pgrx asks only that no two share a
//!   name: each is declared here, beside the others.

use std::cell::RefCell;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use pgrx::{pg_guard, pg_sys, PgAtomic};

/// How many tickets are out in the wait queue (`wait.rs`): lets every acquire skip the
/// queue's lock when nobody waits.
pub static WAITING: PgAtomic<AtomicU32> = unsafe { PgAtomic::new(c"lockext_waiting") };

/// How many transactions may hold the database-wide claim (`claims.rs`).
pub static BULK_LOADS: PgAtomic<AtomicU32> = unsafe { PgAtomic::new(c"lockext_bulk_loads") };

/// Plain data, which one process may write and another read: implemented (by `plain!`)
/// only for types made of plain fields, never by hand outside this module.
///
/// # Safety
/// The type holds no pointer or reference and needs no drop.
pub unsafe trait Plain: Copy + Sync + 'static {}

unsafe impl Plain for () {}
unsafe impl Plain for bool {}
unsafe impl Plain for u8 {}
unsafe impl Plain for u16 {}
unsafe impl Plain for u32 {}
unsafe impl Plain for u64 {}
unsafe impl Plain for usize {}
unsafe impl Plain for i32 {}
unsafe impl Plain for i64 {}
unsafe impl<T: Plain, const N: usize> Plain for [T; N] {}

/// Checks, at compile time, that a field is `Plain` (for `plain!`).
#[doc(hidden)]
pub fn field_is_plain<T: Plain>(_: &T) {}

/// `plain!(Type { field, field, ... })`: declares `Type` plain, every field named (the
/// pattern has no `..`, so a field left out is a compile error) and each checked to be.
macro_rules! plain {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        const _: () = {
            #[allow(dead_code)]
            fn every_field_is_plain(value: &$ty) {
                let $ty { $($field),* } = value;
                $($crate::shmem::field_is_plain($field);)*
            }
        };
        // Sound: every field is `Plain` (checked above), so the whole is.
        unsafe impl $crate::shmem::Plain for $ty {}
    };
}
pub(crate) use plain;

/// The largest alignment shared memory is sure to have (`MAXIMUM_ALIGNOF`).
const MAX_ALIGN: usize = 8;

const fn align_up(n: usize, align: usize) -> usize {
    n.div_ceil(align) * align
}

/// A table in shared memory: a header `H`, then `n` rows `R`, then `n` details `D` (what
/// a row keeps beside it, read less often: kept apart so that a pass over the rows reads
/// little memory), under one LWLock of its own, both named `name`. `n` is what `rows`
/// answers at server start (from settings that only a restart changes).
pub struct Table<H, R, D = ()> {
    name: &'static CStr,
    rows: fn() -> usize,
    header: fn(usize) -> H,
    row: R,
    detail: D,
    base: AtomicPtr<u8>,
    lock: AtomicPtr<pg_sys::LWLock>,
    len: AtomicUsize,
    _header: PhantomData<fn() -> H>,
}

impl<H: Plain, R: Plain, D: Plain> Table<H, R, D> {
    /// A table named `name`, of `rows()` rows, made (once, at server start) of
    /// `header(rows)`, then `row` and `detail` in every place.
    pub const fn new(
        name: &'static CStr,
        rows: fn() -> usize,
        header: fn(usize) -> H,
        row: R,
        detail: D,
    ) -> Self {
        assert!(
            std::mem::align_of::<H>() <= MAX_ALIGN
                && std::mem::align_of::<R>() <= MAX_ALIGN
                && std::mem::align_of::<D>() <= MAX_ALIGN
        );
        Table {
            name,
            rows,
            header,
            row,
            detail,
            base: AtomicPtr::new(std::ptr::null_mut()),
            lock: AtomicPtr::new(std::ptr::null_mut()),
            len: AtomicUsize::new(0),
            _header: PhantomData,
        }
    }

    /// Where the rows and the details begin, and the table's size, for `n` rows.
    fn layout(n: usize) -> (usize, usize, usize) {
        let rows = align_up(std::mem::size_of::<H>(), std::mem::align_of::<R>());
        let details = align_up(
            rows + n * std::mem::size_of::<R>(),
            std::mem::align_of::<D>(),
        );
        (rows, details, details + n * std::mem::size_of::<D>())
    }

    /// Asks for the table's memory and lock when the server starts. Call while
    /// shared_preload_libraries are loaded (`_PG_init`), once per table.
    pub fn request(&'static self) {
        TABLES.with_borrow_mut(|tables| tables.push(self));
        hook_once();
    }

    /// The table under its lock, shared; None without shared memory.
    pub fn read(&'static self) -> Option<Read<H, R, D>> {
        self.take(pg_sys::LWLockMode::LW_SHARED).map(Read)
    }

    /// The table under its lock, exclusive; None without shared memory.
    pub fn write(&'static self) -> Option<Write<H, R, D>> {
        self.take(pg_sys::LWLockMode::LW_EXCLUSIVE).map(Write)
    }

    /// The table under its lock, exclusive, if no other process holds the lock now; None
    /// if one does (never waits), or without shared memory.
    pub fn try_write(&'static self) -> Option<Write<H, R, D>> {
        self.take_if(pg_sys::LWLockMode::LW_EXCLUSIVE, true)
            .map(Write)
    }

    fn take(&'static self, mode: pg_sys::LWLockMode::Type) -> Option<Held<H, R, D>> {
        self.take_if(mode, false)
    }

    fn take_if(
        &'static self,
        mode: pg_sys::LWLockMode::Type,
        no_wait: bool,
    ) -> Option<Held<H, R, D>> {
        let base = self.base.load(Ordering::Acquire);
        let lock = self.lock.load(Ordering::Acquire);
        if base.is_null() || lock.is_null() {
            return None;
        }
        if no_wait {
            if !unsafe { pg_sys::LWLockConditionalAcquire(lock, mode) } {
                return None;
            }
        } else {
            unsafe { pg_sys::LWLockAcquire(lock, mode) };
        }
        Some(Held {
            base,
            lock,
            n: self.len.load(Ordering::Acquire),
            _table: PhantomData,
        })
    }
}

/// What the start-up hooks ask of every table, whatever it holds.
trait Requested {
    fn name(&self) -> &'static CStr;
    fn bytes(&self) -> usize;
    /// Finds or makes the table in shared memory; call under `AddinShmemInitLock`.
    fn attach(&self);
}

impl<H: Plain, R: Plain, D: Plain> Requested for Table<H, R, D> {
    fn name(&self) -> &'static CStr {
        self.name
    }

    fn bytes(&self) -> usize {
        Self::layout((self.rows)()).2
    }

    fn attach(&self) {
        let n = (self.rows)();
        let (rows_at, details_at, bytes) = Self::layout(n);
        let mut found = false;
        unsafe {
            let base = pg_sys::ShmemInitStruct(self.name.as_ptr(), bytes, &mut found).cast::<u8>();
            if !found {
                base.cast::<H>().write((self.header)(n));
                let rows = base.add(rows_at).cast::<R>();
                let details = base.add(details_at).cast::<D>();
                for i in 0..n {
                    rows.add(i).write(self.row);
                    details.add(i).write(self.detail);
                }
            }
            let lock = &raw mut (*pg_sys::GetNamedLWLockTranche(self.name.as_ptr())).lock;
            self.lock.store(lock, Ordering::Release);
            self.len.store(n, Ordering::Release);
            self.base.store(base, Ordering::Release);
        }
    }
}

thread_local! {
    // The tables asked for at preload, in the postmaster (inherited through fork).
    static TABLES: RefCell<Vec<&'static dyn Requested>> = const { RefCell::new(Vec::new()) };
}

static mut PREV_REQUEST: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP: pg_sys::shmem_startup_hook_type = None;
static mut HOOKED: bool = false;

/// Puts this module's hooks in front of the server's (once), each calling the previous.
fn hook_once() {
    unsafe {
        if HOOKED {
            return;
        }
        HOOKED = true;
        PREV_REQUEST = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request_tables);
        PREV_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(attach_tables);
    }
}

#[pg_guard]
extern "C-unwind" fn request_tables() {
    unsafe {
        if let Some(prev) = PREV_REQUEST {
            pg_sys::ffi::pg_guard_ffi_boundary(|| prev());
        }
    }
    TABLES.with_borrow(|tables| {
        for table in tables {
            unsafe {
                pg_sys::RequestAddinShmemSpace(table.bytes());
                pg_sys::RequestNamedLWLockTranche(table.name().as_ptr(), 1);
            }
        }
    });
}

#[pg_guard]
extern "C-unwind" fn attach_tables() {
    unsafe {
        if let Some(prev) = PREV_STARTUP {
            pg_sys::ffi::pg_guard_ffi_boundary(|| prev());
        }
        // AddinShmemInitLock, a macro in lwlock.h: the 21st of the main LWLocks.
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        TABLES.with_borrow(|tables| tables.iter().for_each(|table| table.attach()));
        pg_sys::LWLockRelease(init_lock);
    }
}

/// A table's lock, held; released when dropped.
struct Held<H, R, D> {
    base: *mut u8,
    lock: *mut pg_sys::LWLock,
    n: usize,
    _table: Parts<H, R, D>,
}

type Parts<H, R, D> = PhantomData<fn() -> (H, R, D)>;

impl<H: Plain, R: Plain, D: Plain> Held<H, R, D> {
    fn parts(&self) -> (*mut H, *mut R, *mut D) {
        let (rows, details, _) = Table::<H, R, D>::layout(self.n);
        unsafe {
            (
                self.base.cast::<H>(),
                self.base.add(rows).cast::<R>(),
                self.base.add(details).cast::<D>(),
            )
        }
    }
}

impl<H, R, D> Drop for Held<H, R, D> {
    fn drop(&mut self) {
        // Not while PostgreSQL's error handling unwinds (an ERROR zeroes
        // InterruptHoldoffCount, which holding an LWLock raises): the abort releases every
        // LWLock.
        unsafe {
            if pg_sys::InterruptHoldoffCount > 0 {
                pg_sys::LWLockRelease(self.lock);
            }
        }
    }
}

/// A table under its lock, shared: its parts may be read.
pub struct Read<H, R, D = ()>(Held<H, R, D>);

impl<H: Plain, R: Plain, D: Plain> Read<H, R, D> {
    pub fn header(&self) -> &H {
        unsafe { &*self.0.parts().0 }
    }

    pub fn rows(&self) -> &[R] {
        unsafe { std::slice::from_raw_parts(self.0.parts().1, self.0.n) }
    }

    pub fn details(&self) -> &[D] {
        unsafe { std::slice::from_raw_parts(self.0.parts().2, self.0.n) }
    }
}

/// A table under its lock, exclusive: its parts may be written.
pub struct Write<H, R, D = ()>(Held<H, R, D>);

impl<H: Plain, R: Plain, D: Plain> Write<H, R, D> {
    pub fn header(&mut self) -> &mut H {
        self.parts().0
    }

    /// The header, the rows and the details, to read and write.
    pub fn parts(&mut self) -> (&mut H, &mut [R], &mut [D]) {
        let (header, rows, details) = self.0.parts();
        let n = self.0.n;
        unsafe {
            (
                &mut *header,
                std::slice::from_raw_parts_mut(rows, n),
                std::slice::from_raw_parts_mut(details, n),
            )
        }
    }
}

/// Releases every LWLock this process holds: for an exit hook, which can begin anywhere,
/// before it takes a table's lock that may already be its own.
pub fn release_all_locks() {
    unsafe { pg_sys::LWLockReleaseAll() };
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use super::Table;

    #[pg_test]
    fn a_table_lays_its_rows_and_details_out_aligned_after_its_header() {
        // A 1-byte header: the 8-byte rows start at 8, the 2-byte details right after them.
        assert_eq!(Table::<u8, u64, u16>::layout(3), (8, 32, 38));
        // No rows: the header alone.
        assert_eq!(Table::<[u64; 4], (), ()>::layout(0), (32, 32, 32));
        // A 16-byte header and 4-byte rows: the details (8-byte) rounded up after the rows.
        assert_eq!(Table::<[u64; 2], u32, u64>::layout(3), (16, 32, 56));
    }
}
