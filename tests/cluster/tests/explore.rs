//! The schedule explorer: every ordered pair of lockext calls (A, B), with A stopped at each
//! of its pause points in turn while B runs to its end (or to a wait), then both finished,
//! and the invariants checked, on a real server. Pause points are where lockext can be
//! interrupted: before and after each SQL statement it runs, around a lock id's gate,
//! after it reads the clock, at pre-commit (`src/explore.rs`); they are counted by running
//! A alone with `lockext.explore_trace`, not listed by hand.
//!
//! - A starting **state** for the lock id (free; held by `h` for an hour; held by `h` with
//!   a lease that expires while A is stopped, so that B runs after the expiry).
//! - A **call** is one SQL statement a client sends (`CALLS`), run by A as it is
//!   (autocommit), inside `BEGIN ISOLATION LEVEL REPEATABLE READ` after the snapshot was
//!   taken and followed by a read, or inside `BEGIN` (READ COMMITTED) followed by more work
//!   (an exclusive grant's own fenced write with its new token) and `COMMIT`: its answer
//!   counts only once `COMMIT` returned (`Way`). One call is no statement: `session_end`,
//!   the disconnect of the session that holds the lease session-bound; its pause points
//!   are the exit hook's (`src/session.rs`), counted by stopping it at each in turn
//!   (`Explorer::exit_points`), as an exiting backend can send no NOTICE.
//!   A reaper batch is `lockext.reap()`: the reaper's own batch (`reaper::reap_batch`),
//!   run in a client's backend, so that it stops at its pause points like any call. The
//!   explorer's database has no reaper (a lease ends by its clock, never by a round between
//!   two steps); a round in the background worker runs the same batch, with the worker's
//!   settings (`lock_timeout = 1s`, which only makes it give up sooner).
//! - For each state, each A (and each of its ways), each pause point p of A, each B: the
//!   schedule "A until p, B to its end or its wait, A on". `LOCKEXT_EXPLORE=full` runs all
//!   of them (`make explore`); otherwise a sample (every pause point of every A, against
//!   B = the calls that compete with it most: see `sample`). `LOCKEXT_EXPLORE_PART=i/n`
//!   runs every n-th schedule from the i-th (`make test` splits the sample between the
//!   oldest and the newest PostgreSQL, `part`). `LOCKEXT_EXPLORE_ONLY=a,b` runs the pair
//!   (a, b) in every state and way (`a+c` for both, `*` for every call on that side;
//!   `LOCKEXT_EXPLORE_WAY=ReadCommitted` for A in that way only);
//!   `LOCKEXT_EXPLORE_COUNT=1` only counts the schedules a run would take, by pair, which
//!   costs one run of each A alone (the full run: `make explore-count`).
//!
//! The invariants, after B and again at the end: at most one exclusive holder that
//! believes it holds (its grant or renewal answered, not released, not expired), never an
//! exclusive and a shared lease live together, every token handed out above the state's and
//! distinct, every believed grant live at the end, a release that answered true leaves no
//! lease, the fenced resource's writes accepted in increasing token order and its mark the
//! highest accepted, no caller error outside lockext's documented SQLSTATEs, no session
//! left broken or waiting. A violation prints its schedule as a command that replays it.
//!
//! The checker is shown to catch what it should by `the_checker_catches_a_bad_history`,
//! which feeds it a history that breaks each invariant.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use lockext_cluster_tests::*;
use postgres::{Config, NoTls};

