//! The fault suite's worker client (tests/cluster/src/bin/lockext-fault-client.rs, mode
//! `worker`), for a connection through PgBouncer in transaction pooling mode.
//!
//! The calls, their order, the randomness, the two write paths (`fenced_update`, and
//! `lockext.fence` before writes to the caller's own table) and the history it records (one
//! `history::Op` line per call) are the fault client's: both are
//! `lockext_cluster_tests::client`. One thing differs, and it is the
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

use lockext_cluster_tests::client::{self, pause_a, pause_b, say, worker, Sending, Session};

fn main() {
    let cfg = client::config(Some("worker"));
    let mut rng = client::rng(&cfg);
    let mode = cfg.mode.clone();
    let mut s = Session::new(cfg, Sending::Typed);
    match mode.as_str() {
        "worker" => {
            worker(&mut s, &mut rng);
            let pids: Vec<String> = s.backends.iter().map(|p| p.to_string()).collect();
            say(&format!("backends {} {}", pids.len(), pids.join(",")));
        }
        // A write that failed (its connection died with the old primary) is tried once more.
        "pause-a" => pause_a(&mut s, true),
        "pause-b" => pause_b(&mut s),
        m => panic!("unknown mode {m}"),
    }
}
