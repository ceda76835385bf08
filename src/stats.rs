//! Counters for operators: what lockext did since the server started (or since
//! `lockext.stats_reset()`), cluster-wide. Lock-free atomics in shared memory, so counting
//! costs a few nanoseconds per call; they exist only when lockext is preloaded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};

use crate::backend;
use crate::caller::{self, Needs};
use crate::error::OrReport;
use crate::settings;

/// Upper bounds (microseconds) of the acquire latency buckets; the last bucket is open.
pub const LATENCY_BOUNDS_US: [u64; 10] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 100_000,
];

/// The counters, each in one line: its name in Rust, then its row's name in
/// `lockext.stats`. The enum, the count and the names are all made from this one list, in
/// this order (the order of the rows).
macro_rules! counters {
    ($($counter:ident => $name:literal,)*) => {
        #[derive(Clone, Copy, Debug)]
        pub enum Counter {
            $($counter,)*
        }

        const NAMES: &[&str] = &[$($name,)*];
    };
}

counters! {
    AcquiresGranted => "acquires_granted",
    AcquiresRefused => "acquires_refused",
    TakeOvers => "take_overs",
    RenewalsOk => "renewals_ok",
    RenewalsFailed => "renewals_failed",
    ReleasesOk => "releases_ok",
    ReleasesFailed => "releases_failed",
    LeasesReaped => "leases_reaped",
    FenceStale => "fence_rejected_stale",
    FenceForged => "fence_rejected_forged",
    KeepaliveRenewalsOk => "keepalive_renewals_ok",
    KeepaliveRenewalsFailed => "keepalive_renewals_failed",
    EventsSkipped => "events_skipped",
    ReaperDatabasesUnseen => "reaper_databases_unseen",
    ReaperSlotWaits => "reaper_slot_waits",
    TokenEvidenceReads => "token_evidence_reads",
}

const COUNTERS: usize = NAMES.len();

#[derive(Default)]
pub struct Counters {
    counts: [AtomicU64; COUNTERS],
    latency: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    reset_at: AtomicU64, // TimestampTz of the last reset; 0 = since start
}

// Atomics only, no pointers: safe to place in shared memory.
unsafe impl PGRXSharedMemory for Counters {}

static COUNTERS_SHM: PgAtomic<Counters> = unsafe { PgAtomic::new(c"lockext_stats") };

pub fn init_shared_memory() {
    pg_shmem_init!(COUNTERS_SHM);
}

pub fn count(counter: Counter) {
    add(counter, 1);
}

pub fn add(counter: Counter, n: u64) {
    if settings::preloaded() {
        COUNTERS_SHM.get().counts[counter as usize].fetch_add(n, Ordering::Relaxed);
    }
}

/// Times one lock_acquire, from its first line to its return (the commit comes after).
pub struct AcquireTimer(Instant);

impl AcquireTimer {
    pub fn start() -> Self {
        AcquireTimer(Instant::now())
    }
}

impl Drop for AcquireTimer {
    fn drop(&mut self) {
        if !settings::preloaded() {
            return;
        }
        let us = self.0.elapsed().as_micros() as u64;
        let bucket = LATENCY_BOUNDS_US
            .iter()
            .position(|&b| us < b)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        COUNTERS_SHM.get().latency[bucket].fetch_add(1, Ordering::Relaxed);
    }
}

/// One row per counter; `acquire_latency_lt_<N>us` rows are the histogram buckets.
#[pg_extern(volatile, parallel_safe)]
#[search_path(pg_catalog, pg_temp)]
fn stats() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(value, i64),
        name!(since, Option<TimestampWithTimeZone>),
    ),
> {
    if !settings::preloaded() {
        return TableIterator::new(Vec::new());
    }
    let shm = COUNTERS_SHM.get();
    let since = match shm.reset_at.load(Ordering::Relaxed) {
        0 => backend::server_started(),
        t => TimestampWithTimeZone::try_from(t as i64).ok(),
    };
    let mut rows: Vec<(String, i64, Option<TimestampWithTimeZone>)> = NAMES
        .iter()
        .zip(shm.counts.iter())
        .map(|(name, v)| (name.to_string(), v.load(Ordering::Relaxed) as i64, since))
        .collect();
    for (i, v) in shm.latency.iter().enumerate() {
        let name = match LATENCY_BOUNDS_US.get(i) {
            Some(bound) => format!("acquire_latency_lt_{bound}us"),
            None => format!(
                "acquire_latency_ge_{}us",
                LATENCY_BOUNDS_US[LATENCY_BOUNDS_US.len() - 1]
            ),
        };
        rows.push((name, v.load(Ordering::Relaxed) as i64, since));
    }
    TableIterator::new(rows)
}

/// Sets every counter back to zero.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn stats_reset() {
    caller::require(Needs::Admin {
        action: "reset lockext.stats",
    })
    .or_report();
    if !settings::preloaded() {
        return;
    }
    let shm = COUNTERS_SHM.get();
    shm.counts
        .iter()
        .chain(shm.latency.iter())
        .for_each(|c| c.store(0, Ordering::Relaxed));
    shm.reset_at
        .store(backend::clock() as u64, Ordering::Relaxed);
}
