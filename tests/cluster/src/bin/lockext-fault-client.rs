//! A lock-service client, one OS process, for the fault tests (tests/faults.rs): it can be
//! paused with SIGSTOP, and its server killed under it. Every call it makes is appended
//! to its history file as one line (`history::Op::to_line`), written with one write(2)
//! each, so a line is complete even if the process is killed.
//!
//! Arguments are `key=value`:
//!   url=…        libpq-style connection string
//!   id=…         client name, unique in the run (owners and write ids start with it)
//!   mode=…       worker | holder | pause-a | pause-b
//!   locks=a,b    locks to use (holder, pause-a, pause-b: the first)
//!   ttl_ms=N     lease length
//!   run_ms=N     how long to keep working (worker, holder); how long to keep trying
//!   stop=PATH    stop working (worker, holder) once this file exists, even before run_ms
//!   sync=on|off  the session's synchronous_commit
//!   stale_pct=N  worker: chance of pausing past the TTL between acquire and write
//!   seed=N       random seed
//!   out=PATH     history file
//!
//! Protected resource of lock L: `res-L`. A fenced write stores `{"op": id, "token": t}`
//! and, when accepted, inserts `public.fence_history` in the same transaction.
//!
//! Modes:
//! - worker: acquire a random lock (owner unique per attempt), sometimes re-acquire it as
//!   a retry would, pause (sometimes past the TTL), write, sometimes renew and write
//!   again, usually release. A lost connection is re-established until run_ms is over.
//! - holder: hold one lock for the whole run, renewing and writing every 100 ms; prints
//!   `granted <lock> <owner> <token>` once it has it, and `lost <lock>` if a renewal
//!   returns NULL.
//! - pause-a: acquire, print `granted <lock> <owner> <token>`, wait for a line on stdin,
//!   then write, renew and release, printing `write <bool>`, `renew <bool>`,
//!   `release <bool>`.
//! - pause-b: acquire (retrying while refused), write, release; prints `granted …`,
//!   `write <bool>`.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, Write};
use std::thread::sleep;
use std::time::{Duration, Instant};

use lockext_cluster_tests::history::{now_us, Kind, Op, Outcome};
use lockext_cluster_tests::Rng;
use postgres::{Client, NoTls};

struct Config {
    url: String,
    id: String,
    mode: String,
    locks: Vec<String>,
    ttl_ms: u64,
    run_ms: u64,
    sync: bool,
    stale_pct: u64,
    seed: u64,
    out: String,
    stop: Option<std::path::PathBuf>,
}

