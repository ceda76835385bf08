//! The lock-service client the fault tests (`lockext-fault-client`) and the deployment
//! tests behind PgBouncer and Patroni (`tests/deploy`, `lockext-pooled-client`) run as OS
//! processes: its arguments, its calls, the history it records (one `history::Op` line per
//! call, written with one write(2) each, so a line is complete even if the process is
//! killed) and the modes both have (worker, pause-a, pause-b). One thing differs, and it
//! is the driver, not lockext: how statements are sent (`Sending`).
//!
//! Protected resource of lock L: `res-L` (or `fence-L`, below). A fenced write stores
//! `{"op": id, "token": t}` and, when accepted, inserts `public.fence_history` in the same
//! transaction.

use std::collections::{BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, Write};
use std::thread::sleep;
use std::time::{Duration, Instant};

use postgres::types::{ToSql, Type};
use postgres::{Client, GenericClient, NoTls, Row};

use crate::history::{now_us, Kind, Op, Outcome};
use crate::Rng;

/// How a client sends its statements.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Sending {
    /// rust-postgres prepares named statements (`s0`, `s1`, ...); the session is set up
    /// with SET (application_name, synchronous_commit).
    Prepared,
    /// The unnamed statement with the parameter types given (`query_typed`), and no SET:
    /// behind PgBouncer in transaction pooling mode a statement prepared on one server
    /// connection is not there for the next transaction (26000), or another client's of
    /// the same name is, and a SET sticks to a server connection. application_name goes in
    /// the connection string; synchronous_commit stays `on`.
    Typed,
}

/// The arguments, `key=value`: url, id, mode, locks=a,b, ttl_ms, run_ms, stop=PATH,
/// sync=on|off, stale_pct, seed, out=PATH (the binaries' headers say what each means).
pub struct Config {
    pub url: String,
    pub id: String,
    pub mode: String,
    pub locks: Vec<String>,
    pub ttl_ms: u64,
    pub run_ms: u64,
    pub sync: bool,
    pub stale_pct: u64,
    pub seed: u64,
    pub out: String,
    pub stop: Option<std::path::PathBuf>,
}

/// The process's arguments; `mode` is `default_mode` when not given (None: required).
pub fn config(default_mode: Option<&str>) -> Config {
    let args: HashMap<String, String> = std::env::args()
        .skip(1)
        .map(|a| {
            let (k, v) = a
                .split_once('=')
                .unwrap_or_else(|| panic!("argument {a:?} is not key=value"));
            (k.to_string(), v.to_string())
        })
        .collect();
    let get = |k: &str| {
        args.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("missing argument {k}="))
    };
    let num = |k: &str, d: u64| {
        args.get(k)
            .map_or(d, |v| v.parse().unwrap_or_else(|e| panic!("{k}: {e}")))
    };
    Config {
        url: get("url"),
        id: get("id"),
        mode: match default_mode {
            Some(mode) => args.get("mode").cloned().unwrap_or_else(|| mode.into()),
            None => get("mode"),
        },
        locks: get("locks").split(',').map(str::to_string).collect(),
        ttl_ms: num("ttl_ms", 300),
        run_ms: num("run_ms", 5000),
        sync: args.get("sync").is_none_or(|v| v != "off"),
        stale_pct: num("stale_pct", 0),
        seed: num("seed", 1),
        out: get("out"),
        stop: args.get("stop").map(std::path::PathBuf::from),
    }
}

/// The random numbers of a run: from its seed, so a failing run can be run again.
pub fn rng(cfg: &Config) -> Rng {
    Rng(cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
}

pub struct Grant {
    pub lock: String,
    pub owner: String,
    pub token: i64,
}

/// Prints `line` on stdout at once: the test reads it while the client runs.
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|_| out.flush())
        .expect("stdout");
}

/// A call's answer as the tests read it: `true`, `false`, or `error` (it failed).
pub fn show(r: Option<bool>) -> String {
    r.map_or("error".to_string(), |b| b.to_string())
}

type Params<'a> = [(&'a (dyn ToSql + Sync), Type)];

fn query_one(
    c: &mut impl GenericClient,
    sending: Sending,
    sql: &str,
    params: &Params<'_>,
) -> Result<Row, postgres::Error> {
    match sending {
        Sending::Prepared => {
            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
            c.query_one(sql, &values)
        }
        Sending::Typed => c.query_typed_one(sql, params),
    }
}

fn execute(
    c: &mut impl GenericClient,
    sending: Sending,
    sql: &str,
    params: &Params<'_>,
) -> Result<u64, postgres::Error> {
    match sending {
        Sending::Prepared => {
            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
            c.execute(sql, &values)
        }
        Sending::Typed => c.execute_typed(sql, params),
    }
}