const DB: &str = "explore";
/// `pg_advisory_lock(19536, 1)`: what a stopped backend waits for (`src/explore.rs`).
const PAUSE_KEY: (i32, i32) = (0x4C50, 1);
const WITHIN: Duration = Duration::from_secs(30);
/// The TTL of the lease that expires while A is stopped.
const SHORT_TTL_MS: i64 = 250;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum State {
    Free,
    Held,
    Expiring,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Way {
    Autocommit,
    /// Inside `BEGIN ISOLATION LEVEL REPEATABLE READ`, after the snapshot was taken, followed
    /// by a read in the same transaction.
    RepeatableRead,
    /// Inside `BEGIN` (READ COMMITTED), followed by more work in the same transaction: an
    /// exclusive grant's own fenced write with the token it got (else a read), then
    /// `COMMIT`. The answer counts only once `COMMIT` returned (README: a grant inside an
    /// explicit transaction exists once it commits).
    ReadCommitted,
}

/// What a call's answer means for the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    /// An exclusive grant to `owner` (the answer is its token, or NULL).
    Exclusive(&'static str),
    /// A shared lease (the answer is its token, or NULL).
    Shared,
    /// A permit of the lock id's one-permit semaphore `<lock id>-sem`.
    Permit,
    /// The holder's renewal (the answer is the new expiry, or NULL).
    Renew,
    /// The holder's release (t/f).
    Release,
    /// A write to the fenced resource with the holder's token (t/f).
    Write,
    /// A rival's take-over and write with its new token ("token" or NULL).
    TakeOverWrite,
    /// The revocation of the keep-alive `{K}`: the leases attached to it end.
    Revoke,
    /// The end of the holder's session: its lease is session-bound, taken by the very
    /// session that disconnects, and the exit hook (`src/session.rs`) ends it ("ended").
    SessionEnd,
    /// A reaper batch (`lockext.reap()`): it deletes only what is dead, so what the
    /// invariants say of live leases covers it.
    Reap,
    /// Nothing that the invariants follow (reads, values, keep-alive renewals).
    Other,
}

#[derive(Clone, Copy, Debug)]
struct Call {
    name: &'static str,
    effect: Effect,
    /// Whether it is the holder's call, with its token: not run where nothing is held.
    holder: bool,
    /// `{L}` the lock id, `{R}` the resource id, `{T}` the holder's token, `{K}` a
    /// keep-alive of the caller's role. One statement; its answer is its first column.
    sql: &'static str,
}

const fn call(name: &'static str, effect: Effect, holder: bool, sql: &'static str) -> Call {
    Call {
        name,
        effect,
        holder,
        sql,
    }
}

const CALLS: &[Call] = &[
    call(
        "acquire",
        Effect::Exclusive("r"),
        false,
        "SELECT (lockext.lock_acquire('{L}', 'r' || pg_backend_pid(), '1 hour')).fence_token::text",
    ),
    call(
        "acquire_wait",
        Effect::Exclusive("w"),
        false,
        "SELECT (lockext.lock_acquire('{L}', 'w' || pg_backend_pid(), '1 hour', wait => '1 second')).fence_token::text",
    ),
    call(
        "acquire_shared",
        Effect::Shared,
        false,
        "SELECT (lockext.lock_acquire('{L}', 's' || pg_backend_pid(), '1 hour', mode => 'shared')).fence_token::text",
    ),
    call(
        "acquire_shared_wait",
        Effect::Shared,
        false,
        "SELECT (lockext.lock_acquire('{L}', 'S' || pg_backend_pid(), '1 hour', mode => 'shared', wait => '1 second')).fence_token::text",
    ),
    call(
        "acquire_all",
        Effect::Exclusive("a"),
        false,
        "SELECT min(fence_token)::text FROM lockext.lock_acquire_all(ARRAY['{L}', '{L}-2'], 'a' || pg_backend_pid(), '1 hour')",
    ),
    call(
        "campaign",
        Effect::Exclusive("c"),
        false,
        "SELECT (lockext.lock_campaign('{L}', 'c' || pg_backend_pid(), '1 hour', '{\"leader\": \"c\"}')).fence_token::text",
    ),
    call(
        "take_over_write",
        Effect::TakeOverWrite,
        false,
        "SELECT CASE WHEN lockext.fenced_update('{R}', g.fence_token, '{\"by\": \"t\"}') \
         THEN g.fence_token::text END FROM lockext.lock_acquire('{L}', 't' || pg_backend_pid(), '1 hour') AS g \
         WHERE g.fence_token IS NOT NULL",
    ),
    call(
        "acquire_permit",
        Effect::Permit,
        false,
        "SELECT (lockext.lock_acquire('{L}-sem', 'p' || pg_backend_pid(), '1 hour', permits => 1)).fence_token::text",
    ),
    call(
        "acquire_permit_wait",
        Effect::Permit,
        false,
        "SELECT (lockext.lock_acquire('{L}-sem', 'P' || pg_backend_pid(), '1 hour', permits => 1, wait => '1 second')).fence_token::text",
    ),
    call(
        "keepalive_acquire",
        Effect::Exclusive("k"),
        false,
        "SELECT (lockext.lock_acquire('{L}', 'k' || pg_backend_pid(), NULL, keepalive => {K})).fence_token::text",
    ),
    call(
        "keepalive_renew",
        Effect::Other,
        false,
        "SELECT lockext.lock_keepalive_renew({K})::text",
    ),
    call(
        "keepalive_grant",
        Effect::Other,
        false,
        "SELECT keepalive::text FROM lockext.lock_keepalive_grant('1 hour')",
    ),
    call(
        "keepalive_revoke",
        Effect::Revoke,
        false,
        "SELECT lockext.lock_keepalive_revoke({K})::text",
    ),
    call(
        "renew",
        Effect::Renew,
        true,
        "SELECT lockext.lock_renew('{L}', 'h', '1 hour', {T})::text",
    ),
    call(
        "release",
        Effect::Release,
        true,
        "SELECT lockext.lock_release('{L}', 'h', {T})::text",
    ),
    call(
        "set_value",
        Effect::Other,
        true,
        "SELECT lockext.lock_set_value('{L}', 'h', {T}, '{\"v\": 2}')::text",
    ),
    call(
        "lock_check",
        Effect::Other,
        true,
        "SELECT lockext.lock_check('{L}', {T})::text",
    ),
    call(
        "fenced_update",
        Effect::Write,
        true,
        "SELECT lockext.fenced_update('{R}', {T}, '{\"by\": \"h\"}')::text",
    ),
    call(
        "fence",
        Effect::Write,
        true,
        "SELECT 'fenced' FROM (SELECT lockext.fence('{R}', {T})) AS f",
    ),
    call(
        "fence_read",
        Effect::Other,
        true,
        "SELECT 'read' FROM (SELECT lockext.fence_read('{R}', {T})) AS r",
    ),
    call(
        "guarded_write",
        Effect::Other,
        true,
        "UPDATE explore_rows SET v = v + 1, fence_token = {T} WHERE id = '{L}' RETURNING v::text",
    ),
    // The holder's lease is taken `session_bound => true` by this call's session, which
    // then disconnects: the pause points are the exit hook's (`end_session`).
    call("session_end", Effect::SessionEnd, true, ""),
    // One batch of the reaper's, in this backend (`lockext.reap()`): what it ends is only
    // what was dead, which the invariants on live leases cover.
    call("reaper_batch", Effect::Reap, false, "SELECT lockext.reap()::text"),
];

/// The calls a sample takes as A (every pause point, against `sample`'s B calls): all but
/// those whose schedules cost a second each (a wait that runs out behind a held lease) or
/// a connection each (a session end).
const NOT_SAMPLED_AS_A: &[&str] = &["acquire_shared_wait", "acquire_permit_wait", "session_end"];

/// The calls a sample runs inside an explicit READ COMMITTED transaction as A.
const SAMPLED_READ_COMMITTED: &[&str] = &["acquire", "release"];

/// How `call` runs as A: a session's end is no statement, and has no transaction around it.
fn ways(call: Call, full: bool) -> Vec<Way> {
    if call.effect == Effect::SessionEnd {
        return vec![Way::Autocommit];
    }
    let mut ways = vec![Way::Autocommit, Way::RepeatableRead];
    if full || SAMPLED_READ_COMMITTED.contains(&call.name) {
        ways.push(Way::ReadCommitted);
    }
    ways
}

impl Call {
    fn text(&self, s: &SetupArgs) -> String {
        self.sql
            .replace("{L}", &s.lock)
            .replace("{R}", &s.resource)
            .replace("{T}", &s.t0.to_string())
            .replace("{K}", &s.keepalive.to_string())
    }
}

/// One side's outcome.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    Value(Option<String>),
    Error(String, String),
}

/// What happened in one schedule, in the order the invariants need it.
#[derive(Clone, Debug)]
struct History {
    state: State,
    /// The holder's token in the starting state (0 when free).
    t0: i64,
    /// The calls in the order they finished, with how they ran and their answers.
    finished: Vec<(Call, Way, Answer)>,
    /// Exclusive and shared leases of the lock id (and of its `-2` companion) when B had
    /// finished while A was stopped, and at the end: (mode, owner, token).
    mid: Vec<(String, String, i64)>,
    end: Vec<(String, String, i64)>,
    /// The resource's mark and the author of its document at the end.
    resource_end: (i64, Option<String>),
    /// Whether each session answered a plain query afterwards and waited for nothing.
    sessions_ok: bool,
}

/// SQLSTATEs a caller may get from lockext in these schedules (docs/errors.md): a lease
/// lost or a token stale (55L01), a keep-alive not live (55000), a call refused in
/// REPEATABLE READ (0A000).
const EXPECTED_ERRORS: &[&str] = &["55L01", "55000", "0A000"];

