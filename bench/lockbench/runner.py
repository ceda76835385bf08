"""Driving the measured clients and turning their output into result rows: pgbench
(-M prepared, per-transaction logs, statement latencies), bench/redisbench.c,
bench/etcdbench (both print the same JSON), the WAL and
hand-off counters around each run, and the rounds of one point, with the order of the
systems reversed every other round so that drift in the machine hits them all alike.

What each workload runs comes from workloads.py; the rows made here are what report.py
and charts.py read, and what the JSON holds.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import time

from .cluster import Cluster, psql
from .config import (DRIVER, ETCD_DRIVER, ETCD_PORT, ETCD_SOURCE, ETCD_TARGET, HERE, PG_PORT, PGBENCH,
                     REDIS_PORT, SCRIPTS, TMP)
from .shell import BenchError, log, run
from .systems import SYSTEMS, script_variables
from .workloads import COUNTED, WORKLOADS


def build_driver():
    os.makedirs(TMP, exist_ok=True)
    src = os.path.join(HERE, "redisbench.c")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise BenchError("no C compiler (cc, gcc or clang) to build bench/redisbench.c")
    run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", DRIVER, src])


def build_etcd_driver():
    """bench/etcdbench with cargo (its Cargo.lock pins every crate; protoc compiles etcd's
    .proto files): about 2 minutes the first time, nothing after."""
    if not shutil.which("cargo") or not shutil.which("protoc"):
        raise BenchError("etcdbench needs cargo and protoc (run scripts/bootstrap.sh)")
    log("building bench/etcdbench (cargo, once)")
    run(["cargo", "build", "--release", "--locked", "--quiet", "--manifest-path",
         os.path.join(ETCD_SOURCE, "Cargo.toml"), "--target-dir", ETCD_TARGET])


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    return sorted_values[int(q * (len(sorted_values) - 1))]


def jain(counts):
    total = sum(counts)
    squares = sum(c * c for c in counts)
    return total * total / (len(counts) * squares) if squares else float("nan")


def wal_stats():
    # Stats reach pg_stat_wal when a backend ends: wait until pgbench's have gone.
    for _ in range(100):
        if psql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND pid <> pg_backend_pid()") == "0":
            break
        time.sleep(0.05)
    time.sleep(0.05)
    row = psql("SELECT wal_records, wal_bytes, wal_sync, wal_sync_time FROM pg_stat_wal")
    rec, byt, syn, syn_ms = row.split("|")
    return int(rec), int(byt), int(syn), float(syn_ms)


def reset_counters(n):
    psql("DO $$ BEGIN FOR i IN 0..%d LOOP "
         "EXECUTE format('ALTER SEQUENCE bench.handoffs_%%s RESTART', i); END LOOP; END $$" % (n - 1))


def read_counters(n):
    sql = " UNION ALL ".join(
        f"SELECT {i}, CASE WHEN is_called THEN last_value ELSE 0 END FROM bench.handoffs_{i}"
        for i in range(n))
    rows = [r.split("|") for r in psql(sql + " ORDER BY 1").splitlines()]
    return [int(v) for _, v in rows]


class Runner:
    def __init__(self, cfg, redis_server):
        self.cfg = cfg
        self.redis = redis_server
        self.vars = {"keys": cfg.keys, "ttl": 30000, "base": 0, "tok": 1}
        self.results = []

    def check_alive(self):
        try:
            psql("SELECT 1")
        except BenchError as e:
            raise BenchError("the scratch cluster is down: see " + Cluster.log + "\n" + str(e))

    def pgbench(self, script, clients, options="", seconds=None, transactions=None, tag="run",
                variables=None, db="postgres"):
        """Runs pgbench; returns tps, transactions, latencies (us, with end times), statements."""
        logdir = os.path.join(TMP, "logs")
        os.makedirs(logdir, exist_ok=True)
        for f in glob.glob(os.path.join(logdir, tag + ".*")):
            os.remove(f)
        prefix = os.path.join(logdir, tag)
        cmd = [PGBENCH, "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", "postgres", "-n",
               "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)), "-r",
               "-l", "--log-prefix", prefix, "-f", os.path.join(SCRIPTS, script + ".sql")]
        cmd += ["-T", str(seconds)] if transactions is None else ["-t", str(transactions)]
        for k, v in dict(self.vars, **(variables or {})).items():
            cmd += ["-D", f"{k}={v}"]
        cmd.append(db)
        env = dict(os.environ, PGOPTIONS=options)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=(seconds or 60) + 120)
        out = p.stdout + p.stderr
        if p.returncode != 0 or "aborted" in out:
            raise BenchError(f"pgbench {script} ({clients} clients) failed:\n{out[-3000:]}")
        m = re.search(r"number of failed transactions: (\d+)", out)
        if m and int(m.group(1)):
            raise BenchError(f"pgbench {script}: {m.group(1)} failed transactions\n{out[-2000:]}")
        tps = float(re.search(r"tps = ([\d.]+) \(without initial connection time\)", out).group(1))
        n = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
        statements = []
        in_stmts = False
        for line in out.splitlines():
            if line.startswith("statement latencies"):
                in_stmts = True
                continue
            if in_stmts:
                sm = re.match(r"\s+([\d.]+)\s+\d+\s+(.*)$", line)
                if sm and not sm.group(2).startswith("\\"):
                    statements.append((float(sm.group(1)), " ".join(sm.group(2).split())))
        lat = []
        for f in glob.glob(prefix + ".*"):
            with open(f) as fh:
                for line in fh:
                    parts = line.split()
                    lat.append((int(parts[2]), int(parts[4]) + int(parts[5]) / 1e6))
            os.remove(f)
        if n == 0 or not lat:
            raise BenchError(f"pgbench {script}: no transaction ran\n{out[-2000:]}")
        return {"tps": tps, "n": n, "lat": lat, "statements": statements, "output": out}

    def redis_bench(self, mode, fsync, clients, keys):
        self.redis.fsync_mode(fsync)
        args = ["-w", mode, "-p", str(REDIS_PORT)]
        if mode == "renew":
            args += ["-x", "3600000"]
        return self.driver(DRIVER, "redisbench", args, f"{mode} ({clients} clients)", clients, keys)

    def etcd_bench(self, mode, lease, clients, keys):
        args = ["-w", mode, "-m", lease, "-p", str(ETCD_PORT), "-x", "30"]
        return self.driver(ETCD_DRIVER, "etcdbench", args, f"{mode} {lease} ({clients} clients)",
                           clients, keys)

    def driver(self, path, name, args, what, clients, keys):
        """One run of redisbench or etcdbench (the same options and JSON): its counts, and
        every transaction's latency (us) from its latency file."""
        cmd = [path, *args, "-c", str(clients), "-j", str(min(clients, 2)), "-k", str(keys)]
        cmd += ["-T", str(self.cfg.round_seconds)] if self.cfg.transactions is None else \
            ["-t", str(self.cfg.transactions)]
        latfile = os.path.join(TMP, name + "-latencies")
        cmd += ["-l", latfile]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=self.cfg.round_seconds + 120)
        if p.returncode != 0:
            raise BenchError(f"{name} {what} failed:\n{p.stdout}\n{p.stderr}")
        r = json.loads(p.stdout)
        with open(latfile) as f:
            r["lat"] = [float(x) for x in f]
        os.remove(latfile)
        return r

    def run_once(self, workload, target, options, clients, keys, db="postgres", system=None):
        """One run of one system: raw counts, latencies (us), WAL deltas."""
        seconds = None if self.cfg.transactions else self.cfg.round_seconds
        if isinstance(target, tuple):
            bench = self.redis_bench if target[0] == "redis" else self.etcd_bench
            r = bench(target[1], target[2], clients, keys)
            ops = r["ok"] if workload in COUNTED else r["transactions"]
            return {"n": r["transactions"], "elapsed": r["seconds"], "ops": ops, "lat": r["lat"],
                    "counts": r["per_client_ok"], "wal": None, "statements": []}
        if workload in COUNTED:
            reset_counters(clients)
        w0 = wal_stats()
        r = self.pgbench(target, clients, options, seconds=seconds,
                         transactions=self.cfg.transactions, variables=script_variables(system, keys),
                         db=db)
        w1 = wal_stats()
        self.check_alive()
        counts = read_counters(clients) if workload in COUNTED else None
        return {"n": r["n"], "elapsed": r["n"] / r["tps"], "ops": sum(counts) if counts else r["n"],
                "lat": [x for x, _ in r["lat"]], "counts": counts,
                "wal": [b - a for a, b in zip(w0, w1)], "statements": r["statements"]}

    def combine(self, workload, system, clients, runs, extra=None):
        """A result row from the rounds of one system at one point."""
        label, _, commit = SYSTEMS[system]
        row = {"workload": workload, "system": system, "label": label, "clients": clients,
               "commit": commit, "rounds": len(runs)}
        if extra:
            row.update(extra)
        n = sum(r["n"] for r in runs)
        ops = sum(r["ops"] for r in runs)
        elapsed = sum(r["elapsed"] for r in runs)
        if ops == 0:
            raise BenchError(f"{workload} {system} ({clients} clients): no successful operation")
        lat = sorted(x for r in runs for x in r["lat"])
        row.update(tps=ops / elapsed, attempts=n / elapsed, n=n, ops=ops,
                   p50=percentile(lat, 0.5) / 1000, p99=percentile(lat, 0.99) / 1000,
                   mean=sum(lat) / len(lat) / 1000)
        if runs[0]["counts"] is not None:
            counts = [sum(c) for c in zip(*(r["counts"] for r in runs))]
            row["jain"] = jain(counts)
            row["per_client"] = counts
        if runs[0]["wal"] is not None:
            rec, byt, syn, syn_ms = (sum(r["wal"][i] for r in runs) for i in range(4))
            row.update(fsyncs=syn / ops, wal_bytes=byt / ops, wal_records=rec / ops,
                       fsync_us=syn_ms * 1000 / syn if syn else float("nan"))
            # statement latencies: weighted by each round's transactions
            stm = {}
            for r in runs:
                for ms, text in r["statements"]:
                    stm.setdefault(text, []).append((ms, r["n"]))
            row["statements"] = [(sum(ms * w for ms, w in v) / sum(w for _, w in v), text)
                                 for text, v in stm.items()]
        return row

    def point(self, workload, entries, clients, keys, extra=None):
        """All systems at one client count: rounds, each system once per round, the order
        reversed every other round, so that drift in the machine hits all alike."""
        runs = {system: [] for system, _, _ in entries}
        for rnd in range(self.cfg.rounds):
            order = entries if rnd % 2 == 0 else list(reversed(entries))
            for system, target, options in order:
                runs[system].append(self.run_once(workload, target, options, clients, keys,
                                                  system=system))
        rows = []
        for system, _, _ in entries:
            row = self.combine(workload, system, clients, runs[system], extra)
            self.results.append(row)
            rows.append(row)
            where = f"{extra['leases']:8} leases " if extra and "leases" in extra else ""
            log(f"  {workload:9} {where}{clients:3} clients  {row['label']:40} "
                f"{row['tps']:10.1f}/s  p50 {row['p50']:.3f} ms  p99 {row['p99']:.3f} ms")
        return rows

    def workload(self, name, keys, setup=None):
        entries = WORKLOADS[name]
        log(f"workload {name}")
        if setup:
            setup()
        psql("CHECKPOINT")
        if self.cfg.warmup:
            for system, target, options in entries:
                if not isinstance(target, tuple):
                    self.pgbench(target, min(16, max(self.cfg.clients)), options, seconds=1,
                                 tag="warmup", variables=script_variables(system, keys))
        for clients in self.cfg.clients:
            psql("VACUUM")
            self.point(name, entries, clients, keys)
            self.after_clients(name)

    def after_clients(self, name):
        """Sanity checks that the scripts did what they claim."""
        if name in ("cycle", "shared", "semaphore"):
            left = psql("SELECT (SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'lock:%'), "
                        "(SELECT count(*) FROM article.distributed_locks WHERE lock_id LIKE 'lock:%'), "
                        "(SELECT count(*) FROM floor.leases WHERE lock_id LIKE 'lock:%')")
            if left != "0|0|0":
                raise BenchError(f"cycle left leases behind (lockext|article|floor): {left}")
        if name == "heartbeat":
            # a renewal that matched nothing would return NULL and still count as a transaction
            moved = psql("SELECT (SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'hb:%' "
                         "AND expires_at > acquired_at + interval '1 hour'), "
                         "(SELECT count(*) FROM article.distributed_locks WHERE lock_id LIKE 'hb:%' "
                         "AND expires_at > (SELECT min(expires_at) FROM article.distributed_locks))")
            if "0" in moved.split("|"):
                raise BenchError(f"heartbeat renewed nothing (lockext|article): {moved}")
        if name == "fenced":
            written = psql("SELECT (SELECT count(*) FROM lockext.resources WHERE data = '{\"n\": 1}'), "
                           "(SELECT count(*) FROM article.protected_resources WHERE data = '{\"n\": 1}')")
            if "0" in written.split("|"):
                raise BenchError(f"fenced writes wrote nothing (lockext|article): {written}")
            guarded = psql("SELECT (SELECT count(*) FROM guarded.rows WHERE n > 0), "
                           "(SELECT count(*) FROM guarded.plain WHERE n > 0)")
            if "0" in guarded.split("|"):
                raise BenchError(f"guarded writes wrote nothing (guarded|unguarded): {guarded}")
        if name in ("shared", "semaphore"):
            left = psql("SELECT (SELECT count(*) FROM lockext.holders WHERE lock_id IN "
                        "('shared-hot', 'sem:4', 'sem:16', 'hot')), "
                        "(SELECT count(*) FROM floor.shared_leases)")
            if left != "0|0":
                raise BenchError(f"{name} left holders behind (lockext|floor): {left}")
