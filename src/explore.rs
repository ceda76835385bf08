//! Pause points, for the schedule explorer (`tests/cluster/tests/explore.rs`, `make
//! explore`), which forces every interleaving of two lockext calls.
//!
//! A **pause point** is a place inside a call where another backend's work can come
//! between two of its steps: before and after each SQL statement lockext runs
//! (`statements.rs`), before and after it tries a lock id's gate (`claims.rs`), right after
//! it reads the clock (`backend.rs`), and at the pre-commit of a transaction that lockext
//! watches (`commit.rs`). They are found by where the code runs SQL, not listed by hand: a
//! new statement is a new pause point by itself.
//!
//! A backend numbers the points it passes, from 1, counting from the moment either setting
//! below was last set. With `lockext.explore_pause_at = n` it stops at its n-th point until
//! whoever holds the advisory lock `pg_advisory_lock(19536, 1)` in its database lets go
//! (the explorer sees it stopped in `pg_locks`); with `lockext.explore_trace = on` it names
//! every point it passes in a NOTICE. Both are superuser-only and off by default, and off
//! a point costs one comparison. Why in the shipped build, not in a test-only one: the
//! explorer then checks the very library that runs in production, and CI needs no second
//! build.

use std::cell::Cell;

use pgrx::guc::{GucContext, GucFlags, GucSetting};
use pgrx::pg_sys;

use crate::guc;
use crate::locktable;

static PAUSE_AT: GucSetting<i32> = GucSetting::<i32>::new(0);
static TRACE: GucSetting<bool> = GucSetting::<bool>::new(false);

/// The advisory lock a paused backend waits for: `pg_advisory_lock(19536, 1)` ("LP").
const KEY: (u32, u32) = (0x4C50, 1);

thread_local! {
    static PASSED: Cell<i64> = const { Cell::new(0) };
}

pub fn define_settings() {
    guc::define_int_on_assign::<RestartCount>(
        c"lockext.explore_pause_at",
        c"For the schedule explorer: stop at this pause point (0: never).",
        c"The backend waits at its n-th pause point, counted from when this is set, \
          until the holder of pg_advisory_lock(19536, 1) lets it go.",
        &PAUSE_AT,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::default(),
    );
    guc::define_bool_on_assign::<RestartCount>(
        c"lockext.explore_trace",
        c"For the schedule explorer: name each pause point in a NOTICE.",
        c"Counted from when this is set.",
        &TRACE,
        GucContext::Suset,
        GucFlags::default(),
    );
}

/// Setting either setting counts the points again from 1.
struct RestartCount;

impl guc::OnAssign for RestartCount {
    fn assigned() {
        PASSED.with(|p| p.set(0));
    }
}

/// A pause point: `what` says where it is ("before <statement>").
#[inline]
pub fn point(what: impl FnOnce() -> String) {
    let pause_at = PAUSE_AT.get();
    let trace = TRACE.get();
    if pause_at == 0 && !trace {
        return;
    }
    let n = PASSED.with(|p| {
        let n = p.get() + 1;
        p.set(n);
        n
    });
    if trace {
        pgrx::notice!("lockext explore point {n}: {}", what());
    }
    if n == i64::from(pause_at) {
        wait_to_go_on();
    }
}

/// Waits until the explorer lets go of its advisory lock: a heavyweight lock wait, so the
/// backend shows in `pg_locks` as waiting, can be cancelled, and takes part in deadlock
/// detection like any other.
fn wait_to_go_on() {
    // Only inside a transaction of a database (never in the reaper's launcher).
    let Some(tag) = locktable::advisory_tag_here(KEY, 2) else {
        return;
    };
    locktable::lock(&tag, pg_sys::ShareLock as pg_sys::LOCKMODE);
    locktable::unlock(&tag, pg_sys::ShareLock as pg_sys::LOCKMODE);
}

/// A statement's name for a pause point: its file's first line (every file under
/// `sql/run/` opens with a comment that says what it does).
pub fn statement_name(sql: &str) -> String {
    let first = sql
        .lines()
        .next()
        .unwrap_or("")
        .trim_start_matches("--")
        .trim();
    first.chars().take(90).collect()
}