/// The invariants. Returns every violation found, as sentences.
fn check(h: &History) -> Vec<String> {
    let mut bad = Vec::new();
    let granted = |a: &Answer| -> Option<i64> {
        match a {
            Answer::Value(Some(v)) => v.parse::<i64>().ok(),
            _ => None,
        }
    };
    // Who believes it holds the lock exclusively at the end, and since when (order).
    let mut believers: Vec<(String, i64)> = Vec::new();
    let mut holder_believes = h.state != State::Free;
    // The call that answered that the holder's lease ended (a release, a session end).
    let mut released: Option<&str> = None;
    let mut tokens: Vec<i64> = Vec::new();
    // Accepted fenced writes: (token, the author its document names, if it stores one).
    let mut writes: Vec<(i64, Option<&str>)> = Vec::new();
    for (call, way, answer) in &h.finished {
        if let Answer::Error(code, message) = answer {
            // In REPEATABLE READ a row another transaction changed since the snapshot is a
            // serialization failure: nothing was done, and the client retries.
            let serialization = *way == Way::RepeatableRead && code == "40001";
            if !EXPECTED_ERRORS.contains(&code.as_str()) && !serialization {
                bad.push(format!(
                    "{} got an unexpected error {code}: {message}",
                    call.name
                ));
            }
        }
        match call.effect {
            Effect::Exclusive(owner) => {
                if let Some(t) = granted(answer) {
                    tokens.push(t);
                    believers.push((owner.to_string(), t));
                    if *way == Way::ReadCommitted {
                        // Its own fenced write, committed with the grant (`run_call`).
                        writes.push((t, Some(owner)));
                    }
                }
            }
            Effect::TakeOverWrite => {
                if let Some(t) = granted(answer) {
                    tokens.push(t);
                    believers.push(("t".to_string(), t));
                    writes.push((t, Some("t")));
                }
            }
            Effect::Shared | Effect::Permit => {
                if let Some(t) = granted(answer) {
                    tokens.push(t);
                }
            }
            Effect::Renew => {
                // A refusal is safe (the holder stops); a live holder's renewal may be
                // refused while another call of its own keeps the row locked
                // (docs/sql-reference.md, lock_renew: after 100 ms the answer stands).
                if h.state == State::Expiring {
                    holder_believes = matches!(answer, Answer::Value(Some(_)));
                }
            }
            Effect::Release => {
                if answer == &Answer::Value(Some("true".into())) {
                    released = Some(call.name);
                    holder_believes = false;
                }
            }
            Effect::SessionEnd => {
                // The session is gone: nobody believes in its lease, and
                // docs/sql-reference.md ("Session-bound leases") promises that its backend
                // ended the lease on its way out.
                if matches!(answer, Answer::Value(Some(_))) {
                    released = Some(call.name);
                    holder_believes = false;
                }
            }
            Effect::Write => {
                if matches!(answer, Answer::Value(Some(v)) if v != "false") {
                    // fenced_update stores a document by "h"; fence stores none.
                    writes.push((h.t0, (call.name == "fenced_update").then_some("h")));
                }
            }
            Effect::Revoke => {
                if matches!(answer, Answer::Value(Some(_))) {
                    believers.retain(|(owner, _)| !owner.starts_with('k'));
                }
            }
            Effect::Reap | Effect::Other => {}
        }
    }
    if h.state == State::Expiring
        && !h
            .finished
            .iter()
            .any(|(c, _, a)| c.effect == Effect::Renew && matches!(a, Answer::Value(Some(_))))
    {
        holder_believes = false;
    }
    if holder_believes {
        believers.insert(0, ("h".to_string(), h.t0));
    }
    if believers.len() > 1 {
        bad.push(format!(
            "two callers believe they hold the lock exclusively: {believers:?}"
        ));
    }
    let mut sorted = tokens.clone();
    sorted.sort();
    sorted.dedup();
    if sorted.len() != tokens.len() {
        bad.push(format!("a token was handed out twice: {tokens:?}"));
    }
    if let Some(low) = tokens.iter().find(|&&t| t <= h.t0) {
        bad.push(format!(
            "token {low} is not above the state's token {}",
            h.t0
        ));
    }
    for (when, leases) in [("after B", &h.mid), ("at the end", &h.end)] {
        let exclusive = leases.iter().filter(|l| l.0 == "exclusive").count();
        let shared = leases.iter().filter(|l| l.0 == "shared").count();
        let permits = leases.iter().filter(|l| l.0 == "permit").count();
        if permits > 1 {
            bad.push(format!(
                "{when}: {permits} permits of a one-permit semaphore: {leases:?}"
            ));
        }
        if exclusive > 1 {
            bad.push(format!(
                "{when}: {exclusive} exclusive leases live: {leases:?}"
            ));
        }
        if exclusive > 0 && shared > 0 {
            bad.push(format!(
                "{when}: exclusive and shared leases live together: {leases:?}"
            ));
        }
    }
    // A rival's owner is its letter and its backend's pid ('r12345'): two sessions are two
    // clients; the holder is 'h'.
    for (owner, token) in &believers {
        if !h
            .end
            .iter()
            .any(|l| l.1.starts_with(owner.as_str()) && l.2 == *token)
        {
            bad.push(format!(
                "{owner} believes it holds token {token}, which is not a live lease at the end: {:?}",
                h.end
            ));
        }
    }
    if let Some(by) = released {
        if h.end.iter().any(|l| l.1 == "h" && l.2 == h.t0) {
            bad.push(if by == "session_end" {
                "the holder's session ended (its backend exited), and its session-bound lease \
                 is still live"
                    .to_string()
            } else {
                format!("{by} answered that the lease ended, and it is still live")
            });
        }
    }
    // The order in which answers arrive is not the order of commits, so writes are
    // judged by what they left: the mark is the highest accepted token, and the document
    // is the one the highest accepted writer stored (a stale write accepted after a newer
    // one would have left its own).
    if let Some(&(last, author)) = writes.iter().max() {
        if h.resource_end.0 != last.max(h.t0) {
            bad.push(format!(
                "the resource's mark {} is not the highest accepted write {last}",
                h.resource_end.0
            ));
        }
        if let Some(author) = author {
            if h.resource_end.1.as_deref() != Some(author) {
                bad.push(format!(
                    "the resource's document is by {:?}, not by the highest accepted writer {author} ({writes:?})",
                    h.resource_end.1
                ));
            }
        }
    }
    if !h.sessions_ok {
        bad.push("a session was left broken, or waiting".into());
    }
    bad
}

