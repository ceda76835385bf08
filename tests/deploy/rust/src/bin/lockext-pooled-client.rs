//! The fault suite's worker client (tests/cluster/src/bin/lockext-fault-client.rs, mode
//! `worker`), for a connection through PgBouncer in transaction pooling mode.
//!
//! The calls, their order, the randomness, the two write paths (`fenced_update`, and
//! `lockext.fence` before writes to the caller's own table) and the history it records (one
//! `history::Op` line per call) are the fault client's. One thing differs, and it is the
//! driver, not lockext: every statement is sent with `query_typed`/`execute_typed`, i.e. the
//! unnamed statement with the parameter types given, where the fault client lets
//! rust-postgres prepare named statements (`s0`, `s1`, ...). PgBouncer 1.18 (Debian 12) sends
//! each transaction to whichever server connection is free, so a statement prepared on one
//! server connection is not there for the next transaction (26000), or another client's
//! statement of the same name is (42P05, or worse, the wrong statement runs). lockext keeps
//! no session state, so nothing else needs to change. The session settings the fault client
//! makes with SET are left out for the same reason (a SET sticks to a server connection):
//! application_name goes in the connection string, and synchronous_commit stays `on`.
//!
//! It also reads `pg_backend_pid()` in each acquire statement and prints
//! `backends <n> <pid,pid,...>` when done: the server sessions it was multiplexed over.
//!
//! Arguments are `key=value`: url, id, mode=worker|pause-a|pause-b (default worker),
//! locks=a,b, ttl_ms, run_ms, stop=PATH, stale_pct, seed, out=PATH (as the fault client's).
//! pause-a and pause-b are the fault client's too: A acquires, prints
//! `granted <lock> <owner> <token>`, waits for a line on stdin, then writes (once more if that
//! failed with a lost connection), renews and releases, printing `write <bool>`, `renew <bool>`, `release <bool>`; B acquires (retrying
//! while refused), prints `granted ...`, writes (`write <bool>`) and releases.
//!
//! The url may name several hosts with `target_session_attrs=read-write` (the Patroni test):
//! a lost connection is re-established to whichever is the primary now, every 100 ms until
//! run_ms is over.

use std::collections::{BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::thread::sleep;
use std::time::{Duration, Instant};

use lockext_cluster_tests::history::{now_us, Kind, Op, Outcome};
use postgres::types::Type;
use postgres::{Client, NoTls};

struct Config {
    url: String,
    id: String,
    mode: String,
    locks: Vec<String>,
    ttl_ms: u64,
    run_ms: u64,
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
        mode: args.get("mode").cloned().unwrap_or_else(|| "worker".into()),
        locks: get("locks").split(',').map(str::to_string).collect(),
        ttl_ms: num("ttl_ms", 300),
        run_ms: num("run_ms", 5000),
        stale_pct: num("stale_pct", 0),
        seed: num("seed", 1),
        out: get("out"),
        stop: args.get("stop").map(std::path::PathBuf::from),
    }
}

