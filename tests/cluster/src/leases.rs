//! Helpers of the lease tests (`readers_writers.rs`, `semaphores.rs`, `lock_sets.rs`,
//! `session_bound.rs`): lease calls through a client, what `lockext.holders` shows, and
//! waiting for what another thread or process does.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::*;

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn sqlstate(e: &postgres::Error) -> Option<String> {
    e.code().map(|c| c.code().to_string())
}

/// Asserts that `r` failed with SQLSTATE `want`.
pub fn expect_sqlstate<T>(r: Result<T, postgres::Error>, want: &str, what: &str) {
    match r {
        Ok(_) => panic!("{what}: succeeded, but SQLSTATE {want} was expected"),
        Err(e) => assert_eq!(
            sqlstate(&e).as_deref(),
            Some(want),
            "{what}: wrong error: {e:?}"
        ),
    }
}

/// `lockext.lock_acquire(lock, owner, ttl, <extra>)`, `extra` being named arguments such
/// as `mode => 'shared'`; the token, or None when refused.
pub fn acquire(
    c: &mut Client,
    lock: &str,
    owner: &str,
    ttl: &str,
    extra: &str,
) -> Result<Option<i64>, postgres::Error> {
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    c.query_one(
        &format!("SELECT fence_token FROM lockext.lock_acquire($1, $2, $3::text::interval{extra})"),
        &[&lock, &owner, &ttl],
    )
    .map(|row| row.get(0))
}

pub fn release(c: &mut Client, lock: &str, owner: &str) -> bool {
    c.query_one("SELECT lockext.lock_release($1, $2)", &[&lock, &owner])
        .expect("lock_release")
        .get(0)
}

/// The new expiry (µs), or None when refused.
pub fn renew(c: &mut Client, lock: &str, owner: &str, ttl: &str) -> Option<i64> {
    c.query_one(
        "SELECT (extract(epoch FROM lockext.lock_renew($1, $2, $3::text::interval)) * 1000000)::bigint",
        &[&lock, &owner, &ttl],
    )
    .expect("lock_renew")
    .get(0)
}

/// (owner, mode, token) of the live leases of `lock`, by token.
pub fn holders(c: &mut Client, lock: &str) -> Vec<(String, String, i64)> {
    c.query(
        "SELECT owner, mode, fence_token FROM lockext.holders WHERE lock_id = $1 ORDER BY fence_token",
        &[&lock],
    )
    .expect("lockext.holders")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

pub fn held(owner: &str, mode: &str, token: i64) -> (String, String, i64) {
    (owner.to_string(), mode.to_string(), token)
}

/// Asserts that the waiting call reporting on `rx` has not returned within `within`.
pub fn not_yet<T: std::fmt::Debug>(rx: &mpsc::Receiver<T>, within: Duration, who: &str) {
    if let Ok(v) = rx.recv_timeout(within) {
        panic!("{who}: its waiting call returned {v:?}; it should still be waiting");
    }
}

pub fn waiting(c: &mut Client, lock: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM lockext.waiters WHERE lock_id = $1",
        &[&lock],
    )
    .expect("lockext.waiters")
    .get(0)
}

/// Polls lockext.holders every 20 ms until `owner`'s lease of `lock` is gone; the time
/// from `since`. Panics after 10 s.
pub fn time_until_gone(c: &mut Client, lock: &str, owner: &str, since: Instant) -> Duration {
    loop {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM lockext.holders WHERE lock_id = $1 AND owner = $2",
                &[&lock, &owner],
            )
            .expect("poll lockext.holders")
            .get(0);
        let elapsed = since.elapsed();
        if n == 0 {
            return elapsed;
        }
        assert!(
            elapsed < Duration::from_secs(10),
            "{owner}'s lease of {lock} is still there after {elapsed:?}"
        );
        sleep(ms(20));
    }
}

pub fn backend_alive(c: &mut Client, pid: i32) -> bool {
    c.query_one(
        "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)",
        &[&pid],
    )
    .expect("pg_stat_activity")
    .get(0)
}

/// Every row of lockext.locks: (lock id, owner, token, expiry µs).
pub fn all_locks(c: &mut Client) -> Vec<(String, String, i64, i64)> {
    c.query(
        "SELECT lock_id, owner, fence_token, (extract(epoch FROM expires_at) * 1000000)::bigint \
           FROM lockext.locks ORDER BY lock_id",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}