fn sql_error(e: &postgres::Error) -> Answer {
    match e.as_db_error() {
        Some(d) => Answer::Error(d.code().code().to_string(), d.message().to_string()),
        None => Answer::Error("client".into(), e.to_string()),
    }
}

/// A session of the explorer: its client, its backend's pid, and the notices it got.
struct Session {
    client: Client,
    pid: i32,
    notices: Arc<Mutex<Vec<String>>>,
}

fn session(url: &str) -> Session {
    let notices = Arc::new(Mutex::new(Vec::new()));
    let sink = notices.clone();
    let mut config: Config = url.parse().expect("a connection string");
    config.notice_callback(move |n| sink.lock().expect("notices").push(n.message().to_string()));
    let mut client = config.connect(NoTls).expect("connect");
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .expect("pid")
        .get(0);
    // A backend's first lockext call looks up lockext's schema owner once (two pause points
    // that no later call passes): made here, so that a call counted alone in a fresh
    // session passes the same points as when it runs in a schedule.
    client
        .batch_execute(
            "SELECT lockext.lock_release('explore-warm-up', 'w', \
               (lockext.lock_acquire('explore-warm-up', 'w', '1 second')).fence_token)",
        )
        .expect("the session's first call");
    Session {
        client,
        pid,
        notices,
    }
}

/// The starting state of one schedule, on fresh ids: (lock id, resource id, t0, keep-alive,
/// the lease's expiry in ms since the epoch).
struct Setup {
    lock: String,
    resource: String,
    t0: i64,
    keepalive: i64,
    expires_ms: f64,
}