pub struct Session {
    pub cfg: Config,
    sending: Sending,
    client: Option<Client>,
    out: File,
    seq: u64,
    /// Fenced writes made so far: even ones go through `lockext.fence`.
    pub writes: u64,
    deadline: Instant,
    /// The server sessions the acquires ran in (`pg_backend_pid()`).
    pub backends: BTreeSet<i32>,
}

impl Session {
    pub fn new(cfg: Config, sending: Sending) -> Session {
        if sending == Sending::Typed && !cfg.sync {
            panic!("sync=off needs a SET, which a pooled connection does not keep");
        }
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&cfg.out)
            .unwrap_or_else(|e| panic!("open {}: {e}", cfg.out));
        let deadline = Instant::now() + Duration::from_millis(cfg.run_ms);
        Session {
            cfg,
            sending,
            client: None,
            out,
            seq: 0,
            writes: 0,
            deadline,
            backends: BTreeSet::new(),
        }
    }

    pub fn over(&self) -> bool {
        Instant::now() >= self.deadline || self.cfg.stop.as_ref().is_some_and(|p| p.exists())
    }

    /// A live connection, reconnecting (every 100 ms, until the deadline) if needed; with
    /// several hosts and `target_session_attrs=read-write` in the url, to whichever is the
    /// primary now.
    fn conn(&mut self) -> Option<&mut Client> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
        }
        while self.client.is_none() {
            let url = match self.sending {
                Sending::Prepared => self.cfg.url.clone(),
                Sending::Typed => format!("{} application_name={}", self.cfg.url, self.cfg.id),
            };
            match Client::connect(&url, NoTls) {
                Ok(c) if self.sending == Sending::Typed => self.client = Some(c),
                Ok(mut c) => {
                    let setup = format!(
                        "SET application_name = '{}'; SET synchronous_commit = {}",
                        self.cfg.id,
                        if self.cfg.sync { "on" } else { "off" }
                    );
                    match c.batch_execute(&setup) {
                        Ok(()) => self.client = Some(c),
                        Err(_) => sleep(Duration::from_millis(100)),
                    }
                }
                Err(_) if !self.over() => sleep(Duration::from_millis(100)),
                Err(e) => {
                    eprintln!("{}: no connection before the deadline: {e}", self.cfg.id);
                    return None;
                }
            }
        }
        self.client.as_mut()
    }

    fn record(&mut self, mut op: Op) -> Op {
        op.end_us = now_us();
        self.out
            .write_all(op.to_line().as_bytes())
            .expect("write history");
        op
    }

    fn op(&mut self, kind: Kind, target: &str, owner: &str, token: Option<i64>) -> Op {
        self.seq += 1;
        Op {
            client: self.cfg.id.clone(),
            seq: self.seq,
            kind,
            target: target.to_string(),
            owner: owner.to_string(),
            token,
            start_us: now_us(),
            end_us: 0,
            outcome: Outcome::Failed {
                code: None,
                message: "no connection".into(),
            },
            durable: self.cfg.sync,
            srv_before: None,
            srv_after: None,
            acquired_at: None,
            expires_at: None,
        }
    }

    /// None when the call failed (the outcome is unknown), Some(None) when refused.
    pub fn acquire(&mut self, lock: &str, owner: &str, ttl_ms: u64) -> Option<Option<Grant>> {
        let ttl = format!("{ttl_ms} milliseconds");
        let mut op = self.op(Kind::Acquire, lock, owner, None);
        let sending = self.sending;
        let Some(c) = self.conn() else {
            self.record(op);
            return None;
        };
        op.start_us = now_us();
        let res = query_one(
            c,
            sending,
            "WITH a AS MATERIALIZED (SELECT lockext.lock_acquire($1, $2, $3::text::interval) AS g) \
             SELECT (a.g).fence_token, public.us((a.g).acquired_at), public.us((a.g).expires_at), \
                    public.us(clock_timestamp()), pg_backend_pid() \
               FROM a",
            &[(&lock, Type::TEXT), (&owner, Type::TEXT), (&ttl, Type::TEXT)],
        );
        let result = match res {
            Ok(row) => {
                op.token = row.get(0);
                op.acquired_at = row.get(1);
                op.expires_at = row.get(2);
                op.srv_after = row.get(3);
                self.backends.insert(row.get(4));
                op.outcome = if op.token.is_some() {
                    Outcome::Ok
                } else {
                    Outcome::Refused
                };
                Some(op.token.map(|token| Grant {
                    lock: lock.into(),
                    owner: owner.into(),
                    token,
                }))
            }
            Err(e) => {
                op.outcome = Outcome::failed(&e);
                None
            }
        };
        self.record(op);
        result
    }

    /// None when failed, Some(false) when refused.
    pub fn renew(&mut self, g: &Grant, ttl_ms: u64) -> Option<bool> {
        let ttl = format!("{ttl_ms} milliseconds");
        let mut op = self.op(Kind::Renew, &g.lock, &g.owner, Some(g.token));
        let sending = self.sending;
        let Some(c) = self.conn() else {
            self.record(op);
            return None;
        };
        op.start_us = now_us();
        let res = query_one(
            c,
            sending,
            "WITH a AS MATERIALIZED (SELECT public.us(clock_timestamp()) AS t0, \
                                            lockext.lock_renew($1, $2, $3::text::interval, $4) AS e) \
             SELECT t0, public.us(e), public.us(clock_timestamp()) FROM a",
            &[
                (&g.lock, Type::TEXT),
                (&g.owner, Type::TEXT),
                (&ttl, Type::TEXT),
                (&g.token, Type::INT8),
            ],
        );
        let result = match res {
            Ok(row) => {
                op.srv_before = row.get(0);
                op.expires_at = row.get(1);
                op.srv_after = row.get(2);
                op.outcome = if op.expires_at.is_some() {
                    Outcome::Ok
                } else {
                    Outcome::Refused
                };
                Some(op.expires_at.is_some())
            }
            Err(e) => {
                op.outcome = Outcome::failed(&e);
                None
            }
        };
        self.record(op);
        result
    }

    pub fn release(&mut self, g: &Grant) -> Option<bool> {
        let mut op = self.op(Kind::Release, &g.lock, &g.owner, Some(g.token));
        let sending = self.sending;
        let Some(c) = self.conn() else {
            self.record(op);
            return None;
        };
        op.start_us = now_us();
        let res = query_one(
            c,
            sending,
            "WITH a AS MATERIALIZED (SELECT public.us(clock_timestamp()) AS t0, \
                                            lockext.lock_release($1, $2, $3) AS r) \
             SELECT t0, r, public.us(clock_timestamp()) FROM a",
            &[
                (&g.lock, Type::TEXT),
                (&g.owner, Type::TEXT),
                (&g.token, Type::INT8),
            ],
        );
        let result = match res {
            Ok(row) => {
                op.srv_before = row.get(0);
                let released: bool = row.get(1);
                op.srv_after = row.get(2);
                op.outcome = if released {
                    Outcome::Ok
                } else {
                    Outcome::Refused
                };
                Some(released)
            }
            Err(e) => {
                op.outcome = Outcome::failed(&e);
                None
            }
        };
        self.record(op);
        result
    }

    /// A fenced write, by one of lockext's two write paths in turn:
    /// - `fenced_update` of resource `res-<lock>` and, if it accepted, the history row;
    /// - `lockext.fence('fence-<lock>', token)` in the caller's transaction, then writes to
    ///   the caller's own tables (`fenced_state` and the history row); a stale token aborts
    ///   the transaction with 55L01.
    ///
    /// In both, the history row commits with the write. None when failed (unknown),
    /// Some(false) when refused.
    pub fn write(&mut self, g: &Grant) -> Option<bool> {
        self.writes += 1;
        let via_fence = self.writes.is_multiple_of(2);
        let resource = format!("{}-{}", if via_fence { "fence" } else { "res" }, g.lock);
        let mut op = self.op(Kind::Write, &resource, &g.owner, Some(g.token));
        let id = op.id();
        let sending = self.sending;
        let Some(c) = self.conn() else {
            self.record(op);
            return None;
        };
        op.start_us = now_us();
        let res = (|| -> Result<bool, postgres::Error> {
            let mut tx = c.transaction()?;
            if via_fence {
                match execute(
                    &mut tx,
                    sending,
                    "SELECT lockext.fence($1, $2)",
                    &[(&resource, Type::TEXT), (&g.token, Type::INT8)],
                ) {
                    Err(e) if e.code().map(|c| c.code()) == Some("55L01") => {
                        let _ = tx.rollback();
                        return Ok(false);
                    }
                    other => other?,
                };
                execute(
                    &mut tx,
                    sending,
                    "INSERT INTO public.fenced_state (resource_id, op) VALUES ($1, $2) \
                     ON CONFLICT (resource_id) DO UPDATE SET op = EXCLUDED.op",
                    &[(&resource, Type::TEXT), (&id, Type::TEXT)],
                )?;
            } else {
                let accepted: bool = query_one(
                    &mut tx,
                    sending,
                    "SELECT lockext.fenced_update($1, $2, jsonb_build_object('op', $3::text, 'token', $2::bigint))",
                    &[(&resource, Type::TEXT), (&g.token, Type::INT8), (&id, Type::TEXT)],
                )?
                .get(0);
                if !accepted {
                    // Nothing changed; the answer is known whatever the rollback does.
                    let _ = tx.rollback();
                    return Ok(false);
                }
            }
            execute(
                &mut tx,
                sending,
                "INSERT INTO public.fence_history (resource_id, fence_token, op) VALUES ($1, $2, $3)",
                &[(&resource, Type::TEXT), (&g.token, Type::INT8), (&id, Type::TEXT)],
            )?;
            tx.commit()?;
            Ok(true)
        })();
        let result = match res {
            Ok(accepted) => {
                op.outcome = if accepted {
                    Outcome::Ok
                } else {
                    Outcome::Refused
                };
                Some(accepted)
            }
            Err(e) => {
                op.outcome = Outcome::failed(&e);
                None
            }
        };
        self.record(op);
        result
    }
}

