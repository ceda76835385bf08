//! Histories of lock-service clients, and the checker of the fencing invariants.
//!
//! A history has two halves:
//! - what the clients saw: every operation (who, what, start and end on the client's
//!   clock, the result, and the server's clock around the call), one [`Op`] each, written
//!   by the client processes as lines of text (see [`Op::to_line`]);
//! - what the server committed: every accepted fenced write, recorded by the writer in
//!   `public.fence_history` in the same transaction as its `lockext.fenced_update` or
//!   `lockext.fence` (see [`SETUP_SQL`]), and the final contents of `lockext.resources`
//!   (with `public.fenced_state`, the table the `lockext.fence` path writes).
//!
//! [`check`] verifies, and counts:
//! 1. no fence token is returned by two different grants (the same owner re-acquiring a
//!    live lease legitimately gets the *same* grant back: a grant is identified by lock,
//!    owner, token and `acquired_at`);
//! 2. per resource, accepted writes never go from a higher token to a lower one, in the
//!    server's commit order;
//! 3. every write acknowledged to a client is present afterwards, and nothing is present
//!    that a client was told was refused; the resource holds the last accepted write;
//! 4. two grants of one lock never overlap in server time unless the first had expired.
//!
//! plus, after a crash, that no new grant has a token at or below one acknowledged before
//! it, and that no call failed with an error that no fault explains.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use postgres::Client;

/// Objects a test creates (as superuser) before its clients start.
///
/// Why `seq` is the server's commit order per resource: `fenced_update` locks the
/// resource's row (ON CONFLICT DO UPDATE locks it even when its WHERE refuses; a first
/// insert makes later inserters wait for its transaction), and the lock is held to the
/// end of the transaction. The history row is inserted after `fenced_update`, while that
/// lock is held, so of two accepted writes to one resource, the one that committed first
/// drew its `seq` first. (Across resources `seq` means nothing.)
pub const SETUP_SQL: &str = "
    CREATE TABLE public.fence_history (
        seq         bigserial PRIMARY KEY,
        resource_id text   NOT NULL,
        fence_token bigint NOT NULL,
        op          text   NOT NULL UNIQUE,
        at          timestamptz NOT NULL DEFAULT clock_timestamp()
    );
    -- The caller's own table that the lockext.fence write path protects.
    CREATE TABLE public.fenced_state (resource_id text PRIMARY KEY, op text NOT NULL);
    CREATE FUNCTION public.us(timestamptz) RETURNS bigint
        LANGUAGE sql IMMUTABLE STRICT
        AS 'SELECT (extract(epoch FROM $1) * 1000000)::bigint';
";

/// Microseconds since the Unix epoch on this machine's clock (the clients' clock).
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as i64
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Acquire,
    Renew,
    Release,
    Write,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// acquire: granted; renew: renewed; release: returned true; write: accepted and
    /// committed (the client saw COMMIT succeed).
    Ok,
    /// acquire or renew: NULL; release: false; write: `fenced_update` returned false.
    Refused,
    /// An error: the effect is unknown. `code` is the SQLSTATE if the server sent one.
    Failed {
        code: Option<String>,
        message: String,
    },
}

impl Outcome {
    /// The outcome of a call that returned `e`: unknown, with the SQLSTATE if the server
    /// sent one.
    pub fn failed(e: &postgres::Error) -> Outcome {
        Outcome::Failed {
            code: e.code().map(|c| c.code().to_string()),
            message: e.to_string(),
        }
    }
}