/// Ends session `s` (the call `session_end`): sets the pause point, disconnects, and waits
/// until its backend has exited (its exit hook ran). Returns a new session in its place.
fn end_session(mut s: Session, url: &str, pause: i64) -> (Session, Answer) {
    let old = s.pid;
    if let Err(e) = s
        .client
        .batch_execute(&format!("SET lockext.explore_pause_at = {pause}"))
    {
        return (s, sql_error(&e));
    }
    drop(s);
    let mut new = session(url);
    let started = Instant::now();
    loop {
        let gone = new
            .client
            .query_one(
                "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)",
                &[&old],
            )
            .map(|r| r.get::<_, bool>(0));
        match gone {
            Ok(true) => return (new, Answer::Value(Some("ended".into()))),
            Err(e) => return (new, sql_error(&e)),
            Ok(false) if started.elapsed() > WITHIN => {
                return (
                    new,
                    Answer::Error("client".into(), "the backend did not exit".into()),
                )
            }
            Ok(false) => thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Sets up `state`; the holder's grant is taken by `holder` when given (session-bound, for
/// `session_end`), else by `c`.
fn set_up(c: &mut Client, holder: Option<&mut Client>, state: State, n: u64) -> Setup {
    let lock = format!("L{n}");
    let resource = format!("R{n}");
    let keepalive: i64 = c
        .query_one(
            "SELECT keepalive FROM lockext.lock_keepalive_grant('1 hour')",
            &[],
        )
        .expect("keep-alive")
        .get(0);
    if state == State::Free {
        return Setup {
            lock,
            resource,
            t0: 0,
            keepalive,
            expires_ms: 0.0,
        };
    }
    let ttl = if state == State::Held {
        "1 hour".to_string()
    } else {
        format!("{SHORT_TTL_MS} milliseconds")
    };
    let bound = holder.is_some();
    let row = holder
        .unwrap_or(c)
        .query_one(
            "SELECT fence_token, extract(epoch FROM expires_at)::float8 * 1000 \
               FROM lockext.lock_acquire($1, 'h', $2::text::interval, session_bound => $3)",
            &[&lock, &ttl, &bound],
        )
        .expect("the holder's grant");
    let t0: i64 = row.get(0);
    let expires_ms: f64 = row.get(1);
    c.execute(
        "SELECT lockext.fenced_update($1, $2, '{\"by\": \"setup\"}')",
        &[&resource, &t0],
    )
    .expect("the resource's first write");
    c.execute(
        "INSERT INTO explore_rows (id, v, fence_token) VALUES ($1, 0, $2)",
        &[&lock, &t0],
    )
    .expect("the guarded row");
    Setup {
        lock,
        resource,
        t0,
        keepalive,
        expires_ms,
    }
}

fn leases(c: &mut Client, lock: &str) -> Vec<(String, String, i64)> {
    c.query(
        "SELECT CASE WHEN lock_id = $1 THEN mode ELSE 'permit' END, owner, fence_token \
           FROM lockext.holders WHERE lock_id IN ($1, $1 || '-sem') ORDER BY fence_token",
        &[&lock],
    )
    .expect("holders")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// Runs `call` the `way` given on `s`, stopping at pause point `pause` (0: never; or only
/// counting them with `trace`). Returns the answer.
fn run_call(
    s: &mut Client,
    call: Call,
    way: Way,
    setup: &SetupArgs,
    pause: i64,
    trace: bool,
) -> Answer {
    let set = if trace {
        "SET lockext.explore_trace = on".to_string()
    } else {
        format!("SET lockext.explore_pause_at = {pause}")
    };
    let result = (|| -> Result<Answer, postgres::Error> {
        match way {
            Way::Autocommit => {}
            Way::RepeatableRead => s.batch_execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM lockext.locks",
            )?,
            Way::ReadCommitted => s.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")?,
        }
        s.batch_execute(&set)?;
        let rows = s.query(&call.text(setup), &[])?;
        let value = rows.first().and_then(|r| r.get::<_, Option<String>>(0));
        if way == Way::ReadCommitted {
            let token = value.as_deref().and_then(|v| v.parse::<i64>().ok());
            if let (Effect::Exclusive(owner), Some(token)) = (call.effect, token) {
                // More work in the transaction: the new holder's write with its token, which
                // a grant not yet committed must already be allowed.
                let written: bool = s
                    .query_one(
                        "SELECT lockext.fenced_update($1, $2, jsonb_build_object('by', $3::text))",
                        &[&setup.resource, &token, &owner],
                    )?
                    .get(0);
                if !written {
                    let _ = s.batch_execute("ROLLBACK");
                    return Ok(Answer::Error(
                        "refused".into(),
                        format!("the grant's own write with token {token} was refused"),
                    ));
                }
            }
        }
        if way != Way::Autocommit {
            s.batch_execute("SELECT count(*) FROM lockext.holders; COMMIT")?;
        }
        Ok(Answer::Value(value))
    })();
    let answer = match result {
        Ok(a) => a,
        Err(e) => {
            let a = sql_error(&e);
            let _ = s.batch_execute("ROLLBACK");
            a
        }
    };
    let _ = s.batch_execute("RESET lockext.explore_pause_at; RESET lockext.explore_trace");
    answer
}

#[derive(Clone)]
struct SetupArgs {
    lock: String,
    resource: String,
    t0: i64,
    keepalive: i64,
}

/// The explorer's server: a database whose reaper never runs (a lease expires only by its
/// clock, never by a reaper round between the explorer's steps), with the guarded table.
fn explorer_cluster(name: &str) -> Cluster {
    let cluster = Cluster::start(
        name,
        "lockext.database = 'postgres'\nlockext.lock_delay = 0\nmax_connections = 40\n",
    );
    let mut pg = cluster.connect();
    pg.batch_execute(&format!("CREATE DATABASE {DB}"))
        .expect("create database");
    cluster
        .connect_to(DB)
        .batch_execute(
            "CREATE EXTENSION lockext;
             CREATE TABLE explore_rows (id text PRIMARY KEY, v int NOT NULL, fence_token bigint);
             CREATE TRIGGER explore_rows_fence BEFORE INSERT OR UPDATE OR DELETE ON explore_rows
                 FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');",
        )
        .expect("the explorer's schema");
    cluster
}

/// Whether backend `pid` waits for the explorer's pause lock.
fn paused(c: &mut Client, pid: i32) -> bool {
    c.query_one(
        "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int::oid \
            AND objid = $2::int::oid AND objsubid = 2 AND NOT granted AND pid = $3)",
        &[&PAUSE_KEY.0, &PAUSE_KEY.1, &pid],
    )
    .expect("pg_locks")
    .get(0)
}

/// Whether backend `pid` waits (for a lock, a latch, a nap): B "runs until it waits".
/// (A backend whose session ended runs its exit hook with its last state, `idle`, and
/// there naps between its tries at a lease row another transaction holds, an Extension
/// wait: a lock wait or lockext's nap counts whatever the state says. An idle backend
/// otherwise waits for its client, a Client wait.)
fn waiting(c: &mut Client, pid: i32) -> bool {
    c.query_one(
        "SELECT coalesce(bool_or(wait_event_type IN ('Lock', 'Extension') OR state = 'active' \
            AND wait_event_type IN ('Timeout', 'IPC', 'LWLock')), false) \
           FROM pg_stat_activity WHERE pid = $1",
        &[&pid],
    )
    .expect("pg_stat_activity")
    .get(0)
}

/// The whole exploration: returns (schedules run, violations with their replay commands).
struct Explorer {
    cluster: Cluster,
    url: String,
    control: Client,
    a: Option<Session>,
    b: Option<Session>,
    n: u64,
}

impl Explorer {
    fn new(name: &str) -> Explorer {
        let cluster = explorer_cluster(name);
        let control = cluster.connect_to(DB);
        let url = cluster.url(DB);
        let a = Some(session(&url));
        let b = Some(session(&url));
        Explorer {
            cluster,
            url,
            control,
            a,
            b,
            n: 0,
        }
    }

    /// A fresh starting state; `bound` ('A' or 'B'): that session takes the holder's lease,
    /// session-bound.
    fn setup(&mut self, state: State, bound: Option<char>) -> (SetupArgs, f64) {
        self.n += 1;
        let holder = match bound {
            Some('A') => self.a.as_mut().map(|s| &mut s.client),
            Some(_) => self.b.as_mut().map(|s| &mut s.client),
            None => None,
        };
        let s = set_up(&mut self.control, holder, state, self.n);
        (
            SetupArgs {
                lock: s.lock,
                resource: s.resource,
                t0: s.t0,
                keepalive: s.keepalive,
            },
            s.expires_ms,
        )
    }

    /// How many pause points `call` passes, run alone the `way` given in `state`.
    fn pause_points(&mut self, state: State, call: Call, way: Way) -> Vec<String> {
        if call.effect == Effect::SessionEnd {
            return self.exit_points(state);
        }
        let (args, _) = self.setup(state, None);
        let a = self.a.as_mut().expect("session A");
        a.notices.lock().expect("notices").clear();
        run_call(&mut a.client, call, way, &args, 0, true);
        let points: Vec<String> = a
            .notices
            .lock()
            .expect("notices")
            .iter()
            .filter(|n| n.starts_with("lockext explore point"))
            .cloned()
            .collect();
        points
    }

    /// The pause points of a session's end. An exiting backend can send no NOTICE (its
    /// client is gone), so they are counted by stopping it at the first, the second, ...
    /// until it exits without stopping: the pause works there as anywhere (the exit hook
    /// runs in a transaction of its own, with the lock manager still up).
    fn exit_points(&mut self, state: State) -> Vec<String> {
        let mut points = Vec::new();
        for p in 1.. {
            self.setup(state, Some('A'));
            self.control
                .execute(
                    "SELECT pg_advisory_lock($1, $2)",
                    &[&PAUSE_KEY.0, &PAUSE_KEY.1],
                )
                .expect("take the pause lock");
            let a = self.a.take().expect("session A");
            let pid = a.pid;
            let url = self.url.clone();
            let ending = thread::spawn(move || end_session(a, &url, p));
            let started = Instant::now();
            let stopped = loop {
                if ending.is_finished() {
                    break false;
                }
                if paused(&mut self.control, pid) {
                    break true;
                }
                assert!(
                    started.elapsed() < WITHIN,
                    "the session neither stopped nor ended"
                );
                thread::sleep(Duration::from_millis(2));
            };
            self.control
                .execute(
                    "SELECT pg_advisory_unlock($1, $2)",
                    &[&PAUSE_KEY.0, &PAUSE_KEY.1],
                )
                .expect("let it go on");
            let (a, answer) = ending.join().expect("the ending session");
            self.a = Some(a);
            assert_eq!(
                answer,
                Answer::Value(Some("ended".into())),
                "a session's end"
            );
            if !stopped {
                break;
            }
            points.push(format!("exit hook point {p}"));
        }
        points
    }

    /// One schedule: A until pause point `p`, B to its end or its wait, A on.
    fn schedule(&mut self, state: State, a_call: Call, way: Way, p: i64, b_call: Call) -> History {
        let bound = if a_call.effect == Effect::SessionEnd {
            Some('A')
        } else if b_call.effect == Effect::SessionEnd {
            Some('B')
        } else {
            None
        };
        let (args, expires_ms) = self.setup(state, bound);
        self.control
            .execute(
                "SELECT pg_advisory_lock($1, $2)",
                &[&PAUSE_KEY.0, &PAUSE_KEY.1],
            )
            .expect("take the pause lock");
        let mut a = self.a.take().expect("session A");
        let mut b = self.b.take().expect("session B");
        let (a_pid, b_pid) = (a.pid, b.pid);
        let (tx, rx) = mpsc::channel::<(char, Answer)>();
        let a_tx = tx.clone();
        let a_args = args.clone();
        let a_url = self.url.clone();
        let a_thread = thread::spawn(move || {
            let answer = if a_call.effect == Effect::SessionEnd {
                let (new, answer) = end_session(a, &a_url, p);
                a = new;
                answer
            } else {
                run_call(&mut a.client, a_call, way, &a_args, p, false)
            };
            a_tx.send(('A', answer.clone())).expect("send");
            a
        });
        let mut finished: Vec<(Call, Way, Answer)> = Vec::new();
        // A stops at p, or finishes without reaching it.
        let started = Instant::now();
        loop {
            if let Ok((_, answer)) = rx.try_recv() {
                finished.push((a_call, way, answer));
                break;
            }
            if paused(&mut self.control, a_pid) {
                break;
            }
            assert!(started.elapsed() < WITHIN, "A neither stopped nor finished");
            thread::sleep(Duration::from_millis(2));
        }
        if state == State::Expiring {
            // The holder's lease expires while A is stopped: B runs after that instant.
            loop {
                let now_ms: f64 = self
                    .control
                    .query_one(
                        "SELECT extract(epoch FROM clock_timestamp())::float8 * 1000",
                        &[],
                    )
                    .expect("clock")
                    .get(0);
                if now_ms > expires_ms + 1.0 {
                    break;
                }
                thread::sleep(Duration::from_millis(
                    ((expires_ms - now_ms).max(1.0)) as u64,
                ));
            }
        }
        let b_tx = tx.clone();
        let b_args = args.clone();
        let b_url = self.url.clone();
        let b_thread = thread::spawn(move || {
            let answer = if b_call.effect == Effect::SessionEnd {
                let (new, answer) = end_session(b, &b_url, 0);
                b = new;
                answer
            } else {
                run_call(&mut b.client, b_call, Way::Autocommit, &b_args, 0, false)
            };
            b_tx.send(('B', answer.clone())).expect("send");
            b
        });
        let started = Instant::now();
        let mut still = 0;
        let mut b_waited = false;
        // B waits for a lock that A holds: B goes on only once A's transaction has ended.
        let mut b_behind_a = false;
        loop {
            if let Ok((who, answer)) = rx.try_recv() {
                if who == 'B' {
                    finished.push((b_call, Way::Autocommit, answer));
                    break;
                }
                finished.push((a_call, way, answer));
            }
            if waiting(&mut self.control, b_pid) {
                still += 1;
                if still >= 3 {
                    b_waited = true;
                    b_behind_a = self
                        .control
                        .query_one("SELECT $1 = ANY (pg_blocking_pids($2))", &[&a_pid, &b_pid])
                        .map(|r| r.get::<_, bool>(0))
                        .unwrap_or(false);
                    break;
                }
            } else {
                still = 0;
            }
            assert!(started.elapsed() < WITHIN, "B neither finished nor waited");
            thread::sleep(Duration::from_millis(2));
        }
        let mid = leases(&mut self.control, &args.lock);
        self.control
            .execute(
                "SELECT pg_advisory_unlock($1, $2)",
                &[&PAUSE_KEY.0, &PAUSE_KEY.1],
            )
            .expect("let A go on");
        let mut arrived = Vec::new();
        while finished.len() < 2 {
            let (who, answer) = rx.recv_timeout(WITHIN).expect("both calls end");
            arrived.push(who);
            if who == 'A' {
                finished.push((a_call, way, answer));
            } else {
                finished.push((b_call, Way::Autocommit, answer));
            }
        }
        // B's answer can reach the explorer before A's although B finished after A: a B that
        // waited for a lock A held went on only once A's transaction ended (A's client reads
        // its answer after that), and a session's end, seen by polling for its backend to
        // leave, that waited for A's row ended after A's commit. The history must say so.
        let b_after_a = b_waited && (b_behind_a || b_call.effect == Effect::SessionEnd);
        if b_after_a && arrived == ['B', 'A'] {
            finished.swap(0, 1);
        }
        let mut a = a_thread.join().expect("A's thread");
        let mut b = b_thread.join().expect("B's thread");
        let end = leases(&mut self.control, &args.lock);
        let resource_end = self
            .control
            .query_opt(
                "SELECT fence_token, data->>'by' FROM lockext.resources WHERE resource_id = $1",
                &[&args.resource],
            )
            .expect("resource")
            .map(|r| (r.get::<_, i64>(0), r.get::<_, Option<String>>(1)))
            .unwrap_or((0, None));
        let sessions_ok = [&mut a.client, &mut b.client]
            .into_iter()
            .all(|c| c.query_one("SELECT 1", &[]).is_ok())
            && self
                .control
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = ANY($1)",
                    &[&vec![a_pid, b_pid]],
                )
                .map(|r| r.get::<_, i64>(0) == 0)
                .unwrap_or(false);
        self.a = Some(a);
        self.b = Some(b);
        History {
            state,
            t0: args.t0,
            finished,
            mid,
            end,
            resource_end,
            sessions_ok,
        }
    }
}

/// Which B calls a sample runs: the ones that compete with A for the same lease or
/// resource in that state. The full run (`LOCKEXT_EXPLORE=full`) takes every call.
fn sample(state: State) -> Vec<Call> {
    let names: &[&str] = match state {
        State::Free => &[
            "acquire",
            "acquire_wait",
            "acquire_shared",
            "acquire_permit",
            "take_over_write",
        ],
        State::Held => &[
            "acquire",
            "take_over_write",
            "renew",
            "release",
            "fenced_update",
        ],
        State::Expiring => &[
            "acquire",
            "acquire_shared",
            "take_over_write",
            "reaper_batch",
        ],
    };
    CALLS
        .iter()
        .copied()
        .filter(|c| names.contains(&c.name))
        .collect()
}

/// Which share of the schedules this run takes: `(i, n)` runs the i-th of every n, in the
/// order they are enumerated (`LOCKEXT_EXPLORE_PART=i/n`). `make test` runs the sample on
/// two PostgreSQL versions, one half on each; every other run takes all of them.
fn part() -> (usize, usize) {
    let part = std::env::var("LOCKEXT_EXPLORE_PART").ok();
    part.as_deref()
        .and_then(|p| p.split_once('/'))
        .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)))
        .filter(|&(i, n)| i < n)
        .unwrap_or((0, 1))
}