fn config() -> Config {
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
        mode: get("mode"),
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

struct Grant {
    lock: String,
    owner: String,
    token: i64,
}

struct Session {
    cfg: Config,
    client: Option<Client>,
    out: File,
    seq: u64,
    /// Fenced writes made so far: even ones go through `lockext.fence`.
    writes: u64,
    deadline: Instant,
}

fn failed(e: &postgres::Error) -> Outcome {
    Outcome::Failed {
        code: e.code().map(|c| c.code().to_string()),
        message: e.to_string(),
    }
}

impl Session {
    fn new(cfg: Config) -> Session {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&cfg.out)
            .unwrap_or_else(|e| panic!("open {}: {e}", cfg.out));
        let deadline = Instant::now() + Duration::from_millis(cfg.run_ms);
        Session {
            cfg,
            client: None,
            out,
            seq: 0,
            writes: 0,
            deadline,
        }
    }

    fn over(&self) -> bool {
        Instant::now() >= self.deadline || self.cfg.stop.as_ref().is_some_and(|p| p.exists())
    }

    /// A live connection, reconnecting (every 100 ms, until the deadline) if needed.
    fn conn(&mut self) -> Option<&mut Client> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
        }
        while self.client.is_none() {
            match Client::connect(&self.cfg.url, NoTls) {
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
    fn acquire(&mut self, lock: &str, owner: &str, ttl_ms: u64) -> Option<Option<Grant>> {
        let ttl = format!("{ttl_ms} milliseconds");
        let mut op = self.op(Kind::Acquire, lock, owner, None);
        let Some(c) = self.conn() else {
            self.record(op);
            return None;
        };
        op.start_us = now_us();
        let res = c.query_one(
            "WITH a AS MATERIALIZED (SELECT lockext.lock_acquire($1, $2, $3::text::interval) AS g) \
             SELECT (a.g).fence_token, public.us((a.g).acquired_at), public.us((a.g).expires_at), \
                    public.us(clock_timestamp()) \
               FROM a",
            &[&lock, &owner, &ttl],
        );
        let result = match res {
            Ok(row) => {
                op.token = row.get(0);
                op.acquired_at = row.get(1);
                op.expires_at = row.get(2);
                op.srv_after = row.get(3);
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
                op.outcome = failed(&e);
                None
            }
        };
        self.record(op);
        result
    }

    /// None when failed, Some(false) when refused.
    fn renew(&mut self, g: &Grant, ttl_ms: u64) -> Option<bool> {
        let ttl = format!("{ttl_ms} milliseconds");
        let mut op = self.op(Kind::Renew, &g.lock, &g.owner, Some(g.token));
        let Some(c) = self.conn() else {
            self.record(op);
            return None;
        };
        op.start_us = now_us();
        let res = c.query_one(
            "WITH a AS MATERIALIZED (SELECT public.us(clock_timestamp()) AS t0, \
                                            lockext.lock_renew($1, $2, $3::text::interval, $4) AS e) \
             SELECT t0, public.us(e), public.us(clock_timestamp()) FROM a",
            &[&g.lock, &g.owner, &ttl, &g.token],
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
                op.outcome = failed(&e);
                None
            }
        };
        self.record(op);
        result
    }

    fn release(&mut self, g: &Grant) -> Option<bool> {
        let mut op = self.op(Kind::Release, &g.lock, &g.owner, Some(g.token));
        let Some(c) = self.conn() else {
            self.record(op);
            return None;
        };
        op.start_us = now_us();
        let res = c.query_one(
            "WITH a AS MATERIALIZED (SELECT public.us(clock_timestamp()) AS t0, \
                                            lockext.lock_release($1, $2, $3) AS r) \
             SELECT t0, r, public.us(clock_timestamp()) FROM a",
            &[&g.lock, &g.owner, &g.token],
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
                op.outcome = failed(&e);
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
    fn write(&mut self, g: &Grant) -> Option<bool> {
        self.writes += 1;
        let via_fence = self.writes.is_multiple_of(2);
        let resource = format!("{}-{}", if via_fence { "fence" } else { "res" }, g.lock);
        let mut op = self.op(Kind::Write, &resource, &g.owner, Some(g.token));
        let id = op.id();
        let Some(c) = self.conn() else {
            self.record(op);
            return None;
        };
        op.start_us = now_us();
        let res = (|| -> Result<bool, postgres::Error> {
            let mut tx = c.transaction()?;
            if via_fence {
                match tx.execute("SELECT lockext.fence($1, $2)", &[&resource, &g.token]) {
                    Err(e) if e.code().map(|c| c.code()) == Some("55L01") => {
                        let _ = tx.rollback();
                        return Ok(false);
                    }
                    other => other?,
                };
                tx.execute(
                    "INSERT INTO public.fenced_state (resource_id, op) VALUES ($1, $2) \
                     ON CONFLICT (resource_id) DO UPDATE SET op = EXCLUDED.op",
                    &[&resource, &id],
                )?;
            } else {
                let accepted: bool = tx
                    .query_one(
                        "SELECT lockext.fenced_update($1, $2, jsonb_build_object('op', $3::text, 'token', $2::bigint))",
                        &[&resource, &g.token, &id],
                    )?
                    .get(0);
                if !accepted {
                    // Nothing changed; the answer is known whatever the rollback does.
                    let _ = tx.rollback();
                    return Ok(false);
                }
            }
            tx.execute(
                "INSERT INTO public.fence_history (resource_id, fence_token, op) VALUES ($1, $2, $3)",
                &[&resource, &g.token, &id],
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
                op.outcome = failed(&e);
                None
            }
        };
        self.record(op);
        result
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|_| out.flush())
        .expect("stdout");
}

fn worker(s: &mut Session, rng: &mut Rng) {
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

fn holder(s: &mut Session) {
    let lock = s.cfg.locks[0].clone();
    let owner = format!("{}-holder", s.cfg.id);
    let ttl = s.cfg.ttl_ms;
    let grant = loop {
        match s.acquire(&lock, &owner, ttl) {
            Some(Some(g)) => break g,
            _ if s.over() => return,
            _ => sleep(Duration::from_millis(50)),
        }
    };
    say(&format!(
        "granted {} {} {}",
        grant.lock, grant.owner, grant.token
    ));
    let mut round = 0u64;
    while !s.over() {
        round += 1;
        if s.renew(&grant, ttl) == Some(false) {
            say(&format!("lost {lock}"));
            return;
        }
        if round.is_multiple_of(3) {
            s.write(&grant);
        }
        sleep(Duration::from_millis(100));
    }
    let released = s.release(&grant);
    say(&format!("release {released:?}"));
}

fn pause_a(s: &mut Session) {
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
    let fmt = |r: Option<bool>| r.map_or("error".to_string(), |b| b.to_string());
    let w = s.write(&grant);
    say(&format!("write {}", fmt(w)));
    let r = s.renew(&grant, s.cfg.ttl_ms);
    say(&format!("renew {}", fmt(r)));
    let l = s.release(&grant);
    say(&format!("release {}", fmt(l)));
}

fn pause_b(s: &mut Session) {
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
    say(&format!(
        "write {}",
        w.map_or("error".to_string(), |b| b.to_string())
    ));
    s.release(&grant);
}

fn main() {
    let cfg = config();
    let mut rng = Rng(cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mode = cfg.mode.clone();
    let mut s = Session::new(cfg);
    match mode.as_str() {
        "worker" => worker(&mut s, &mut rng),
        "holder" => holder(&mut s),
        "pause-a" => pause_a(&mut s),
        "pause-b" => pause_b(&mut s),
        m => panic!("unknown mode {m}"),
    }
}