/// One call by one client, as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// The client session (one OS process), unique in a run.
    pub client: String,
    /// The call's number within the client; `client:seq` names a write in the database.
    pub seq: u64,
    pub kind: Kind,
    /// Lock id (acquire, renew, release) or resource id (write).
    pub target: String,
    /// The lease owner; for a write, the owner of the grant whose token it carries.
    pub owner: String,
    /// Token passed (renew, release, write) or returned (acquire, when granted).
    pub token: Option<i64>,
    /// Client clock (µs since the epoch) before sending and after the reply.
    pub start_us: i64,
    pub end_us: i64,
    pub outcome: Outcome,
    /// The session ran with synchronous_commit on: its acknowledged commits are on disk.
    pub durable: bool,
    /// Server clock (µs) read in the same statement just before the call (renew, release).
    pub srv_before: Option<i64>,
    /// Server clock (µs) read in the same statement just after the call.
    pub srv_after: Option<i64>,
    /// acquire: the grant's acquired_at (server clock, µs).
    pub acquired_at: Option<i64>,
    /// acquire, renew: the lease's (new) expiry (server clock, µs).
    pub expires_at: Option<i64>,
}

impl Op {
    pub fn id(&self) -> String {
        format!("{}:{}", self.client, self.seq)
    }

    pub fn ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }

    /// One line of tab-separated fields, no tab or newline inside.
    pub fn to_line(&self) -> String {
        fn opt(v: Option<i64>) -> String {
            v.map_or("-".to_string(), |v| v.to_string())
        }
        fn clean(s: &str) -> String {
            s.replace(['\t', '\n', '\r'], " ")
        }
        let outcome = match &self.outcome {
            Outcome::Ok => "ok".to_string(),
            Outcome::Refused => "refused".to_string(),
            Outcome::Failed { code, message } => {
                format!(
                    "failed:{}:{}",
                    code.as_deref().unwrap_or("-"),
                    clean(message)
                )
            }
        };
        let kind = match self.kind {
            Kind::Acquire => "acquire",
            Kind::Renew => "renew",
            Kind::Release => "release",
            Kind::Write => "write",
        };
        [
            clean(&self.client),
            self.seq.to_string(),
            kind.to_string(),
            clean(&self.target),
            clean(&self.owner),
            opt(self.token),
            self.start_us.to_string(),
            self.end_us.to_string(),
            if self.durable { "durable" } else { "async" }.to_string(),
            opt(self.srv_before),
            opt(self.srv_after),
            opt(self.acquired_at),
            opt(self.expires_at),
            outcome,
        ]
        .join("\t")
            + "\n"
    }

    pub fn from_line(line: &str) -> Result<Op, String> {
        let f: Vec<&str> = line.trim_end_matches('\n').splitn(14, '\t').collect();
        if f.len() != 14 {
            return Err(format!("{} fields in {line:?}", f.len()));
        }
        let int = |s: &str| {
            s.parse::<i64>()
                .map_err(|e| format!("{s:?}: {e} in {line:?}"))
        };
        let opt = |s: &str| if s == "-" { Ok(None) } else { int(s).map(Some) };
        let kind = match f[2] {
            "acquire" => Kind::Acquire,
            "renew" => Kind::Renew,
            "release" => Kind::Release,
            "write" => Kind::Write,
            k => return Err(format!("kind {k:?} in {line:?}")),
        };
        let outcome = match f[13] {
            "ok" => Outcome::Ok,
            "refused" => Outcome::Refused,
            s if s.starts_with("failed:") => {
                let mut parts = s["failed:".len()..].splitn(2, ':');
                let code = parts.next().unwrap_or("-");
                Outcome::Failed {
                    code: (code != "-").then(|| code.to_string()),
                    message: parts.next().unwrap_or("").to_string(),
                }
            }
            o => return Err(format!("outcome {o:?} in {line:?}")),
        };
        Ok(Op {
            client: f[0].to_string(),
            seq: int(f[1])? as u64,
            kind,
            target: f[3].to_string(),
            owner: f[4].to_string(),
            token: opt(f[5])?,
            start_us: int(f[6])?,
            end_us: int(f[7])?,
            durable: f[8] == "durable",
            srv_before: opt(f[9])?,
            srv_after: opt(f[10])?,
            acquired_at: opt(f[11])?,
            expires_at: opt(f[12])?,
            outcome,
        })
    }
}