/// Whether one side of `LOCKEXT_EXPLORE_ONLY` (a call, `a+b+c`, or `*`) names `call`.
fn names(side: &str, call: Call) -> bool {
    side == "*" || side.split('+').any(|n| n == call.name)
}

/// `count`: only enumerate (every A's pause points, run alone) and count the schedules, by
/// pair, without running any (`LOCKEXT_EXPLORE_COUNT=1`).
fn explore(
    full: bool,
    only: Option<(&str, &str)>,
    count: bool,
    (share, shares): (usize, usize),
) -> (usize, Vec<String>) {
    let mut ex = Explorer::new(if full { "explore-full" } else { "explore" });
    let mut enumerated = 0;
    let mut run = 0;
    let mut violations = Vec::new();
    let mut by_pair: BTreeMap<(String, String), usize> = BTreeMap::new();
    for state in [State::Free, State::Held, State::Expiring] {
        for a_call in CALLS.iter().copied() {
            if state == State::Free && a_call.holder {
                continue;
            }
            if !full && only.is_none() && NOT_SAMPLED_AS_A.contains(&a_call.name) {
                continue;
            }
            if only.is_some_and(|(a, _)| !names(a, a_call)) {
                continue;
            }
            for way in ways(a_call, full || only.is_some()) {
                // `LOCKEXT_EXPLORE_WAY=ReadCommitted`: A only that way.
                if std::env::var("LOCKEXT_EXPLORE_WAY").is_ok_and(|w| w != format!("{way:?}")) {
                    continue;
                }
                let points = ex.pause_points(state, a_call, way);
                let bs = if full { CALLS.to_vec() } else { sample(state) };
                let bs = if only.is_some() { CALLS.to_vec() } else { bs };
                for b_call in bs {
                    if state == State::Free && b_call.holder {
                        continue;
                    }
                    // One holder's session cannot end twice.
                    if a_call.effect == Effect::SessionEnd && b_call.effect == Effect::SessionEnd {
                        continue;
                    }
                    if only.is_some_and(|(_, b)| !names(b, b_call)) {
                        continue;
                    }
                    for p in 1..=points.len() as i64 {
                        enumerated += 1;
                        if (enumerated - 1) % shares != share {
                            continue;
                        }
                        if count {
                            run += 1;
                            *by_pair
                                .entry((a_call.name.to_string(), b_call.name.to_string()))
                                .or_default() += 1;
                            continue;
                        }
                        let h = ex.schedule(state, a_call, way, p, b_call);
                        run += 1;
                        *by_pair
                            .entry((a_call.name.to_string(), b_call.name.to_string()))
                            .or_default() += 1;
                        if std::env::var("LOCKEXT_EXPLORE_VERBOSE").is_ok() {
                            println!(
                                "{state:?} {} ({way:?}) at {p} / {}: {:?} mid {:?} end {:?}",
                                a_call.name,
                                b_call.name,
                                h.finished
                                    .iter()
                                    .map(|(c, _, a)| (c.name, a.clone()))
                                    .collect::<Vec<_>>(),
                                h.mid,
                                h.end
                            );
                        }
                        for v in check(&h) {
                            violations.push(format!(
                                "{v}\n    schedule: state {state:?}, A = {} ({way:?}) stopped at point {p} \
                                 ({}), B = {}; answers {:?}\n    replay: LOCKEXT_EXPLORE_ONLY={},{} LOCKEXT_EXPLORE_WAY={way:?} \
                                 cargo test --profile cluster --test explore -- --nocapture",
                                a_call.name,
                                points[(p - 1) as usize],
                                b_call.name,
                                h.finished
                                    .iter()
                                    .map(|(c, _, a)| (c.name, a.clone()))
                                    .collect::<Vec<_>>(),
                                a_call.name,
                                b_call.name
                            ));
                        }
                    }
                }
            }
        }
    }
    println!(
        "Schedules {}, by pair (A, B):",
        if count { "counted" } else { "explored" }
    );
    for ((a, b), n) in &by_pair {
        println!("  {a:>16} x {b:<16} {n}");
    }
    drop(ex.cluster);
    (run, violations)
}

