//! etcdbench: the etcd side of bench/, shaped like pgbench and bench/redisbench.c so that
//! the three compare.
//!
//! N clients, each on a gRPC connection of its own (as each pgbench client has its own
//! backend), run on a runtime of J threads. A client runs one transaction after another
//! until the time (-T) or the count (-t) is used up. A transaction is etcd's lock recipe:
//!
//!   cycle      grant a lease (the TTL a lockext acquire gives), put lock:<random id> with
//!              that lease if the key does not exist (a transaction comparing its
//!              create_revision with 0); when granted, delete the key if it is still ours
//!              (a transaction comparing its lease), then revoke the lease
//!   contended  the same on the one key "hot"
//!
//! With `-m session` a client grants one lease at its start and puts every key with it,
//! the way etcd's `concurrency.Session` does; the cycle is then the put and the delete.
//!
//! Every step is a write through etcd's Raft log, acknowledged once it is on disk (etcd
//! syncs its WAL before it answers; one sync serves every write of a batch), the same
//! promise a lockext grant committed durably makes. The grant's fencing token is the
//! key's create revision, which only grows.
//!
//! Prints one JSON object with redisbench's fields: counts, throughput, latency
//! percentiles of whole transactions, and per-client successes (for Jain's index). Any
//! error or unexpected answer is counted and makes the exit status 1.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};

#[derive(Clone, Copy, PartialEq)]
enum Workload {
    Cycle,
    Contended,
}

#[derive(Clone, Copy, PartialEq)]
enum LeaseMode {
    PerCycle,
    Session,
}

struct Options {
    workload: Workload,
    mode: LeaseMode,
    clients: usize,
    threads: usize,
    port: u16,
    keys: u64,
    ttl_secs: i64,
    seconds: f64,
    max_tx: u64,
    latency_file: Option<String>,
}

#[derive(Default)]
struct ClientResult {
    done: u64,
    ok: u64,
    errors: u64,
    /// Microseconds of every transaction, in order.
    lat: Vec<f32>,
    first_error: Option<String>,
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: etcdbench -w cycle|contended [-m per-cycle|session] [-c clients] [-j threads] \
         [-p port] [-k keys] [-x ttl_seconds] (-T seconds | -t transactions) [-l latency_file]"
    );
    ExitCode::from(2)
}

fn parse() -> Option<Options> {
    let mut o = Options {
        workload: Workload::Cycle,
        mode: LeaseMode::PerCycle,
        clients: 1,
        threads: 1,
        port: 2379,
        keys: 100_000,
        ttl_secs: 30,
        seconds: 5.0,
        max_tx: 0,
        latency_file: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1)?;
        match args[i].as_str() {
            "-w" => {
                o.workload = match value.as_str() {
                    "cycle" => Workload::Cycle,
                    "contended" => Workload::Contended,
                    _ => return None,
                }
            }
            "-m" => {
                o.mode = match value.as_str() {
                    "per-cycle" => LeaseMode::PerCycle,
                    "session" => LeaseMode::Session,
                    _ => return None,
                }
            }
            "-c" => o.clients = value.parse().ok()?,
            "-j" => o.threads = value.parse().ok()?,
            "-p" => o.port = value.parse().ok()?,
            "-k" => o.keys = value.parse().ok()?,
            "-x" => o.ttl_secs = value.parse().ok()?,
            "-T" => o.seconds = value.parse().ok()?,
            "-t" => o.max_tx = value.parse().ok()?,
            "-l" => o.latency_file = Some(value.clone()),
            _ => return None,
        }
        i += 2;
    }
    (o.clients > 0 && o.threads > 0 && o.keys > 0 && o.ttl_secs > 0).then_some(o)
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// One lock cycle. Ok(true): granted and released; Ok(false): the key was held.
async fn cycle(
    client: &mut Client,
    key: &str,
    value: &str,
    session_lease: Option<i64>,
    ttl_secs: i64,
) -> Result<bool, String> {
    let lease = match session_lease {
        Some(id) => id,
        None => client
            .lease_grant(ttl_secs, None)
            .await
            .map_err(|e| format!("lease grant: {e}"))?
            .id(),
    };
    let put = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(lease)),
        )]);
    let granted = client
        .txn(put)
        .await
        .map_err(|e| format!("put if absent: {e}"))?
        .succeeded();
    if granted {
        let release = Txn::new()
            .when([Compare::lease(key, CompareOp::Equal, lease)])
            .and_then([TxnOp::delete(key, None)]);
        if !client
            .txn(release)
            .await
            .map_err(|e| format!("delete: {e}"))?
            .succeeded()
        {
            return Err(format!("{key}: released by someone else before its owner"));
        }
    }
    if session_lease.is_none() {
        client
            .lease_revoke(lease)
            .await
            .map_err(|e| format!("lease revoke: {e}"))?;
    }
    Ok(granted)
}