/// A fenced write the server accepted and committed (a row of `fence_history`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Commit order among the writes of one resource.
    pub seq: i64,
    pub resource: String,
    pub token: i64,
    /// The writing [`Op::id`].
    pub op: String,
}

/// A row of `lockext.resources` at the end of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinalResource {
    pub resource: String,
    pub token: i64,
    /// The op named in the data of the last write stored (`data->>'op'`).
    pub op: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct History {
    pub ops: Vec<Op>,
    pub accepted: Vec<Accepted>,
    pub resources: Vec<FinalResource>,
}

impl History {
    /// Adds the ops recorded in a client's file.
    pub fn read_ops(&mut self, path: &std::path::Path) {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        for line in text.lines().filter(|l| !l.is_empty()) {
            self.ops
                .push(Op::from_line(line).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
        }
    }

    /// Reads the server's half: the accepted writes and the final resources.
    pub fn read_server(&mut self, c: &mut Client) {
        self.accepted = c
            .query(
                "SELECT seq, resource_id, fence_token, op FROM public.fence_history ORDER BY seq",
                &[],
            )
            .expect("read fence_history")
            .iter()
            .map(|r| Accepted {
                seq: r.get(0),
                resource: r.get(1),
                token: r.get(2),
                op: r.get(3),
            })
            .collect();
        self.resources = c
            // A resource written through lockext.fence keeps its last op in the caller's
            // own table; one written by fenced_update, in its document.
            .query(
                "SELECT r.resource_id, r.fence_token, coalesce(r.data->>'op', s.op) \
                   FROM lockext.resources r LEFT JOIN public.fenced_state s USING (resource_id) ORDER BY 1",
                &[],
            )
            .expect("read lockext.resources")
            .iter()
            .map(|r| FinalResource { resource: r.get(0), token: r.get(1), op: r.get(2) })
            .collect();
    }
}

/// A crash of the whole server: client clock once it was dead (after the kill), and when the restarted
/// server accepted connections again.
#[derive(Clone, Copy, Debug)]
pub struct Restart {
    pub kill_us: i64,
    pub restarted_us: i64,
}

#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    pub restarts: Vec<Restart>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Invariant {
    /// 1: no token returned by two grants.
    UniqueTokens,
    /// 2: per resource, accepted tokens never decrease in commit order.
    MonotonicWrites,
    /// 3: every acknowledged write is present; nothing refused is; the last one stays.
    NoLostWrites,
    /// 4: grants of one lock do not overlap in server time unless the first expired.
    NoOverlap,
    /// After a crash, new grants get tokens above every token acknowledged before it.
    TokensAfterRestart,
    /// A call failed with an error that no injected fault explains.
    UnexpectedError,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: Invariant,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.invariant, self.detail)
    }
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub ops: usize,
    pub clients: usize,
    pub acquires: usize,
    pub acquires_refused: usize,
    /// Distinct grants (lock, owner, token, acquired_at).
    pub grants: usize,
    /// Acquires that returned a grant the same owner already had (same token).
    pub same_grant_reacquires: usize,
    pub renews_ok: usize,
    pub renews_refused: usize,
    pub releases_ok: usize,
    pub releases_refused: usize,
    /// Writes the client saw accepted and committed.
    pub writes_acked: usize,
    /// Writes `fenced_update` refused (stale token).
    pub writes_rejected: usize,
    /// Writes whose outcome the client does not know (error).
    pub writes_unknown: usize,
    /// Accepted writes in the server's history.
    pub writes_in_db: usize,
    /// Acknowledged writes of `synchronous_commit = off` sessions lost in a crash, where
    /// that is allowed (see [`check`]).
    pub async_writes_lost: usize,
    /// Calls that failed with an error (connection lost and the like).
    pub failed_ops: usize,
    /// Grants made while an earlier grant of the same lock was live, in server time
    /// (also in `violations`).
    pub overlaps: usize,
    pub violations: Vec<Violation>,
}