#[test]
fn every_schedule_of_two_calls_keeps_the_invariants() {
    let full = std::env::var("LOCKEXT_EXPLORE").as_deref() == Ok("full");
    let only_env = std::env::var("LOCKEXT_EXPLORE_ONLY").ok();
    let only = only_env.as_deref().and_then(|s| s.split_once(','));
    let count = std::env::var("LOCKEXT_EXPLORE_COUNT").as_deref() == Ok("1");
    let started = Instant::now();
    let (share, shares) = part();
    let (run, violations) = explore(full, only, count, (share, shares));
    println!(
        "{} schedules {}({}{}) in {:.0} s, {} violations",
        run,
        if count { "counted, none run " } else { "" },
        if full { "full" } else { "sample" },
        if shares > 1 {
            format!(", part {share} of every {shares}")
        } else {
            String::new()
        },
        started.elapsed().as_secs_f64(),
        violations.len()
    );
    for v in &violations {
        println!("VIOLATION: {v}");
    }
    assert!(run > 0, "no schedule ran");
    assert!(violations.is_empty(), "{} violations", violations.len());
}

/// The checker catches what it should: a history that breaks each invariant is reported.
/// The pairs whose schedules broke an invariant when the explorer first ran them, each kept
/// after its fix: every pause point of A against B, in every state and way, whatever
/// share of the sample this run takes.
const FOUND: &[(&str, &str)] = &[
    // A session-bound lease outlived its session: a renewal from another connection held
    // its row when the session ended, and the exit hook skipped it (src/session.rs now
    // tries again until the row is free, then leaves it to the reaper).
    ("renew", "session_end"),
    // A grant attached its lease to a keep-alive revoked while the grant was in flight,
    // and answered "granted" for a lease that was dead when it committed (18 schedules of
    // 60). The revocation now waits for the grants attaching to it
    // (sql/run/keepalive/revoke.sql), then deletes their leases too.
    ("keepalive_acquire", "keepalive_revoke"),
];

#[test]
fn the_schedules_it_found_stay_fixed() {
    for &(a, b) in FOUND {
        let (run, violations) = explore(false, Some((a, b)), false, (0, 1));
        for v in &violations {
            println!("VIOLATION: {v}");
        }
        assert!(run > 0, "no schedule of {a} x {b} ran");
        assert!(
            violations.is_empty(),
            "{a} x {b}: {} violations",
            violations.len()
        );
    }
}

