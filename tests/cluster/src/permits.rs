//! The checker of counting-semaphore histories (`lock_acquire(..., permits => n)`).
//!
//! The history is the clients' calls, as [`crate::history::Op`]s, each with the server's
//! clock around the call (see tests/semaphores.rs). [`check_permits`]
//! verifies:
//! 1. no fence token is returned by two different grants (a grant is identified by lock,
//!    owner, token and `acquired_at`; the same owner re-acquiring a live permit gets the
//!    same grant back);
//! 2. at no instant of the server's clock were more than `permits` grants of one
//!    semaphore live, nor two grants of one (semaphore, owner);
//! 3. a renewal never revives a grant that had expired, and neither a renewal nor a
//!    release is refused while the grant is still live.
//!
//! Liveness is computed so that it can only be *shorter* than the truth, never longer, so
//! that a correct server can never be reported: a grant is live
//! - from the server's clock read just after the acquire call that made it (in the same
//!   statement), until the expiry that acquire returned;
//! - from the server's clock just after each acknowledged renewal or same-grant
//!   re-acquire, until the expiry it returned;
//! - and never after the server's clock read just before the first release of it that
//!   returned true.
//!
//! A server that exceeds the limit makes those intervals overlap more than `permits`
//! deep somewhere; the sweep finds that instant.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Kind, Op, Outcome};

#[derive(Debug, Default)]
pub struct PermitReport {
    pub ops: usize,
    pub acquires: usize,
    pub acquires_refused: usize,
    /// Distinct grants.
    pub grants: usize,
    pub same_grant_reacquires: usize,
    pub renews_ok: usize,
    pub renews_refused: usize,
    pub releases_ok: usize,
    pub releases_refused: usize,
    pub failed_ops: usize,
    /// Grants that no acknowledged release ended: their TTL did.
    pub expired: usize,
    /// The most grants of one semaphore live at one instant (by the computed intervals).
    pub max_live: usize,
    /// Server time (µs) during which `max_live` grants were live at once.
    pub saturated_us: i64,
    pub violations: Vec<String>,
}

impl PermitReport {
    pub fn summary(&self) -> String {
        format!(
            "ops={} acquires={} refused={} grants={} same_grant_reacquires={} renews_ok={} \
             renews_refused={} releases_ok={} releases_refused={} expired={} failed={} \
             max_live={} saturated_ms={:.1} violations={}",
            self.ops,
            self.acquires,
            self.acquires_refused,
            self.grants,
            self.same_grant_reacquires,
            self.renews_ok,
            self.renews_refused,
            self.releases_ok,
            self.releases_refused,
            self.expired,
            self.failed_ops,
            self.max_live,
            self.saturated_us as f64 / 1000.0,
            self.violations.len()
        )
    }
}

#[derive(Debug)]
struct Grant {
    lock: String,
    owner: String,
    token: i64,
    acquired_at: i64,
    /// Intervals [from, to) of server time during which it was certainly live (before
    /// releases cut them).
    segments: Vec<(i64, i64)>,
    /// The expiry most recently acknowledged (calls on one grant come from one client,
    /// one after the other).
    expiry: i64,
    /// Server clock just before the first release that returned true.
    released: Option<i64>,
}