impl Report {
    /// The violations, leaving out overlaps when `allow_overlaps` (clock steps).
    pub fn failures(&self, allow_overlaps: bool) -> Vec<&Violation> {
        self.violations
            .iter()
            .filter(|v| !(allow_overlaps && v.invariant == Invariant::NoOverlap))
            .collect()
    }

    pub fn count(&self, invariant: Invariant) -> usize {
        self.violations
            .iter()
            .filter(|v| v.invariant == invariant)
            .count()
    }

    pub fn summary(&self, scenario: &str) -> String {
        format!(
            "SUMMARY {scenario}: clients={} ops={} grants={} same-grant-reacquires={} acquires-refused={} \
             renews={}/{} releases={}/{} writes-accepted={} writes-rejected={} writes-unknown={} \
             in-db={} async-lost={} failed-calls={} overlaps={} other-violations={}",
            self.clients,
            self.ops,
            self.grants,
            self.same_grant_reacquires,
            self.acquires_refused,
            self.renews_ok,
            self.renews_ok + self.renews_refused,
            self.releases_ok,
            self.releases_ok + self.releases_refused,
            self.writes_acked,
            self.writes_rejected,
            self.writes_unknown,
            self.writes_in_db,
            self.async_writes_lost,
            self.failed_ops,
            self.overlaps,
            self.violations.len() - self.count(Invariant::NoOverlap),
        )
    }
}

/// Errors that injected faults explain: no SQLSTATE (the connection broke), connection
/// exceptions (08), operator intervention (57: admin/crash shutdown, cannot connect now).
pub fn fault_explains(code: Option<&str>) -> bool {
    match code {
        None => true,
        Some(c) => c.starts_with("08") || c.starts_with("57"),
    }
}

/// A grant: one lease of one lock, identified by (lock, owner, token, acquired_at).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct GrantKey {
    lock: String,
    owner: String,
    token: i64,
    acquired_at: i64,
}

struct GrantInfo {
    /// Server clock after the first acquire that returned it (before its commit): by
    /// then the grant was made.
    made_by: i64,
    /// The op that first returned it (client clock).
    first_start_us: i64,
    first_end_us: i64,
    /// (client end, expiry) of every acknowledged call that set its expiry durably.
    expiries: Vec<(i64, i64)>,
    /// Server clock just before each release that returned true.
    released_at: Vec<i64>,
}