#[test]
fn the_checker_catches_a_bad_history() {
    let call = |name: &str| *CALLS.iter().find(|c| c.name == name).expect("a call");
    let tok = |t: i64| Answer::Value(Some(t.to_string()));
    let yes = Answer::Value(Some("true".into()));
    const AC: Way = Way::Autocommit;
    const RC: Way = Way::ReadCommitted;
    let good = History {
        state: State::Held,
        t0: 10,
        finished: vec![
            (call("release"), AC, yes.clone()),
            (call("acquire"), AC, tok(11)),
        ],
        mid: vec![],
        end: vec![("exclusive".into(), "r".into(), 11)],
        resource_end: (10, Some("setup".into())),
        sessions_ok: true,
    };
    assert_eq!(check(&good), Vec::<String>::new(), "a good history passes");
    let cases: Vec<(&str, History)> = vec![
        (
            "two callers believe",
            History {
                finished: vec![(call("acquire"), AC, tok(11))],
                end: vec![("exclusive".into(), "r".into(), 11)],
                ..good.clone()
            },
        ),
        (
            "exclusive leases live",
            History {
                mid: vec![
                    ("exclusive".into(), "h".into(), 10),
                    ("exclusive".into(), "r".into(), 11),
                ],
                ..good.clone()
            },
        ),
        (
            "exclusive and shared",
            History {
                end: vec![
                    ("exclusive".into(), "r".into(), 11),
                    ("shared".into(), "s".into(), 12),
                ],
                ..good.clone()
            },
        ),
        (
            "handed out twice",
            History {
                state: State::Free,
                t0: 0,
                finished: vec![
                    (call("acquire_shared"), AC, tok(11)),
                    (call("acquire_shared"), AC, tok(11)),
                ],
                end: vec![],
                ..good.clone()
            },
        ),
        (
            "not above",
            History {
                finished: vec![
                    (call("release"), AC, yes.clone()),
                    (call("acquire"), AC, tok(9)),
                ],
                end: vec![("exclusive".into(), "r".into(), 9)],
                ..good.clone()
            },
        ),
        (
            "not a live lease",
            History {
                end: vec![],
                ..good.clone()
            },
        ),
        (
            "still live",
            History {
                finished: vec![(call("release"), AC, yes.clone())],
                end: vec![("exclusive".into(), "h".into(), 10)],
                ..good.clone()
            },
        ),
        (
            "not by the highest accepted writer",
            History {
                state: State::Expiring,
                finished: vec![
                    (call("take_over_write"), AC, tok(11)),
                    (call("fenced_update"), AC, yes.clone()),
                ],
                end: vec![("exclusive".into(), "t".into(), 11)],
                resource_end: (11, Some("h".into())),
                ..good.clone()
            },
        ),
        (
            "revived",
            History {
                state: State::Expiring,
                finished: vec![
                    (call("acquire"), AC, tok(11)),
                    (
                        call("renew"),
                        AC,
                        Answer::Value(Some("2026-12-02 05:00:00+00".into())),
                    ),
                ],
                end: vec![("exclusive".into(), "h".into(), 10)],
                ..good.clone()
            },
        ),
        (
            "unexpected error",
            History {
                finished: vec![
                    (call("release"), AC, yes.clone()),
                    (
                        call("acquire"),
                        AC,
                        Answer::Error("XX000".into(), "boom".into()),
                    ),
                ],
                end: vec![],
                ..good.clone()
            },
        ),
        (
            "a serialization failure outside REPEATABLE READ",
            History {
                finished: vec![
                    (call("release"), AC, yes.clone()),
                    (
                        call("acquire"),
                        AC,
                        Answer::Error("40001".into(), "x".into()),
                    ),
                ],
                end: vec![],
                ..good.clone()
            },
        ),
        (
            "two permits",
            History {
                end: vec![
                    ("exclusive".into(), "r".into(), 11),
                    ("permit".into(), "p1".into(), 12),
                    ("permit".into(), "p2".into(), 13),
                ],
                ..good.clone()
            },
        ),
        (
            "left broken",
            History {
                sessions_ok: false,
                ..good.clone()
            },
        ),
        (
            "a session-bound lease outlives its session",
            History {
                finished: vec![(call("session_end"), AC, Answer::Value(Some("ended".into())))],
                end: vec![("exclusive".into(), "h".into(), 10)],
                ..good.clone()
            },
        ),
        (
            "a reaper batch ended a live lease",
            History {
                finished: vec![(call("reaper_batch"), AC, tok(1))],
                end: vec![],
                ..good.clone()
            },
        ),
        (
            "a READ COMMITTED grant's own write lost",
            History {
                state: State::Free,
                t0: 0,
                finished: vec![(call("acquire"), RC, tok(11))],
                end: vec![("exclusive".into(), "r".into(), 11)],
                resource_end: (0, None),
                ..good.clone()
            },
        ),
        (
            "a READ COMMITTED grant never committed",
            History {
                state: State::Free,
                t0: 0,
                finished: vec![(call("acquire"), RC, tok(11))],
                end: vec![],
                resource_end: (11, Some("r".into())),
                ..good.clone()
            },
        ),
        (
            "a waiting shared grant beside an exclusive one",
            History {
                finished: vec![
                    (call("release"), AC, yes.clone()),
                    (call("acquire_shared_wait"), AC, tok(11)),
                    (call("acquire"), AC, tok(12)),
                ],
                end: vec![
                    ("shared".into(), "S1".into(), 11),
                    ("exclusive".into(), "r".into(), 12),
                ],
                ..good.clone()
            },
        ),
        (
            "a waiting permit's token handed out twice",
            History {
                finished: vec![
                    (call("release"), AC, yes.clone()),
                    (call("acquire_permit_wait"), AC, tok(11)),
                    (call("acquire_permit"), AC, tok(11)),
                ],
                end: vec![("permit".into(), "P1".into(), 11)],
                ..good.clone()
            },
        ),
    ];
    // A grant in READ COMMITTED with its own write, both committed: no violation.
    let committed = History {
        state: State::Free,
        t0: 0,
        finished: vec![(call("acquire"), RC, tok(11))],
        end: vec![("exclusive".into(), "r".into(), 11)],
        resource_end: (11, Some("r".into())),
        ..good.clone()
    };
    assert_eq!(check(&committed), Vec::<String>::new());
    // The same failure in REPEATABLE READ is the client's to retry: not a violation.
    let retried = History {
        finished: vec![
            (call("release"), AC, yes.clone()),
            (
                call("acquire"),
                Way::RepeatableRead,
                Answer::Error("40001".into(), "x".into()),
            ),
        ],
        end: vec![],
        ..good.clone()
    };
    assert_eq!(check(&retried), Vec::<String>::new());
    for (what, history) in cases {
        let found = check(&history);
        println!("{what}: {found:?}");
        assert!(!found.is_empty(), "the checker missed: {what}");
    }
}