/// Mode `worker`: acquire a random lock (owner unique per attempt), sometimes re-acquire it
/// as a retry would, pause (sometimes past the TTL), write, sometimes renew and write
/// again, usually release. A lost connection is re-established until run_ms is over.
pub fn worker(s: &mut Session, rng: &mut Rng) {
    let ttl = s.cfg.ttl_ms;
    let mut n = 0u64;
    while !s.over() {
        n += 1;
        let lock = s.cfg.locks[rng.below(s.cfg.locks.len() as u64) as usize].clone();
        let owner = format!("{}-{n}", s.cfg.id);
        let grant = match s.acquire(&lock, &owner, ttl) {
            // The reply was lost: retry with the same owner, as docs/sql-reference.md
            // (lock_acquire) says clients should.
            None => match s.acquire(&lock, &owner, ttl) {
                Some(Some(g)) => g,
                _ => continue,
            },
            Some(None) => {
                sleep(Duration::from_millis(1 + rng.below(15)));
                continue;
            }
            Some(Some(g)) => g,
        };
        if rng.pct(15) {
            // A retry of the same acquire: the same grant comes back.
            s.acquire(&lock, &owner, ttl);
        }
        let pause = if rng.pct(s.cfg.stale_pct) {
            ttl + 20 + rng.below(ttl)
        } else {
            rng.below(ttl / 4 + 1)
        };
        sleep(Duration::from_millis(pause));
        if s.write(&grant) == Some(true) && rng.pct(50) && s.renew(&grant, ttl) == Some(true) {
            sleep(Duration::from_millis(rng.below(ttl / 4 + 1)));
            s.write(&grant);
        }
        if rng.pct(90) {
            s.release(&grant);
        }
    }
}

