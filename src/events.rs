//! Whether to send a `NOTIFY lockext` event now: `lockext.notify` is on, and the server's
//! notification queue has room.
//!
//! Events are hints: a listener that never reads (a session that ran `LISTEN lockext` and
//! left a transaction open) keeps every later notification in the cluster-wide queue, and
//! once it is full every transaction that notified fails at commit ("too many
//! notifications in the NOTIFY queue"). PostgreSQL raises that at commit, where lockext
//! cannot catch it, so lockext must not add to a queue that is filling: from half full on
//! (`lockext.notify_queue_limit`), events are skipped. A skipped decision is counted (`events_skipped` in lockext.stats)
//! and logged once per backend; a release, a renewal or a reaping never fails for it.

use std::cell::Cell;

use crate::backend;
use crate::settings;
use crate::stats::{self, Counter};

/// True when events should be sent now; false when `lockext.notify` is off, or when the
/// queue is past `lockext.notify_queue_limit` (then counted and, once per backend, logged).
pub fn enabled() -> bool {
    if !settings::NOTIFY.get() {
        return false;
    }
    let used = queue_usage();
    if used < settings::NOTIFY_QUEUE_LIMIT.get() {
        return true;
    }
    stats::count(Counter::EventsSkipped);
    thread_local! { static LOGGED: Cell<bool> = const { Cell::new(false) }; }
    if !LOGGED.with(|l| l.replace(true)) {
        pgrx::log!(
            "lockext: NOTIFY queue {:.0}% full (a listener is not reading): lockext events \
             are skipped until it drains; see lockext.stats, events_skipped",
            used * 100.0
        );
    }
    false
}

/// `pg_notification_queue_usage()`: the fraction of the notification queue in use.
fn queue_usage() -> f64 {
    backend::notification_queue_usage()
}