async fn run_client(id: usize, o: Arc<Options>, start: Instant) -> ClientResult {
    let mut r = ClientResult::default();
    let endpoint = format!("http://127.0.0.1:{}", o.port);
    let mut client = match Client::connect([endpoint], None).await {
        Ok(c) => c,
        Err(e) => {
            r.errors += 1;
            r.first_error = Some(format!("client {id}: connect: {e}"));
            return r;
        }
    };
    let session_lease = match o.mode {
        LeaseMode::PerCycle => None,
        // Long enough to outlive the run: a session's keep-alive is not what is measured.
        LeaseMode::Session => match client.lease_grant(o.ttl_secs.max(3600), None).await {
            Ok(l) => Some(l.id()),
            Err(e) => {
                r.errors += 1;
                r.first_error = Some(format!("client {id}: session lease: {e}"));
                return r;
            }
        },
    };
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ ((id as u64 + 1) * 0x2545_F491_4F6C_DD1D);
    let deadline = start + Duration::from_secs_f64(o.seconds);
    let mut seq = 0u64;
    loop {
        if o.max_tx > 0 && r.done >= o.max_tx || o.max_tx == 0 && Instant::now() >= deadline {
            break;
        }
        let key = match o.workload {
            Workload::Cycle => format!("lock:{}", xorshift(&mut rng) % o.keys + 1),
            Workload::Contended => "hot".to_string(),
        };
        seq += 1;
        let value = format!("bench:{id}:{seq}");
        let t0 = Instant::now();
        match cycle(&mut client, &key, &value, session_lease, o.ttl_secs).await {
            Ok(granted) => {
                r.done += 1;
                r.ok += u64::from(granted);
                r.lat.push(t0.elapsed().as_secs_f32() * 1e6);
            }
            Err(e) => {
                r.errors += 1;
                if r.first_error.is_none() {
                    r.first_error = Some(format!("client {id}: {e}"));
                }
                break;
            }
        }
    }
    if let Some(lease) = session_lease {
        let _ = client.lease_revoke(lease).await;
    }
    r
}

fn percentile(sorted: &[f32], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    f64::from(sorted[(q * (sorted.len() - 1) as f64) as usize])
}

fn main() -> ExitCode {
    let Some(o) = parse() else { return usage() };
    let o = Arc::new(o);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(o.threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("etcdbench: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let start = Instant::now();
    let results: Vec<ClientResult> = runtime.block_on(async {
        let tasks: Vec<_> = (0..o.clients)
            .map(|id| tokio::spawn(run_client(id, o.clone(), start)))
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await.unwrap_or_else(|e| ClientResult {
                errors: 1,
                first_error: Some(format!("client task: {e}")),
                ..ClientResult::default()
            }));
        }
        out
    });
    let elapsed = start.elapsed().as_secs_f64();

    let mut lat: Vec<f32> = results.iter().flat_map(|r| r.lat.iter().copied()).collect();
    if let Some(path) = &o.latency_file {
        let written = std::fs::File::create(path).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            for x in &lat {
                writeln!(w, "{x:.1}")?;
            }
            w.flush()
        });
        if let Err(e) = written {
            eprintln!("etcdbench: {path}: {e}");
            return ExitCode::FAILURE;
        }
    }
    lat.sort_by(f32::total_cmp);
    let done: u64 = results.iter().map(|r| r.done).sum();
    let ok: u64 = results.iter().map(|r| r.ok).sum();
    let errors: u64 = results.iter().map(|r| r.errors).sum();
    let mean = lat.iter().map(|&x| f64::from(x)).sum::<f64>() / lat.len().max(1) as f64;
    let per_client: Vec<String> = results.iter().map(|r| r.ok.to_string()).collect();
    println!(
        "{{\"transactions\": {done}, \"ok\": {ok}, \"errors\": {errors}, \"seconds\": {elapsed:.6}, \
         \"tps\": {:.3}, \"ok_per_s\": {:.3}, \"mean_ms\": {:.4}, \"p50_ms\": {:.4}, \"p99_ms\": {:.4}, \
         \"per_client_ok\": [{}]}}",
        done as f64 / elapsed,
        ok as f64 / elapsed,
        mean / 1000.0,
        percentile(&lat, 0.5) / 1000.0,
        percentile(&lat, 0.99) / 1000.0,
        per_client.join(", ")
    );
    for r in &results {
        if let Some(e) = &r.first_error {
            eprintln!("{e}");
        }
    }
    if errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