/// Mode `pause-a`: acquire, print `granted <lock> <owner> <token>`, wait for a line on
/// stdin, then write, renew and release, printing `write <bool>`, `renew <bool>`,
/// `release <bool>`. With `retry_write`, a write that failed (its connection died with the
/// old primary) is tried once more, the same write to the same resource on a new
/// connection, as a client with a reconnect loop does.
pub fn pause_a(s: &mut Session, retry_write: bool) {
    let lock = s.cfg.locks[0].clone();
    let owner = format!("{}-a", s.cfg.id);
    let Some(Some(grant)) = s.acquire(&lock, &owner, s.cfg.ttl_ms) else {
        say("refused");
        return;
    };
    say(&format!(
        "granted {} {} {}",
        grant.lock, grant.owner, grant.token
    ));
    // Here the test stops this process; "go" was sent while it was stopped.
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("stdin");
    let mut w = s.write(&grant);
    if retry_write && w.is_none() {
        s.writes -= 1;
        w = s.write(&grant);
    }
    say(&format!("write {}", show(w)));
    let r = s.renew(&grant, s.cfg.ttl_ms);
    say(&format!("renew {}", show(r)));
    let l = s.release(&grant);
    say(&format!("release {}", show(l)));
}

/// Mode `pause-b`: acquire (retrying while refused), write, release; prints `granted …`,
/// `write <bool>`.
pub fn pause_b(s: &mut Session) {
    let lock = s.cfg.locks[0].clone();
    let owner = format!("{}-b", s.cfg.id);
    let grant = loop {
        match s.acquire(&lock, &owner, s.cfg.ttl_ms) {
            Some(Some(g)) => break g,
            _ if s.over() => {
                say("refused");
                return;
            }
            _ => sleep(Duration::from_millis(20)),
        }
    };
    say(&format!(
        "granted {} {} {}",
        grant.lock, grant.owner, grant.token
    ));
    let w = s.write(&grant);
    say(&format!("write {}", show(w)));
    s.release(&grant);
}