/// Checks a history; see the module documentation for what.
///
/// Writes acknowledged to a `synchronous_commit = off` session may be lost in a crash:
/// that is what the setting means, and lockext does not change it for fenced writes.
/// But not any of them: a commit record is in the WAL before the client hears of the
/// commit, and a synchronous commit flushes the WAL up to its own record, so an async
/// write is durable once any synchronous commit that *started after its acknowledgment*
/// has been acknowledged. A lost async write is counted in `async_writes_lost` when a
/// crash (`opts.restarts`) followed it with no such commit in between; otherwise it is a
/// violation. Synchronous commits are acknowledged
/// calls of durable sessions that wrote (grant, renew, release, write), and new grants
/// in any session (with `lockext.durability = grant`, the default, lockext commits every
/// grant synchronously whatever the session's setting).
///
/// Likewise for expiries: a renewal (or same-owner re-acquire) acknowledged to an async
/// session may be lost in a crash, so the lease ends at its earlier expiry; only
/// expiries set by durable sessions and by the grant itself count for invariant 4.
pub fn check(h: &History, opts: &CheckOptions) -> Report {
    let mut r = Report {
        ops: h.ops.len(),
        ..Report::default()
    };
    let mut v: Vec<Violation> = Vec::new();
    let mut violate = |invariant, detail: String| v.push(Violation { invariant, detail });
    r.clients = h
        .ops
        .iter()
        .map(|o| &o.client)
        .collect::<HashSet<_>>()
        .len();

    // Calls in the order the clients finished them; ties are harmless.
    let mut ops: Vec<&Op> = h.ops.iter().collect();
    ops.sort_by_key(|o| (o.end_us, o.start_us));

    // ---- grants (invariant 1) ----
    let mut grants: BTreeMap<GrantKey, GrantInfo> = BTreeMap::new();
    let mut new_grant_ops: HashSet<String> = HashSet::new();
    for o in ops.iter().filter(|o| o.kind == Kind::Acquire) {
        r.acquires += 1;
        match &o.outcome {
            Outcome::Ok => {}
            Outcome::Refused => {
                r.acquires_refused += 1;
                continue;
            }
            Outcome::Failed { .. } => continue,
        }
        let (Some(token), Some(acquired_at), Some(expires_at), Some(after)) =
            (o.token, o.acquired_at, o.expires_at, o.srv_after)
        else {
            panic!("malformed acquire record {o:?}");
        };
        let key = GrantKey {
            lock: o.target.clone(),
            owner: o.owner.clone(),
            token,
            acquired_at,
        };
        match grants.get_mut(&key) {
            Some(g) => {
                r.same_grant_reacquires += 1;
                g.made_by = g.made_by.min(after);
                if o.durable {
                    g.expiries.push((o.end_us, expires_at));
                }
            }
            None => {
                new_grant_ops.insert(o.id());
                grants.insert(
                    key,
                    GrantInfo {
                        made_by: after,
                        first_start_us: o.start_us,
                        first_end_us: o.end_us,
                        expiries: vec![(o.end_us, expires_at)],
                        released_at: Vec::new(),
                    },
                );
            }
        }
    }
    r.grants = grants.len();
    let mut by_token: BTreeMap<i64, Vec<&GrantKey>> = BTreeMap::new();
    for k in grants.keys() {
        by_token.entry(k.token).or_default().push(k);
    }
    for (token, keys) in &by_token {
        if keys.len() > 1 {
            violate(
                Invariant::UniqueTokens,
                format!("token {token} returned by {} grants: {keys:?}", keys.len()),
            );
        }
    }

    // ---- renewals and releases: what ends each grant ----
    let find = |grants: &mut BTreeMap<GrantKey, GrantInfo>, o: &Op| -> Option<GrantKey> {
        let token = o.token?;
        let found: Vec<GrantKey> = grants
            .keys()
            .filter(|k| k.lock == o.target && k.owner == o.owner && k.token == token)
            .cloned()
            .collect();
        // Several grants with one token are already reported; take the latest.
        found.into_iter().max_by_key(|k| k.acquired_at)
    };
    for o in ops
        .iter()
        .filter(|o| o.kind == Kind::Renew || o.kind == Kind::Release)
    {
        match (o.kind, &o.outcome) {
            (Kind::Renew, Outcome::Ok) => r.renews_ok += 1,
            (Kind::Renew, Outcome::Refused) => r.renews_refused += 1,
            (Kind::Release, Outcome::Ok) => r.releases_ok += 1,
            (Kind::Release, Outcome::Refused) => r.releases_refused += 1,
            _ => continue,
        }
        if !o.ok() {
            continue;
        }
        // A renewal or release of a grant never seen (its acquire's reply was lost) can
        // only hide an overlap, never invent one.
        let Some(key) = find(&mut grants, o) else {
            continue;
        };
        let g = grants.get_mut(&key).expect("found");
        match o.kind {
            Kind::Renew if o.durable => g
                .expiries
                .push((o.end_us, o.expires_at.expect("renew expiry"))),
            Kind::Release => g
                .released_at
                .push(o.srv_before.expect("release server clock")),
            _ => {}
        }
    }

    // ---- invariant 4: overlap in server time ----
    // Grant G1 holds from its acquire until its last durable expiry, or until a release
    // that found it live (server clock just before that call). Grant G2 with a higher
    // token was made by the time its acquire statement finished (server clock right
    // after the call, in the same statement): if that is before G1 ended, both were
    // live at once. (G2's acquired_at is read before the acquire looks at the lease, so
    // it may precede a release or reap that the acquire then saw; the time after the call
    // has no such slack.)
    let mut per_lock: BTreeMap<&str, Vec<(&GrantKey, &GrantInfo)>> = BTreeMap::new();
    for (k, g) in &grants {
        per_lock.entry(k.lock.as_str()).or_default().push((k, g));
    }
    // Each later grant is reported once, with the first grant it overlaps.
    for (lock, mut list) in per_lock {
        list.sort_by_key(|(k, _)| k.token);
        let ends: Vec<i64> = list
            .iter()
            .map(|(_, g)| {
                let expiry = g
                    .expiries
                    .iter()
                    .max_by_key(|(end, _)| *end)
                    .map(|e| e.1)
                    .expect("grant expiry");
                g.released_at.iter().copied().fold(expiry, i64::min)
            })
            .collect();
        for (j, (k2, g2)) in list.iter().enumerate() {
            for (i, (k1, _)) in list[..j].iter().enumerate() {
                let end = ends[i];
                if k2.token == k1.token {
                    continue; // a duplicate token, reported above
                }
                if g2.made_by < end {
                    r.overlaps += 1;
                    violate(
                        Invariant::NoOverlap,
                        format!(
                            "lock {lock}: grant {} (owner {}) made at {} while grant {} (owner {}, acquired {}) \
                             held until {} ({} ms overlap)",
                            k2.token,
                            k2.owner,
                            g2.made_by,
                            k1.token,
                            k1.owner,
                            k1.acquired_at,
                            end,
                            (end - g2.made_by) as f64 / 1000.0
                        ),
                    );
                    break;
                }
            }
        }
    }

    // ---- writes (invariants 2 and 3) ----
    let writes: HashMap<String, &Op> = ops
        .iter()
        .filter(|o| o.kind == Kind::Write)
        .map(|o| (o.id(), *o))
        .collect();
    let in_db: HashMap<&str, &Accepted> = h.accepted.iter().map(|a| (a.op.as_str(), a)).collect();
    r.writes_in_db = h.accepted.len();
    // Acknowledged synchronous commits (client start, client end), for the async rule.
    let mut sync_commits: Vec<(i64, i64)> = ops
        .iter()
        .filter(|o| o.ok() && (o.durable || new_grant_ops.contains(&o.id())))
        .map(|o| (o.start_us, o.end_us))
        .collect();
    sync_commits.sort_unstable();
    for o in ops.iter().filter(|o| o.kind == Kind::Write) {
        match &o.outcome {
            Outcome::Ok => r.writes_acked += 1,
            Outcome::Refused => r.writes_rejected += 1,
            Outcome::Failed { .. } => r.writes_unknown += 1,
        }
        if !o.ok() || in_db.contains_key(o.id().as_str()) {
            continue;
        }
        let lost = format!(
            "write {} (token {:?} to {}, acknowledged at {})",
            o.id(),
            o.token,
            o.target,
            o.end_us
        );
        if o.durable {
            violate(
                Invariant::NoLostWrites,
                format!("{lost} is not in the database"),
            );
            continue;
        }
        // The crash that could have lost it: the first one after its acknowledgment.
        let Some(crash) = opts
            .restarts
            .iter()
            .map(|rs| rs.kill_us)
            .filter(|&k| k > o.end_us)
            .min()
        else {
            violate(
                Invariant::NoLostWrites,
                format!("async {lost} is lost with no crash after it"),
            );
            continue;
        };
        // A synchronous commit that started after it and was acknowledged before the crash.
        let flushed = sync_commits
            .iter()
            .find(|&&(start, end)| start > o.end_us && end < crash);
        match flushed {
            Some((start, end)) => violate(
                Invariant::NoLostWrites,
                format!(
                    "async {lost} is lost, although a synchronous commit made from {start} to {end}, before \
                     the crash at {crash}, flushed the WAL past it"
                ),
            ),
            None => r.async_writes_lost += 1,
        }
    }
    for a in &h.accepted {
        match writes.get(a.op.as_str()) {
            None => violate(
                Invariant::NoLostWrites,
                format!("accepted write {} is no client's write", a.op),
            ),
            Some(o) if o.outcome == Outcome::Refused => violate(
                Invariant::NoLostWrites,
                format!(
                    "write {} was refused to its client but is in the database",
                    a.op
                ),
            ),
            Some(o) if o.token != Some(a.token) || o.target != a.resource => violate(
                Invariant::NoLostWrites,
                format!(
                    "write {} stored as token {} to {}, sent as {:?} to {}",
                    a.op, a.token, a.resource, o.token, o.target
                ),
            ),
            Some(_) => {}
        }
    }
    let mut per_resource: BTreeMap<&str, Vec<&Accepted>> = BTreeMap::new();
    for a in &h.accepted {
        per_resource.entry(a.resource.as_str()).or_default().push(a);
    }
    for (res, list) in per_resource.iter_mut() {
        list.sort_by_key(|a| a.seq);
        for w in list.windows(2) {
            if w[1].token < w[0].token {
                violate(
                    Invariant::MonotonicWrites,
                    format!(
                        "resource {res}: write {} with token {} accepted after write {} with token {}",
                        w[1].op, w[1].token, w[0].op, w[0].token
                    ),
                );
            }
        }
    }
    let finals: BTreeMap<&str, &FinalResource> = h
        .resources
        .iter()
        .map(|f| (f.resource.as_str(), f))
        .collect();
    for (res, list) in &per_resource {
        let last = list.last().expect("non-empty");
        match finals.get(res) {
            None => {
                violate(Invariant::NoLostWrites, format!("resource {res} is gone; last accepted write {}", last.op))
            }
            Some(f) if f.token != last.token || f.op.as_deref() != Some(last.op.as_str()) => violate(
                Invariant::NoLostWrites,
                format!(
                    "resource {res} holds write {:?} with token {}, but the last accepted write is {} with token {}",
                    f.op, f.token, last.op, last.token
                ),
            ),
            Some(_) => {}
        }
    }
    for f in &h.resources {
        if !per_resource.contains_key(f.resource.as_str()) {
            violate(
                Invariant::NoLostWrites,
                format!(
                    "resource {} holds {:?}, which no accepted write recorded",
                    f.resource, f.op
                ),
            );
        }
    }

    // ---- tokens after a crash ----
    for rs in &opts.restarts {
        let before = grants
            .iter()
            .filter(|(_, g)| g.first_end_us < rs.kill_us)
            .map(|(k, _)| k.token)
            .max();
        let Some(before) = before else { continue };
        // A (lock, owner) tried before the crash may get its pre-crash grant back after
        // it (the reply was lost, the client retries with the same owner): not new.
        let tried_before: HashSet<(&str, &str)> = ops
            .iter()
            .filter(|o| o.kind == Kind::Acquire && o.start_us < rs.restarted_us)
            .map(|o| (o.target.as_str(), o.owner.as_str()))
            .collect();
        for (k, g) in &grants {
            if g.first_start_us > rs.restarted_us
                && !tried_before.contains(&(k.lock.as_str(), k.owner.as_str()))
                && k.token <= before
            {
                violate(
                    Invariant::TokensAfterRestart,
                    format!(
                        "grant of {} to {} after the restart has token {}, not above {before} acknowledged before it",
                        k.lock, k.owner, k.token
                    ),
                );
            }
        }
    }

    // ---- errors ----
    for o in &ops {
        if let Outcome::Failed { code, message } = &o.outcome {
            r.failed_ops += 1;
            if !fault_explains(code.as_deref()) {
                violate(
                    Invariant::UnexpectedError,
                    format!(
                        "{:?} {} by {}: {code:?} {message}",
                        o.kind,
                        o.target,
                        o.id()
                    ),
                );
            }
        }
    }

    let mut seen = BTreeSet::new();
    v.retain(|x| seen.insert((x.invariant, x.detail.clone())));
    r.violations = v;
    r
}
