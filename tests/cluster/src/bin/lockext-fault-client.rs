//! A lock-service client, one OS process, for the fault tests (tests/faults.rs): it can be
//! paused with SIGSTOP, and its server killed under it. Every call it makes is appended
//! to its history file as one line (`history::Op::to_line`), written with one write(2)
//! each, so a line is complete even if the process is killed. Its calls and its modes
//! but `holder` are `lockext_cluster_tests::client`'s, shared with the deployment tests'
//! pooled client; it lets rust-postgres prepare its statements (`Sending::Prepared`).
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

use std::thread::sleep;
use std::time::Duration;

use lockext_cluster_tests::client::{self, pause_a, pause_b, say, worker, Sending, Session};

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

fn main() {
    let cfg = client::config(None);
    let mut rng = client::rng(&cfg);
    let mode = cfg.mode.clone();
    let mut s = Session::new(cfg, Sending::Prepared);
    match mode.as_str() {
        "worker" => worker(&mut s, &mut rng),
        "holder" => holder(&mut s),
        "pause-a" => pause_a(&mut s, false),
        "pause-b" => pause_b(&mut s),
        m => panic!("unknown mode {m}"),
    }
}