/// xorshift64*, as in the fault client.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
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
    writes: u64,
    deadline: Instant,
    backends: BTreeSet<i32>,
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
            backends: BTreeSet::new(),
        }
    }

    fn over(&self) -> bool {
        Instant::now() >= self.deadline || self.cfg.stop.as_ref().is_some_and(|p| p.exists())
    }

    fn conn(&mut self) -> Option<&mut Client> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
        }
        while self.client.is_none() {
            let url = format!("{} application_name={}", self.cfg.url, self.cfg.id);
            match Client::connect(&url, NoTls) {
                Ok(c) => self.client = Some(c),
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
            durable: true,
            srv_before: None,
            srv_after: None,
            acquired_at: None,
            expires_at: None,
        }
    }

    fn acquire(&mut self, lock: &str, owner: &str, ttl_ms: u64) -> Option<Option<Grant>> {
        let ttl = format!("{ttl_ms} milliseconds");
        let mut op = self.op(Kind::Acquire, lock, owner, None);
        let Some(c) = self.conn() else {
            self.record(op);
            return None;
        };
        op.start_us = now_us();
        let res = c.query_typed(
            "WITH a AS MATERIALIZED (SELECT lockext.lock_acquire($1, $2, $3::interval) AS g) \
             SELECT (a.g).fence_token, public.us((a.g).acquired_at), public.us((a.g).expires_at), \
                    public.us(clock_timestamp()), pg_backend_pid() \
               FROM a",
            &[
                (&lock, Type::TEXT),
                (&owner, Type::TEXT),
                (&ttl, Type::TEXT),
            ],
        );
        let result = match res.map(|rows| rows.into_iter().next().expect("one row")) {
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
                op.outcome = failed(&e);
                None
            }
        };
        self.record(op);
        result
    }

    fn renew(&mut self, g: &Grant, ttl_ms: u64) -> Option<bool> {
        let ttl = format!("{ttl_ms} milliseconds");
        let mut op = self.op(Kind::Renew, &g.lock, &g.owner, Some(g.token));
        let Some(c) = self.conn() else {
            self.record(op);
            return None;
        };
        op.start_us = now_us();
        let res = c.query_typed_one(
            "WITH a AS MATERIALIZED (SELECT public.us(clock_timestamp()) AS t0, \
                                            lockext.lock_renew($1, $2, $3::interval, $4) AS e) \
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
        let res = c.query_typed_one(
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
                op.outcome = failed(&e);
                None
            }
        };
        self.record(op);
        result
    }

    /// A fenced write by one of the two write paths in turn, as the fault client's.
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
                match tx.execute_typed(
                    "SELECT lockext.fence($1, $2)",
                    &[(&resource, Type::TEXT), (&g.token, Type::INT8)],
                ) {
                    Err(e) if e.code().map(|c| c.code()) == Some("55L01") => {
                        let _ = tx.rollback();
                        return Ok(false);
                    }
                    other => other?,
                };
                tx.execute_typed(
                    "INSERT INTO public.fenced_state (resource_id, op) VALUES ($1, $2) \
                     ON CONFLICT (resource_id) DO UPDATE SET op = EXCLUDED.op",
                    &[(&resource, Type::TEXT), (&id, Type::TEXT)],
                )?;
            } else {
                let accepted: bool = tx
                    .query_typed_one(
                        "SELECT lockext.fenced_update($1, $2, jsonb_build_object('op', $3::text, 'token', $2::bigint))",
                        &[(&resource, Type::TEXT), (&g.token, Type::INT8), (&id, Type::TEXT)],
                    )?
                    .get(0);
                if !accepted {
                    let _ = tx.rollback();
                    return Ok(false);
                }
            }
            tx.execute_typed(
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
                op.outcome = failed(&e);
                None
            }
        };
        self.record(op);
        result
    }
}

/// The fault client's worker loop, unchanged.
fn worker(s: &mut Session, rng: &mut Rng) {
    let ttl = s.cfg.ttl_ms;
    let mut n = 0u64;
    while !s.over() {
        n += 1;
        let lock = s.cfg.locks[rng.below(s.cfg.locks.len() as u64) as usize].clone();
        let owner = format!("{}-{n}", s.cfg.id);
        let grant = match s.acquire(&lock, &owner, ttl) {
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

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|_| out.flush())
        .expect("stdout");
}

fn show(r: Option<bool>) -> String {
    r.map_or("error".to_string(), |b| b.to_string())
}

/// The fault client's pause-a.
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
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("stdin");
    // A write that failed (its connection died with the old primary) is tried once more, the
    // same write to the same resource on a new connection, as a client with a reconnect loop does.
    let w = s.write(&grant).or_else(|| {
        s.writes -= 1;
        s.write(&grant)
    });
    say(&format!("write {}", show(w)));
    let r = s.renew(&grant, s.cfg.ttl_ms);
    say(&format!("renew {}", show(r)));
    let l = s.release(&grant);
    say(&format!("release {}", show(l)));
}

/// The fault client's pause-b.
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
    say(&format!("write {}", show(w)));
    s.release(&grant);
}

fn main() {
    let cfg = config();
    let mut rng = Rng(cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mode = cfg.mode.clone();
    let mut s = Session::new(cfg);
    match mode.as_str() {
        "worker" => {
            worker(&mut s, &mut rng);
            let pids: Vec<String> = s.backends.iter().map(|p| p.to_string()).collect();
            say(&format!("backends {} {}", pids.len(), pids.join(",")));
        }
        "pause-a" => pause_a(&mut s),
        "pause-b" => pause_b(&mut s),
        m => panic!("unknown mode {m}"),
    }
}