/// Checks a semaphore history in which every semaphore has `permits` permits.
pub fn check_permits(ops: &[Op], permits: usize) -> PermitReport {
    let mut r = PermitReport {
        ops: ops.len(),
        ..PermitReport::default()
    };
    let mut v: Vec<String> = Vec::new();
    let mut sorted: Vec<&Op> = ops.iter().collect();
    sorted.sort_by_key(|o| (o.end_us, o.start_us));

    // Grants by token. A token seen with another (lock, owner, acquired_at) is reported.
    let mut grants: BTreeMap<i64, Grant> = BTreeMap::new();
    for o in &sorted {
        if let Outcome::Failed { code, message } = &o.outcome {
            r.failed_ops += 1;
            v.push(format!(
                "{:?} {} by {}:{} failed: {code:?} {message}",
                o.kind, o.target, o.client, o.seq
            ));
            continue;
        }
        match o.kind {
            Kind::Acquire => {
                r.acquires += 1;
                if o.outcome == Outcome::Refused {
                    r.acquires_refused += 1;
                    continue;
                }
                let (Some(token), Some(acquired_at), Some(expires_at), Some(after)) =
                    (o.token, o.acquired_at, o.expires_at, o.srv_after)
                else {
                    panic!("malformed acquire record {o:?}");
                };
                match grants.get_mut(&token) {
                    None => {
                        grants.insert(
                            token,
                            Grant {
                                lock: o.target.clone(),
                                owner: o.owner.clone(),
                                token,
                                acquired_at,
                                segments: vec![(after, expires_at)],
                                expiry: expires_at,
                                released: None,
                            },
                        );
                    }
                    Some(g)
                        if g.lock == o.target
                            && g.owner == o.owner
                            && g.acquired_at == acquired_at =>
                    {
                        r.same_grant_reacquires += 1;
                        g.segments.push((after, expires_at));
                        g.expiry = expires_at;
                    }
                    Some(g) => v.push(format!(
                        "token {token} returned by two grants: {} to {} acquired at {}, and {} to {} \
                         acquired at {} (call {}:{})",
                        g.lock, g.owner, g.acquired_at, o.target, o.owner, acquired_at, o.client, o.seq
                    )),
                }
            }
            Kind::Renew | Kind::Release => {
                let ok = o.outcome == Outcome::Ok;
                match (o.kind, ok) {
                    (Kind::Renew, true) => r.renews_ok += 1,
                    (Kind::Renew, false) => r.renews_refused += 1,
                    (_, true) => r.releases_ok += 1,
                    (_, false) => r.releases_refused += 1,
                }
                let Some(g) = o.token.and_then(|t| grants.get_mut(&t)) else {
                    if ok {
                        v.push(format!(
                            "{:?} of token {:?} by {}:{} succeeded, but no acquire returned that token",
                            o.kind, o.token, o.client, o.seq
                        ));
                    }
                    continue;
                };
                if g.lock != o.target || g.owner != o.owner {
                    if ok {
                        v.push(format!(
                            "{:?} of {} by owner {} with token {} succeeded, but that token is {}'s grant of {}",
                            o.kind, o.target, o.owner, g.token, g.owner, g.lock
                        ));
                    }
                    continue;
                }
                let (Some(before), Some(after)) = (o.srv_before, o.srv_after) else {
                    panic!("malformed {:?} record {o:?}", o.kind);
                };
                let live_throughout = g.released.is_none() && after < g.expiry;
                let dead_already = g.released.is_some() || before >= g.expiry;
                match (o.kind, ok) {
                    (Kind::Renew, true) => {
                        if dead_already {
                            v.push(format!(
                                "renewal {}:{} of token {} ({}) revived a grant that had ended \
                                 (expired at {}, released {:?}; the renewal started at {})",
                                o.client, o.seq, g.token, g.owner, g.expiry, g.released, before
                            ));
                        }
                        let e = o.expires_at.expect("renewal's expiry");
                        g.segments.push((after, e));
                        g.expiry = e;
                    }
                    (Kind::Release, true) => {
                        if dead_already {
                            v.push(format!(
                                "release {}:{} of token {} ({}) returned true for a grant that had ended \
                                 (expired at {}, released {:?}; the release started at {})",
                                o.client, o.seq, g.token, g.owner, g.expiry, g.released, before
                            ));
                        }
                        g.released = Some(g.released.map_or(before, |x| x.min(before)));
                    }
                    (_, false) if live_throughout => v.push(format!(
                        "{:?} {}:{} of token {} ({}) was refused although the grant was live until {} \
                         and the call ended at {}",
                        o.kind, o.client, o.seq, g.token, g.owner, g.expiry, after
                    )),
                    _ => {}
                }
            }
            Kind::Write => {}
        }
    }
    r.grants = grants.len();
    r.expired = grants.values().filter(|g| g.released.is_none()).count();

    // The sweep, per semaphore. Events: (time, +1 start / -1 end, token); ends sort first
    // at one instant (the intervals are half-open).
    let mut per_lock: BTreeMap<&str, Vec<(i64, i32, i64)>> = BTreeMap::new();
    for g in grants.values() {
        let cap = g.released.unwrap_or(i64::MAX);
        let mut segs: Vec<(i64, i64)> = g
            .segments
            .iter()
            .map(|&(s, e)| (s, e.min(cap)))
            .filter(|&(s, e)| s < e)
            .collect();
        segs.sort_unstable();
        let mut merged: Vec<(i64, i64)> = Vec::new();
        for (s, e) in segs {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        let events = per_lock.entry(g.lock.as_str()).or_default();
        for (s, e) in merged {
            events.push((s, 1, g.token));
            events.push((e, -1, g.token));
        }
    }
    for (lock, mut events) in per_lock {
        events.sort_unstable();
        let mut live: BTreeSet<i64> = BTreeSet::new();
        let mut over = false;
        let mut prev_t = i64::MIN;
        for (t, delta, token) in events {
            if live.len() == r.max_live && r.max_live > 0 && prev_t != i64::MIN {
                r.saturated_us += t - prev_t;
            }
            prev_t = t;
            if delta < 0 {
                live.remove(&token);
                over = live.len() > permits;
                continue;
            }
            live.insert(token);
            if live.len() > r.max_live {
                r.max_live = live.len();
                r.saturated_us = 0;
            }
            let owner = &grants[&token].owner;
            let same_owner: Vec<i64> = live
                .iter()
                .copied()
                .filter(|t| *t != token && &grants[t].owner == owner)
                .collect();
            if !same_owner.is_empty() {
                v.push(format!(
                    "semaphore {lock}: owner {owner} holds grants {token} and {same_owner:?} at once (at {t})"
                ));
            }
            if live.len() > permits && !over {
                over = true;
                let who: Vec<String> = live
                    .iter()
                    .map(|t| {
                        let g = &grants[t];
                        format!("{} ({}, acquired {})", g.token, g.owner, g.acquired_at)
                    })
                    .collect();
                v.push(format!(
                    "semaphore {lock}: {} grants live at once at {t}, more than its {permits} permits: {}",
                    live.len(),
                    who.join(", ")
                ));
            }
        }
    }
    r.violations = v;
    r
}
