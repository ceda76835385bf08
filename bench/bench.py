#!/usr/bin/env python3
"""lockext benchmarks, side by side in one run (issue 6). Started by bench/run.sh.

Every PostgreSQL system runs under the real pgbench (-M prepared), Redis under
bench/redisbench.c (same shape: N connections on J threads). All systems of a workload run
back to back at each client count, for the same duration, against one scratch cluster and
one Redis; everything is reported as ratios within this run. Standard library only.
"""
import argparse
import datetime
import glob
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SYSTEM_PG_BIN = "/usr/lib/postgresql/15/bin"
PG_PORT = int(os.environ.get("BENCH_PG_PORT", "5599"))
PG_HOME = os.environ.get("BENCH_HOME", "/tmp/lockext-bench")
# The installed PostgreSQL (with lockext), copied at the start of a run: see Cluster.
SNAPSHOT = os.path.join(PG_HOME, "pg")
PG_BIN = SNAPSHOT + SYSTEM_PG_BIN
PGBENCH = os.path.join(PG_BIN, "pgbench")
PSQL = os.path.join(PG_BIN, "psql")
REDIS_PORT = int(os.environ.get("BENCH_REDIS_PORT", "6399"))
REDIS_DIR = os.path.join(PG_HOME, "redis")
TMP = os.path.join(HERE, "tmp")
SCRIPTS = os.path.join(HERE, "pgbench")
DRIVER = os.path.join(TMP, "redisbench")

ARTICLE = "-c search_path=article"
EPOCH = "-c lockext.durability=epoch -c synchronous_commit=off"

# Settings of the scratch cluster (ALTER SYSTEM, then a restart). No checkpoint or WAL
# recycling inside a run; everything else is PostgreSQL's default (fsync, fdatasync,
# synchronous_commit = on, full_page_writes, autovacuum).
PG_SETTINGS = {
    "shared_buffers": "512MB",
    "max_wal_size": "16GB",
    "min_wal_size": "1GB",
    "checkpoint_timeout": "1h",
    "track_wal_io_timing": "on",
    "max_connections": "200",
}

# System: label, colour, how it commits (the heartbeat floor is the bare UPDATE committed
# the same way).
SYSTEMS = {
    "lockext": ("lockext", "#1f6feb", "sync"),
    "lockext_async": ("lockext, client sets async release/renew", "#58a6ff", "async"),
    "lockext_epoch": ("lockext, epoch mode", "#0a3069", "async"),
    "lockext_wait": ("lockext, waiting in its FIFO queue", "#2da44e", "sync"),
    "article": ("article's design", "#cf222e", "sync"),
    "advisory": ("advisory locks", "#8250df", "none"),
    "floor": ("floor (durable insert, async delete)", "#57606a", "sync"),
    "floor_async": ("insert + delete both async", "#afb8c1", "async"),
    "bare": ("bare UPDATE", "#57606a", "sync"),
    "bare_async": ("bare UPDATE, async", "#afb8c1", "async"),
    "bare_indexed": ("bare UPDATE, expires_at indexed", "#6e7781", "sync"),
    "bare_indexed_async": ("bare UPDATE, expires_at indexed, async", "#d0d7de", "async"),
    "redis_always": ("Redis, appendfsync always", "#bf8700", "sync"),
    "redis_everysec": ("Redis, appendfsync everysec", "#f2cc60", "async"),
    "lockext_shared": ("lockext, shared, one id", "#1f6feb", "sync"),
    "lockext_shared_epoch": ("lockext, shared, one id, epoch mode", "#0a3069", "async"),
    "lockext_exclusive": ("lockext, exclusive, random ids", "#1b7c83", "sync"),
    "advisory_shared": ("advisory locks, shared, one key", "#8250df", "none"),
    "floor_shared": ("floor of a read lock", "#57606a", "sync"),
    "floor_shared_async": ("floor of a read lock, both async", "#afb8c1", "async"),
    "lockext_sem4": ("lockext, 4 permits, waiting", "#1f6feb", "sync"),
    "lockext_sem16": ("lockext, 16 permits, waiting", "#58a6ff", "sync"),
}
# pgbench variables (-D) of the systems that share one script.
SYSTEM_VARIABLES = {"lockext_sem4": {"permits": 4}, "lockext_sem16": {"permits": 16}}

SYSTEM_NOTES = [
    ("lockext", "`lockext.lock_acquire` then `lockext.lock_release` with the token, one round trip "
                "each, default settings (`lockext.durability = grant`, `synchronous_commit = on`): "
                "the grant commits durably; whether the release (and a renewal) waits for its flush "
                "is lockext's choice, and the fsyncs column shows it."),
    ("lockext_async", "the same, but the client makes the release (heartbeat: the renewal) commit "
                      "asynchronously: one statement `SELECT set_config('synchronous_commit', 'off', "
                      "true), lockext.lock_release(...)`; the grant stays durable. Where lockext "
                      "already commits releases asynchronously, this equals the row above."),
    ("lockext_epoch", "`lockext.durability = epoch` and `synchronous_commit = off` for the session: "
                      "grants, releases and fenced writes all commit asynchronously; tokens stay safe "
                      "through boot epochs."),
    ("lockext_wait", "contended and semaphore workloads: each attempt calls `lock_acquire(..., wait "
                     "=> '10 seconds')` on the one exclusive lock and waits in lockext's FIFO queue "
                     "(woken by the release) instead of retrying; its latency is the hand-off "
                     "latency, from joining the queue to holding the lock."),
    ("article", "the article's code as SQL, statement for statement, in schema `article` with its "
                "own table, index and sequence: acquire = `BEGIN; DELETE expired; INSERT ... ON "
                "CONFLICT DO NOTHING RETURNING; COMMIT` (four round trips), release = `DELETE` by "
                "owner, renew = its `UPDATE`, fenced write = its `UPDATE ... WHERE token` (with `>=`)."),
    ("advisory", "`pg_try_advisory_lock(id)` / `pg_advisory_unlock(id)`: in memory, no lease, no "
                 "token, nothing durable: the ceiling."),
    ("floor", "one single-row `INSERT` into a two-column table (text primary key), committed "
              "durably, and a `DELETE` committed with `set_config('synchronous_commit', 'off', true)`: "
              "one fsync per cycle, what any durable grant pays."),
    ("floor_async", "the same `INSERT` and `DELETE`, both committed asynchronously: what a grant "
                    "costs when nothing waits for the disk (the yardstick of epoch mode)."),
    ("bare", "`UPDATE` of one row by primary key, `expires_at` not indexed (HOT), durable."),
    ("bare_async", "the same `UPDATE` committed asynchronously."),
    ("bare_indexed", "the same `UPDATE` on a table whose `expires_at` is indexed, as in "
                     "`lockext.locks` (no HOT update: every renewal inserts into both indexes)."),
    ("bare_indexed_async", "the indexed `UPDATE`, committed asynchronously."),
    ("redis_always", "`SET key value NX PX ttl`, release by the article's Lua compare-and-delete "
                     "(`EVAL`); renew = Lua compare-and-`PEXPIRE`; fenced write = Lua "
                     "compare-and-set on a hash; AOF with `appendfsync always` (durable)."),
    ("redis_everysec", "the same with `appendfsync everysec` (up to a second of writes lost in a crash)."),
    ("lockext_shared", "`lockext.lock_acquire('shared-hot', ..., mode => 'shared')` then "
                       "`lockext.lock_release` with the token, every client on the one id (each "
                       "reader a lease and a token of its own), default settings. No one takes the "
                       "id exclusively: a refused grant stops the run."),
    ("lockext_shared_epoch", "the same in epoch mode (`lockext.durability = epoch`, "
                             "`synchronous_commit = off`)."),
    ("lockext_exclusive", "the cycle's `lockext` (`bench/pgbench/cycle_lockext.sql`): an exclusive "
                          "acquire and release of a random one of 100 000 ids, so that no one "
                          "contends or waits (in the semaphore workload with the grant counter "
                          "pipelined with the release)."),
    ("advisory_shared", "`pg_try_advisory_lock_shared(1)` / `pg_advisory_unlock_shared(1)`: "
                        "PostgreSQL's own read lock, in memory, no lease, no token: the ceiling."),
    ("floor_shared", "a single-row `INSERT` of (id, owner) into a table keyed by both, as "
                     "`lockext.shared_leases` is, committed durably, and its `DELETE` committed "
                     "asynchronously: what any durable read grant pays (it does not even look for "
                     "a writer)."),
    ("floor_shared_async", "the same `INSERT` and `DELETE`, both committed asynchronously (the "
                           "yardstick of epoch mode)."),
    ("lockext_sem4", "`lockext.lock_acquire('sem:4', ..., wait => '5 seconds', permits => 4)`, then "
                     "the release with the token and the client's grant counter in one pipeline: "
                     "each attempt waits in lockext's queue for one of 4 permits."),
    ("lockext_sem16", "the same on a semaphore of 16 permits (`sem:16`): with 16 clients or fewer, "
                      "a permit is always free, so that none should wait."),
]

# workload -> [(system, pgbench script or ("redis", mode), PGOPTIONS)]
def redis(mode, fsync):
    return ("redis", mode, fsync)


WORKLOADS = {
    "cycle": [
        ("lockext", "cycle_lockext", ""),
        ("lockext_async", "cycle_lockext_async", ""),
        ("lockext_epoch", "cycle_lockext", EPOCH),
        ("article", "cycle_article", ARTICLE),
        ("advisory", "cycle_advisory", ""),
        ("floor", "cycle_floor", ""),
        ("floor_async", "cycle_floor_async", ""),
        ("redis_always", redis("cycle", "always"), ""),
        ("redis_everysec", redis("cycle", "everysec"), ""),
    ],
    "contended": [
        ("lockext", "contended_lockext", ""),
        ("lockext_async", "contended_lockext_async", ""),
        ("lockext_epoch", "contended_lockext", EPOCH),
        ("lockext_wait", "contended_lockext_wait", ""),
        ("article", "contended_article", ARTICLE),
        ("advisory", "contended_advisory", ""),
        ("floor", "contended_floor", ""),
        ("floor_async", "contended_floor_async", ""),
        ("redis_always", redis("contended", "always"), ""),
        ("redis_everysec", redis("contended", "everysec"), ""),
    ],
    "heartbeat": [
        ("lockext", "renew_lockext", ""),
        ("lockext_async", "renew_lockext_async", ""),
        ("article", "renew_article", ARTICLE),
        ("bare", "renew_bare", ""),
        ("bare_async", "renew_bare_async", ""),
        ("bare_indexed", "renew_bare_indexed", ""),
        ("bare_indexed_async", "renew_bare_indexed_async", ""),
        ("redis_always", redis("renew", "always"), ""),
        ("redis_everysec", redis("renew", "everysec"), ""),
    ],
    "fenced": [
        ("lockext", "fenced_lockext", ""),
        ("lockext_epoch", "fenced_lockext", EPOCH),
        ("article", "fenced_article", ARTICLE),
        ("redis_always", redis("fenced", "always"), ""),
        ("redis_everysec", redis("fenced", "everysec"), ""),
    ],
    "shared": [
        ("lockext_shared", "shared_lockext", ""),
        ("lockext_shared_epoch", "shared_lockext", EPOCH),
        ("lockext_exclusive", "cycle_lockext", ""),
        ("advisory_shared", "shared_advisory", ""),
        ("floor_shared", "shared_floor", ""),
        ("floor_shared_async", "shared_floor_async", ""),
    ],
    "semaphore": [
        ("lockext_sem4", "semaphore_lockext", ""),
        ("lockext_sem16", "semaphore_lockext", ""),
        ("lockext_wait", "contended_lockext_wait", ""),
        ("lockext_exclusive", "semaphore_exclusive", ""),
    ],
}
# The references of each workload's ratios: (the article's design, the floor), unless
# REFERENCE_HEADS names others. Charts show the last one.
REFERENCES = {
    "cycle": ("article", "floor"),
    "contended": ("article", "floor"),
    "heartbeat": ("article", "bare"),  # async rows: against bare_async
    "fenced": ("article", "article"),  # the article's UPDATE is the bare fenced write
    "shared": ("lockext_exclusive", "floor_shared"),
    "semaphore": ("lockext_exclusive", "lockext_wait"),  # no one waits; all on one lock, waiting
}
REFERENCE_HEADS = {"shared": ("× exclusive", "× floor"), "semaphore": ("× random ids", "× one lock")}
# Workloads that count successful operations per client (bench.handoffs_<client>), not
# transactions: their reports add attempts/s and Jain's fairness index.
COUNTED = ("contended", "semaphore")
SCALE_SYSTEMS = [("lockext", ""), ("lockext_epoch", EPOCH)]
UNITS = {"cycle": "cycles/s", "contended": "hand-offs/s", "heartbeat": "renewals/s",
         "fenced": "writes/s", "shared": "cycles/s", "semaphore": "grants/s"}


class BenchError(Exception):
    pass




def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, env=None, check=True, timeout=900, **kw):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


class Cluster:
    """The scratch cluster, configured as scripts/cluster.sh configures its own (loopback,
    the postgres OS user, lockext preloaded and its reaper on database postgres), plus
    PG_SETTINGS, but run from a copy of the installed PostgreSQL and lockext taken when
    the benchmark starts.

    Why a copy: `make install` rewrites lockext.so in place, and a server that preloaded
    it then crashes (SIGSEGV/SIGILL in the postmaster); a library replaced between two
    backends would even mix two builds in one run. With the copy, installing while a
    benchmark runs changes nothing. The copy keeps Debian's layout below SNAPSHOT, so the
    copied server finds its $libdir and share directory (with lockext's control and SQL
    files) next to itself; `pg_config` in SQL shows those paths."""

    data = os.path.join(PG_HOME, "data")
    log = os.path.join(PG_HOME, "postgres.log")

    def pg_ctl(self, *args, check=True):
        return run(["runuser", "-u", "postgres", "--", os.path.join(PG_BIN, "pg_ctl"), "-D",
                    self.data, *args], check=check)

    def running(self):
        return os.path.exists(os.path.join(self.data, "PG_VERSION")) and \
            self.pg_ctl("status", check=False).returncode == 0

    def stop(self):
        if self.running():
            self.pg_ctl("-m", "fast", "-w", "-t", "60", "stop")

    def destroy(self):
        if os.path.isdir(PG_HOME):
            try:
                self.stop()
            except BenchError as e:
                log(str(e))
        shutil.rmtree(PG_HOME, ignore_errors=True)

    def create(self, allow_debug):
        """Returns whether lockext is a debug build (refused unless allow_debug)."""
        self.destroy()
        if port_open(PG_PORT):
            raise BenchError(f"port {PG_PORT} is taken by another server (BENCH_PG_PORT chooses another)")
        os.makedirs(PG_HOME)
        for src in (SYSTEM_PG_BIN, os.path.dirname(SYSTEM_PG_BIN) + "/lib", "/usr/share/postgresql/15"):
            dst = SNAPSHOT + src
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            run(["cp", "-a", src, dst])
        shutil.chown(PG_HOME, "postgres", "postgres")
        is_debug = check_library(os.path.join(PG_BIN, "..", "lib", "lockext.so"), allow_debug)
        run(["runuser", "-u", "postgres", "--", os.path.join(PG_BIN, "initdb"), "-D", self.data,
             "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"])
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"""
# lockext benchmark cluster: as scripts/cluster.sh, plus the benchmark's settings
listen_addresses = '127.0.0.1'
port = {PG_PORT}
unix_socket_directories = '{PG_HOME}'
shared_preload_libraries = 'lockext'
lockext.database = 'postgres'
lockext.reap_interval = '1s'
log_line_prefix = '%m [%p] %b '
""")
            for k, v in PG_SETTINGS.items():
                f.write(f"{k} = '{v}'\n")
        self.pg_ctl("-l", self.log, "-w", "-t", "60", "start")
        psql("CREATE EXTENSION lockext")
        where = psql("SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'")
        if not where.startswith(SNAPSHOT):
            raise BenchError(f"the copied server loads its libraries from {where}, not the copy")
        return is_debug


def psql(sql, options="", db="postgres"):
    env = dict(os.environ, PGOPTIONS=options) if options else None
    p = run([PSQL, "-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", "postgres",
             "-d", db, "-v", "ON_ERROR_STOP=1", "-c", sql], env=env)
    return p.stdout.strip()


def psql_file(path):
    run([PSQL, "-X", "-q", "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", "postgres", "-d", "postgres",
         "-v", "ON_ERROR_STOP=1", "-f", path])


# ---------------------------------------------------------------------------------------
# The installed extension: a benchmark of a debug build means nothing.

def check_library(path, allow_debug):
    if not os.path.exists(path):
        raise BenchError(f"{path} is missing: run make install first")
    sections = run(["readelf", "-S", "--wide", path]).stdout
    if ".debug_info" in sections and not allow_debug:
        raise BenchError(f"{path} is a debug build (it has .debug_info): `make bench` installs "
                         "the release build first; BENCH_ALLOW_DEBUG=1 runs anyway")
    return ".debug_info" in sections


# ---------------------------------------------------------------------------------------
# Redis

class Redis:
    def __init__(self):
        self.proc = None

    def start(self):
        shutil.rmtree(REDIS_DIR, ignore_errors=True)
        os.makedirs(REDIS_DIR)
        conf = os.path.join(REDIS_DIR, "redis.conf")
        with open(conf, "w") as f:
            f.write(f"""bind 127.0.0.1
port {REDIS_PORT}
protected-mode yes
dir {REDIS_DIR}
logfile {REDIS_DIR}/redis.log
daemonize no
save ""
appendonly yes
appendfsync always
auto-aof-rewrite-percentage 0
""")
        if port_open(REDIS_PORT):
            raise BenchError(f"port {REDIS_PORT} is taken (BENCH_REDIS_PORT chooses another)")
        self.proc = subprocess.Popen(["redis-server", conf], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        for _ in range(100):
            if port_open(REDIS_PORT):
                break
            time.sleep(0.05)
        else:
            raise BenchError("redis-server did not start: see " + REDIS_DIR + "/redis.log")
        self.version = self.cmd("INFO", "server").split("redis_version:")[1].split()[0]

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def pipeline(self, commands):
        """Sends RESP commands in one stream and returns the replies' first lines."""
        out = bytearray()
        for args in commands:
            out += b"*%d\r\n" % len(args)
            for a in args:
                a = str(a).encode()
                out += b"$%d\r\n%s\r\n" % (len(a), a)
        with socket.create_connection(("127.0.0.1", REDIS_PORT), timeout=60) as s:
            s.sendall(out)
            replies, buf = [], b""
            while len(replies) < len(commands):
                chunk = s.recv(1 << 16)
                if not chunk:
                    raise BenchError("redis closed the connection")
                buf += chunk
                while len(replies) < len(commands):
                    i = buf.find(b"\r\n")
                    if i < 0:
                        break
                    line = buf[:i].decode()
                    buf = buf[i + 2:]
                    if line.startswith("$") and line != "$-1":
                        n = int(line[1:])
                        while len(buf) < n + 2:
                            more = s.recv(1 << 16)
                            if not more:
                                raise BenchError("redis closed the connection")
                            buf += more
                        line = buf[:n].decode()
                        buf = buf[n + 2:]
                    replies.append(line)
        return replies

    def cmd(self, *args):
        reply = self.pipeline([args])[0]
        if reply.startswith("-"):
            raise BenchError(f"redis {args[0]}: {reply}")
        return reply

    def fsync_mode(self, mode):
        self.cmd("CONFIG", "SET", "appendfsync", mode)

    def fill(self, commands):
        for i in range(0, len(commands), 10000):
            replies = self.pipeline(commands[i:i + 10000])
            bad = [r for r in replies if r.startswith("-")]
            if bad:
                raise BenchError(f"redis fill: {bad[0]}")


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def build_driver():
    os.makedirs(TMP, exist_ok=True)
    src = os.path.join(HERE, "redisbench.c")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise BenchError("no C compiler (cc, gcc or clang) to build bench/redisbench.c")
    run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", DRIVER, src])


# ---------------------------------------------------------------------------------------
# Measuring

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


def script_variables(system, keys):
    """The pgbench variables of one system's script (besides Runner.vars)."""
    return dict({"keys": keys}, **SYSTEM_VARIABLES.get(system, {}))


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
        cmd = [DRIVER, "-w", mode, "-c", str(clients), "-j", str(min(clients, 2)), "-p",
               str(REDIS_PORT), "-k", str(keys)]
        if mode == "renew":
            cmd += ["-x", "3600000"]
        cmd += ["-T", str(self.cfg.round_seconds)] if self.cfg.transactions is None else \
            ["-t", str(self.cfg.transactions)]
        latfile = os.path.join(TMP, "redis-latencies")
        cmd += ["-l", latfile]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=self.cfg.round_seconds + 120)
        if p.returncode != 0:
            raise BenchError(f"redisbench {mode} ({clients} clients) failed:\n{p.stdout}\n{p.stderr}")
        r = json.loads(p.stdout)
        with open(latfile) as f:
            r["lat"] = [float(x) for x in f]
        os.remove(latfile)
        return r

    def run_once(self, workload, target, options, clients, keys, db="postgres", system=None):
        """One run of one system: raw counts, latencies (us), WAL deltas."""
        seconds = None if self.cfg.transactions else self.cfg.round_seconds
        if isinstance(target, tuple):
            r = self.redis_bench(target[1], target[2], clients, keys)
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
        if name in ("shared", "semaphore"):
            left = psql("SELECT (SELECT count(*) FROM lockext.holders WHERE lock_id IN "
                        "('shared-hot', 'sem:4', 'sem:16', 'hot')), "
                        "(SELECT count(*) FROM floor.shared_leases)")
            if left != "0|0":
                raise BenchError(f"{name} left holders behind (lockext|floor): {left}")


# ---------------------------------------------------------------------------------------
# Fills

def fill_lockext(prefix, first, last, expires_sql, db="postgres"):
    """Leases written straight into lockext.locks (as the superuser: a million calls of
    lock_acquire would take minutes). Tokens from lockext's sequence."""
    psql(db=db, sql=f"""INSERT INTO lockext.locks (lock_id, owner, fence_token, holder_role, acquired_at, expires_at)
             SELECT '{prefix}' || g, 'filler', nextval('lockext.fence_token_seq'),
                    'postgres'::regrole, clock_timestamp(), {expires_sql}
               FROM generate_series({first}, {last}) g""")


def setup_heartbeat(runner, keys):
    def setup():
        psql("TRUNCATE lockext.locks, article.distributed_locks, bare.leases, bare.leases_indexed")
        # Real grants through lockext: one statement, so the tokens are consecutive.
        psql(f"SELECT count(lockext.lock_acquire('hb:' || g, 'hb', '1 hour')) "
             f"FROM generate_series(1, {keys}) g")
        base, bad = psql("SELECT min(fence_token - substr(lock_id, 4)::bigint), "
                         "count(DISTINCT fence_token - substr(lock_id, 4)::bigint) "
                         "FROM lockext.locks WHERE lock_id LIKE 'hb:%'").split("|")
        if bad != "1":
            raise BenchError("heartbeat leases did not get consecutive tokens")
        runner.vars["base"] = int(base)
        psql(f"INSERT INTO article.distributed_locks (lock_id, owner, expires_at) "
             f"SELECT 'hb:' || g, 'hb', now() + interval '1 hour' FROM generate_series(1, {keys}) g")
        for t in ("bare.leases", "bare.leases_indexed"):
            psql(f"INSERT INTO {t} SELECT 'hb:' || g, 'hb', now() + interval '1 hour' "
                 f"FROM generate_series(1, {keys}) g")
        psql("VACUUM ANALYZE")
        runner.redis.fill([("SET", f"hb:{i}", "hb", "PX", 3600000) for i in range(1, keys + 1)])
    return setup


def setup_fenced(runner, keys):
    def setup():
        psql("TRUNCATE lockext.locks, lockext.resources, article.protected_resources")
        tok = psql("SELECT fence_token FROM lockext.lock_acquire('bench:fenced', 'bench', '1 hour')")
        runner.vars["tok"] = int(tok)
        psql(f"INSERT INTO lockext.resources SELECT 'res:' || g, {tok}, '{{\"n\": 0}}', clock_timestamp() "
             f"FROM generate_series(1, {keys}) g")
        psql(f"INSERT INTO article.protected_resources SELECT 'res:' || g, {tok}, '{{\"n\": 0}}' "
             f"FROM generate_series(1, {keys}) g")
        psql("VACUUM ANALYZE")
        runner.redis.fill([("HSET", f"res:{i}", "t", 1000, "d", '{"n": 0}') for i in range(1, keys + 1)])
    return setup


# ---------------------------------------------------------------------------------------
# Scale and reaper

def scale(runner):
    """The lockext cycle against tables of different sizes. Each size is a database of its
    own (CREATE EXTENSION lockext in each), so that the sizes can be measured in the same
    rounds, interleaved, rather than one after the other while the machine drifts."""
    cfg = runner.cfg
    log("workload scale")
    dbs = {}
    for size in cfg.scale_sizes:
        db = f"scale_{size}"
        psql(f"CREATE DATABASE {db}")
        psql("CREATE EXTENSION lockext", db=db)
        t = time.time()
        fill_lockext("fill:", 1, size, "clock_timestamp() + interval '1 day'", db=db)
        runner.fill_rate = size / max(time.time() - t, 1e-3)
        psql("VACUUM ANALYZE lockext.locks", db=db)
        dbs[size] = db
    psql("CHECKPOINT")
    if cfg.warmup:
        for size, db in dbs.items():
            for system, options in SCALE_SYSTEMS:
                runner.pgbench("cycle_lockext", 16, options, seconds=1, tag="warmup", db=db)
    points = [(size, system, options) for size in cfg.scale_sizes for system, options in SCALE_SYSTEMS]
    for clients in cfg.clients:
        runs = {(size, system): [] for size, system, _ in points}
        for rnd in range(cfg.rounds):
            for size, system, options in (points if rnd % 2 == 0 else list(reversed(points))):
                runs[(size, system)].append(runner.run_once("scale", "cycle_lockext", options,
                                                            clients, cfg.keys, db=dbs[size]))
        for size, system, _ in points:
            row = runner.combine("scale", system, clients, runs[(size, system)], {"leases": size})
            runner.results.append(row)
            log(f"  scale {size:8} leases {clients:3} clients  {row['label']:22} "
                f"{row['tps']:10.1f}/s  p50 {row['p50']:.3f} ms  p99 {row['p99']:.3f} ms")
            left = psql("SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'lock:%'", db=dbs[size])
            if left != "0":
                raise BenchError(f"scale: the cycle left {left} leases behind in {dbs[size]}")
    for db in dbs.values():
        psql(f"DROP DATABASE {db}")


def reaper_total():
    v = psql("SELECT coalesce(sum(reaped_total), -1) FROM lockext.reaper_status() "
             "WHERE database = 'postgres'")
    return int(v)


def reaper(runner):
    cfg = runner.cfg
    log("workload reaper")
    if reaper_total() < 0:
        raise BenchError("no reaper runs for database postgres (lockext.reaper_status() is empty)")
    for clients in cfg.reaper_clients:
        psql("TRUNCATE lockext.locks")
        psql("VACUUM ANALYZE lockext.locks")
        psql("CHECKPOINT")
        n = cfg.reaper_leases
        base = reaper_total()
        # The leases must all be written before they expire: leave the time the fill is
        # expected to take (from the scale workload's, when it ran), doubled, and the lead-in.
        lead_in = cfg.reaper_chunk * 2
        margin = cfg.reaper_margin
        if getattr(runner, "fill_rate", None):
            margin = min(margin, 2 * n / runner.fill_rate + 2)
        expire_at = float(psql(f"SELECT extract(epoch FROM clock_timestamp()) + {margin + lead_in}"))
        t = time.time()
        fill_lockext("exp:", 1, n, f"to_timestamp({expire_at})")
        fill_s = time.time() - t
        log(f"  {n} leases written in {fill_s:.1f} s; they expire at once")
        # Sample the reaper while pgbench runs in chunks; chunks start before the expiry
        # (the 'before' window) and go on until the reaper is done, plus one more chunk.
        progress = []
        stop = threading.Event()

        def poll():
            while not stop.is_set():
                try:
                    progress.append((time.time(), reaper_total() - base))
                except BenchError:
                    pass
                stop.wait(0.1)

        wait = expire_at - lead_in - time.time()
        if wait < 0:
            log(f"  the fill took {-wait:.1f} s longer than planned: a shorter 'before' window")
        if wait > 0:
            time.sleep(wait)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        lat = []
        done_at = None
        extra_chunks = 0
        try:
            for chunk in range(cfg.reaper_max_chunks):
                r = runner.pgbench("cycle_lockext", clients, seconds=cfg.reaper_chunk, tag="reaper")
                lat += r["lat"]
                done = [ts for ts, k in progress if k >= n]
                if done:
                    done_at = done[0]
                    extra_chunks += 1
                    if extra_chunks > 1:
                        break
            else:
                raise BenchError(f"the reaper did not clear {n} leases within "
                                 f"{cfg.reaper_max_chunks * cfg.reaper_chunk} s")
        finally:
            stop.set()
            poller.join()
        runner.check_alive()
        left = int(psql("SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'exp:%'"))
        if left:
            raise BenchError(f"{left} expired leases left after the reaper reported done")
        windows = {"before": [x for x, e in lat if e < expire_at],
                   "during": [x for x, e in lat if expire_at <= e <= done_at],
                   "after": [x for x, e in lat if e > done_at]}
        row = {"workload": "reaper", "system": "lockext", "label": "lockext", "clients": clients,
               "leases": n, "clear_s": done_at - expire_at, "fill_s": fill_s,
               "rate": n / max(done_at - expire_at, 1e-9)}
        for k, v in windows.items():
            v.sort()
            row[f"p50_{k}"] = percentile(v, 0.5) / 1000
            row[f"p99_{k}"] = percentile(v, 0.99) / 1000
            row[f"n_{k}"] = len(v)
        runner.results.append(row)
        log(f"  reaper {clients:3} clients: {n} cleared in {row['clear_s']:.1f} s; cycle p99 "
            f"before {row['p99_before']:.2f} ms, during {row['p99_during']:.2f} ms, "
            f"after {row['p99_after']:.2f} ms")
    psql("TRUNCATE lockext.locks")


# ---------------------------------------------------------------------------------------
# Report

def fmt_num(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x >= 1000:
        return f"{x:,.0f}".replace(",", " ")
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def num(n):
    """1000000 as 1 000 000."""
    return f"{n:,}".replace(",", " ")


def fmt_ms(x):
    if x is None or math.isnan(x):
        return "—"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def ratio(a, b):
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return "—"
    return f"{a / b:.2f}×"


def find(results, workload, system, clients, **kw):
    for r in results:
        if r["workload"] == workload and r["system"] == system and r["clients"] == clients and \
                all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def commits_async(row, results):
    """How a row's writes commit: as declared, except for lockext, whose own commit
    behaviour differs between builds (whether a renewal waits for its flush): there the
    measurement decides, fewer than a quarter of the durable bare UPDATE's fsyncs."""
    if not row["system"].startswith("lockext") or row.get("fsyncs") is None:
        return row["commit"] == "async"
    bare = find(results, row["workload"], "bare", row["clients"]) or \
        find(results, row["workload"], "floor", row["clients"])
    if not bare or not bare.get("fsyncs"):
        return row["commit"] == "async"
    return row["fsyncs"] < 0.25 * bare["fsyncs"]


def floor_of(workload, row, results):
    """The systems a row's ratios are against (REFERENCES, the heartbeat's floor committed
    the way the row commits)."""
    refs = list(REFERENCES[workload])
    if workload == "heartbeat" and commits_async(row, results):
        refs[1] = "bare_async"
    return refs


def report(cfg, results, meta, chart_names):
    L = []
    L.append(f"# lockext benchmarks, {meta['date']}")
    L.append("")
    L.append(f"`{meta['command']}` on {meta['host']}: {meta['cpus']} cores, shared with other work, "
             f"so absolute numbers drift between runs; ratios within this run are the result. "
             f"Each system ran **{meta['duration']}** per point: at each client count, all systems of "
             f"a workload one after the other, in rounds (the order reversed every other round), "
             f"so that drift in the machine hits them alike. PostgreSQL {meta['pg_version']} under pgbench -M prepared "
             f"(-j 2 from 2 clients); Redis {meta['redis_version']} under bench/redisbench.c "
             f"(same shape). lockext.so: {meta['library']}.")
    L.append("")
    for name in chart_names:
        L.append(f"![{name}]({name})")
        L.append("")
    L.append("Latencies are of one whole transaction of the workload (a cycle is acquire + release), "
             "in ms. **× article** and **× floor** divide this row's value by the article's design "
             "and by the floor (or by the references that the section's title names) at the same "
             "client count: above 1 is better for throughput, below 1 "
             "is better for latency. fsyncs, WAL bytes: per operation, from pg_stat_wal (all "
             "processes, so WAL writer flushes of asynchronous commits count too); WAL recs: WAL records per "
             "operation.")
    L.append("")
    titles = {
        "cycle": "1. Cycle: acquire a random free lock among {keys} ids, release it",
        "contended": "2. Contended: every client on one lock (throughput = successful hand-offs; "
                     "latency = one attempt; Jain's index of hand-offs per client, 1 = even)",
        "heartbeat": "3. Heartbeat: renew random ones of {hb} live leases "
                     "(× floor = against the bare UPDATE committed the same way)",
        "fenced": "4. Fenced writes: a valid token on random ones of {hb} resources "
                  "(the article's fenced UPDATE, with >=, is the floor here)",
        "shared": "7. Shared locks: every client takes `mode => 'shared'` on one id, releases it "
                  "(× exclusive = lockext's exclusive cycle on {keys} random ids; × floor = the "
                  "floor of a read lock)",
        "semaphore": "8. Semaphore: every client on one semaphore, waiting for a permit "
                     "(throughput = grants; latency = one attempt, from joining the queue to the "
                     "permit, and the release; × random ids = exclusive locks on {keys} random "
                     "ids, where no one waits; × one lock = the same clients waiting for one "
                     "exclusive lock; Jain's index of grants per client, 1 = even)",
    }
    fmt = {"keys": num(cfg.keys), "hb": num(cfg.hb_keys)}
    for name in ("cycle", "contended", "heartbeat", "fenced"):
        L += workload_table(name, titles[name].format(**fmt), results)

    rows = [r for r in results if r["workload"] == "scale"]
    if rows:
        sizes = sorted({r["leases"] for r in rows})
        L.append(f"## 5. Scale: the lockext cycle with {', '.join(f'{s:,}'.replace(',', ' ') for s in sizes)} "
                 "live leases in the table")
        L.append("")
        L.append("| clients | mode | " + " | ".join(f"{num(s)} leases: cycles/s, p50, p99" for s in sizes) +
                 f" | p99 {num(sizes[-1])} / p99 {num(sizes[0])} |")
        L.append("|---:|---|" + "---:|" * (len(sizes) + 1))
        for clients in cfg.clients:
            for system in ("lockext", "lockext_epoch"):
                cells = []
                pts = [find(results, "scale", system, clients, leases=s) for s in sizes]
                if not all(pts):
                    continue
                for p in pts:
                    cells.append(f"{fmt_num(p['tps'])}, {fmt_ms(p['p50'])}, {fmt_ms(p['p99'])}")
                cells.append(ratio(pts[-1]["p99"], pts[0]["p99"]))
                L.append(f"| {clients} | {SYSTEMS[system][0]} | " + " | ".join(cells) + " |")
        L.append("")

    rows = [r for r in results if r["workload"] == "reaper"]
    if rows:
        L.append(f"## 6. Reaper: {rows[0]['leases']:,} leases expire at once".replace(",", " "))
        L.append("")
        L.append("While lockext cycles run (pgbench in chunks of "
                 f"{cfg.reaper_chunk} s), the leases expire together; the reaper deletes them in "
                 "batches. *Before*: cycles that ended before the expiry (1M live leases in the table); "
                 "*during*: between the expiry and the reaper's last deletion; *after*: the rest.")
        L.append("")
        L.append("| clients | time to clear | leases/s | cycle p50 / p99 before | during | after | p99 during / before |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            L.append(f"| {r['clients']} | {r['clear_s']:.1f} s | {fmt_num(r['rate'])} | "
                     f"{fmt_ms(r['p50_before'])} / {fmt_ms(r['p99_before'])} | "
                     f"{fmt_ms(r['p50_during'])} / {fmt_ms(r['p99_during'])} | "
                     f"{fmt_ms(r['p50_after'])} / {fmt_ms(r['p99_after'])} | "
                     f"{ratio(r['p99_during'], r['p99_before'])} |")
        L.append("")

    for name in ("shared", "semaphore"):
        L += workload_table(name, titles[name].format(**fmt), results)

    L.append("## The systems")
    L.append("")
    for key, text in SYSTEM_NOTES:
        if any(r.get("system") == key for r in results):
            L.append(f"- **{SYSTEMS[key][0]}**: {text}")
    L.append("")
    L += targets(cfg, results)
    L += breakdown(results)
    L.append("## Set-up")
    L.append("")
    L.append("- Scratch cluster on port %d: configured as `scripts/cluster.sh` configures its own "
             "(loopback, lockext preloaded, reaper every 1 s), but run from a copy of the installed "
             "PostgreSQL and lockext taken at the start (so that a `make install` during the run "
             "cannot crash it), with: %s. Everything else is PostgreSQL's default (fsync on, "
             "wal_sync_method fdatasync, synchronous_commit on, full_page_writes on, autovacuum on). "
             "CHECKPOINT before each workload, VACUUM before each client count." % (
                 PG_PORT, ", ".join(f"{k} = {v}" for k, v in PG_SETTINGS.items())))
    L.append(f"- Redis: `redis-server` on 127.0.0.1:{REDIS_PORT}, appendonly yes, save \"\", "
             "auto-aof-rewrite off; `CONFIG SET appendfsync always|everysec` before each run.")
    L.append("- Scripts: `bench/pgbench/*.sql` (one per system and workload), `bench/setup.sql` "
             "(the other systems' schemas), `bench/redisbench.c`. Fills of 10k-1M leases are written "
             "straight into `lockext.locks` by the superuser; the heartbeat's leases are real grants.")
    L.append("")
    return "\n".join(L) + "\n"


def workload_table(name, title, results):
    """One workload's section: each row against the workload's references, at the same
    client count."""
    rows = [r for r in results if r["workload"] == name]
    if not rows:
        return []
    heads = REFERENCE_HEADS.get(name, ("× article", "× floor"))
    head = ["clients", "system"]
    for metric in (UNITS[name], "p50 ms", "p99 ms"):
        head += [metric, *heads]
    if name in COUNTED:
        head += ["attempts/s", "Jain"]
    head += ["fsyncs", "WAL recs", "WAL B"]
    L = ["## " + title, ""]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "|".join("---:" if i not in (1,) else "---" for i in range(len(head))) + "|")
    for r in rows:
        refs = [find(results, name, ref, r["clients"]) for ref in floor_of(name, r, results)]
        cells = [str(r["clients"]), f"**{r['label']}**" if r["system"].startswith("lockext") else r["label"]]
        for key, fmt in (("tps", fmt_num), ("p50", fmt_ms), ("p99", fmt_ms)):
            cells += [fmt(r[key])] + [ratio(r[key], ref and ref[key]) for ref in refs]
        if name in COUNTED:
            cells += [fmt_num(r.get("attempts")), f"{r['jain']:.3f}" if "jain" in r else "—"]
        cells += [fmt_num(r.get("fsyncs")), fmt_num(r.get("wal_records")), fmt_num(r.get("wal_bytes"))]
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    return L


def targets(cfg, results):
    L = ["## Targets of issue 6", ""]
    L.append("| target | clients | measured | met |")
    L.append("|---|---:|---:|:---:|")

    measured = []

    def line(what, clients, value, goal, higher=True):
        if value is None:
            L.append(f"| {what} | {clients} | — | — |")
            return
        measured.append(what)
        ok = value >= goal if higher else value <= goal
        L.append(f"| {what} | {clients} | {value:.2f}× | {'yes' if ok else '**no**'} |")

    for clients in (1, 16):
        if clients not in cfg.clients:
            continue
        f = find(results, "cycle", "floor", clients)
        a = find(results, "cycle", "article", clients)
        names = []
        for system, name in (("lockext", "lockext"), ("lockext_async", "lockext, client-side async release")):
            r = find(results, "cycle", system, clients)
            if r and r.get("fsyncs") is not None:
                name += f" ({r['fsyncs']:.2f} fsyncs/cycle)"
            names.append((system, name))
        for system, name in names:
            r = find(results, "cycle", system, clients)
            line(f"{name} cycle ≥ 0.9× floor", clients, r and f and r["tps"] / f["tps"], 0.9)
        for system, name in names:
            r = find(results, "cycle", system, clients)
            goal = 2.0 if clients == 1 else 1.6
            line(f"{name} cycle ≥ {goal}× article", clients, r and a and r["tps"] / a["tps"], goal)
        r = find(results, "cycle", "lockext_epoch", clients)
        line("lockext epoch mode cycle ≥ 2× floor", clients, r and f and r["tps"] / f["tps"], 2.0)
    for clients in cfg.clients:
        for system in ("lockext", "lockext_epoch"):
            pts = sorted((r for r in results if r["workload"] == "scale" and r["system"] == system
                          and r["clients"] == clients), key=lambda r: r["leases"])
            if len(pts) >= 2:
                line(f"{SYSTEMS[system][0]}: p99 at {num(pts[-1]['leases'])} leases ≤ 1.5× p99 at "
                     f"{num(pts[0]['leases'])}", clients,
                     pts[-1]["p99"] / pts[0]["p99"], 1.5, higher=False)
    for clients in cfg.clients:
        for system in ("lockext", "lockext_async"):
            r = find(results, "heartbeat", system, clients)
            if not r:
                continue
            ref = floor_of("heartbeat", r, results)[1]
            b = find(results, "heartbeat", ref, clients)
            line(f"{SYSTEMS[system][0]} renewals ≥ 0.9× {SYSTEMS[ref][0]} (committed the same way)",
                 clients, r and b and r["tps"] / b["tps"], 0.9)
    L.append("")
    return L if measured else []  # a run without the cycle, scale or heartbeat workloads


def breakdown(results):
    """Where a lockext cycle's time goes: per statement (pgbench -r), fsyncs and WAL."""
    L = ["## Where the time goes (cycle, per statement, pgbench -r)", ""]
    L.append("| clients | system | statement latencies, ms | fsyncs/cycle | WAL records | WAL bytes | µs per WAL fsync |")
    L.append("|---:|---|---|---:|---:|---:|---:|")
    rows = [r for r in results if r["workload"] == "cycle" and "statements" in r]
    if not rows:
        return []
    for r in rows:
        stmts = "; ".join(f"{short(s)} {ms:.3f}" for ms, s in r["statements"])
        L.append(f"| {r['clients']} | {r['label']} | {stmts} | {fmt_num(r['fsyncs'])} | "
                 f"{fmt_num(r['wal_records'])} | {fmt_num(r['wal_bytes'])} | {fmt_num(r['fsync_us'])} |")
    L.append("")
    return L


def short(stmt):
    s = stmt.upper()
    for key, name in (("LOCK_ACQUIRE", "acquire"), ("LOCK_RELEASE", "release"),
                      ("PG_TRY_ADVISORY", "try_lock"), ("PG_ADVISORY_UNLOCK", "unlock"),
                      ("INSERT", "INSERT"), ("DELETE FROM DISTRIBUTED_LOCKS WHERE LOCK_ID = 'LOCK:' || :ID AND EXPIRES", "DELETE expired"),
                      ("DELETE", "DELETE"), ("BEGIN", "BEGIN"), ("COMMIT", "COMMIT")):
        if key in s:
            return name
    return stmt[:20]


# ---------------------------------------------------------------------------------------
# Chart: hand-written SVG, no dependencies.

def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def chart_throughput(cfg, results):
    """One panel per workload: each system's throughput as a multiple of the floor, on a log
    scale, grouped by client count."""
    panels = [n for n in ("cycle", "contended", "heartbeat", "fenced", "shared", "semaphore")
              if any(r["workload"] == n for r in results)]
    W, left, right = 980, 250, 120
    plot_w = W - left - right
    bar_h, gap, group_gap = 13, 3, 16
    lo, hi = 1 / 8, 64.0
    ticks = [0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64]

    def x_of(v):
        v = min(max(v, lo), hi)
        return left + plot_w * (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))

    out, y = [], 0
    titles = {"cycle": "Cycle: acquire + release, random lock (× floor)",
              "contended": "Contended: hand-offs on one lock (× floor)",
              "heartbeat": "Heartbeat: renewals (× bare UPDATE, durable)",
              "fenced": "Fenced writes (× the article's fenced UPDATE)",
              "shared": "Shared locks: acquire + release, one id (× floor of a read lock)",
              "semaphore": "Semaphore: grants, waiting (× one exclusive lock, waiting)"}
    y = 50
    for name in panels:
        rows = [r for r in results if r["workload"] == name]
        systems = [s for s, _, _ in WORKLOADS[name] if any(r["system"] == s for r in rows)]
        ref = REFERENCES[name][-1]
        ref_head = REFERENCE_HEADS.get(name, ("× floor",))[-1]
        out.append(f'<text x="{left}" y="{y}" class="title">{esc(titles[name])}</text>')
        y += 12
        top = y
        if name == "cycle":
            y += 12
        for clients in cfg.clients:
            f = find(results, name, ref, clients)
            out.append(f'<text x="{left - 8}" y="{y + 11}" class="group" text-anchor="end">'
                       f'{clients} client{"s" if clients > 1 else ""}</text>')
            y += 14
            for s in systems:
                r = find(results, name, s, clients)
                if not r or not f:
                    continue
                v = r["tps"] / f["tps"]
                label, colour, _ = SYSTEMS[s]
                x0, x1 = x_of(lo), x_of(v)
                out.append(f'<text x="{left - 8}" y="{y + bar_h - 3}" class="label" '
                           f'text-anchor="end">{esc(label)}</text>')
                out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="{bar_h}" '
                           f'fill="{colour}"><title>{esc(label)}, {clients} clients: '
                           f'{r["tps"]:.0f} {UNITS[name]}, {v:.2f}{ref_head}</title></rect>')
                out.append(f'<text x="{x1 + 4:.1f}" y="{y + bar_h - 3}" class="value">'
                           f'{v:.2f}× · {fmt_num(r["tps"])}/s</text>')
                y += bar_h + gap
            y += group_gap - gap
        bottom = y
        for t in ticks:
            x = x_of(t)
            cls = "one" if t == 1 else "grid"
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="{cls}"/>')
            out.append(f'<text x="{x:.1f}" y="{bottom + 12}" class="tick" text-anchor="middle">'
                       f'{t:g}×</text>')
        if name == "cycle":
            x = x_of(0.9)
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="target"/>')
            out.append(f'<text x="{x - 3:.1f}" y="{top + 9}" class="tick" text-anchor="end">target 0.9×</text>')
            x = x_of(2)
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="target"/>')
            out.append(f'<text x="{x + 3:.1f}" y="{top + 9}" class="tick">epoch target 2×</text>')
        y = bottom + 44
    H = y
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'viewBox="0 0 {W} {H}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">'
            '<style>.title{font-size:14px;font-weight:bold;fill:#24292f}'
            '.group{font-size:11px;font-weight:bold;fill:#24292f}.label{font-size:11px;fill:#24292f}'
            '.value{font-size:10px;fill:#424a53;paint-order:stroke;stroke:white;stroke-width:3px;stroke-linejoin:round}.tick{font-size:10px;fill:#57606a;paint-order:stroke;stroke:white;stroke-width:3px;stroke-linejoin:round}'
            '.grid{stroke:#d0d7de;stroke-width:1}.one{stroke:#24292f;stroke-width:1.5}'
            '.target{stroke:#cf222e;stroke-width:1;stroke-dasharray:4 3}</style>'
            f'<rect width="{W}" height="{H}" fill="white"/>'
            f'<text x="16" y="24" font-size="17" font-weight="bold" fill="#24292f">'
            f'lockext side by side: throughput, log scale (1× = the reference named in '
            f'each panel\'s title)</text>')
    return head + "".join(out) + "</svg>\n"


def nice_step(raw):
    """The smallest 1, 2 or 5 times a power of ten that is at least raw."""
    p = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * p >= raw:
            return round(m * p, 10)
    return 10 * p


def chart_latency(cfg, results):
    """p99 of the cycle by system and client count, and of lockext across table sizes."""
    rows = [r for r in results if r["workload"] == "cycle"]
    systems = [s for s, _, _ in WORKLOADS["cycle"] if any(r["system"] == s for r in rows)]
    W, left = 980, 250
    plot_w = W - left - 120
    vals = [r[k] for r in rows for k in ("p50", "p99") if r[k] > 0]
    if not vals:
        return None
    lo = 10 ** math.floor(math.log10(min(vals)))
    hi = 10 ** math.ceil(math.log10(max(vals)))

    def x_of(v):
        v = min(max(v, lo), hi)
        return left + plot_w * (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))

    out, y = [], 50
    out.append(f'<text x="{left}" y="{y}" class="title">Cycle latency: p50 (dark) and p99 '
               '(light), ms, log scale</text>')
    y += 12
    top = y
    for clients in cfg.clients:
        out.append(f'<text x="{left - 8}" y="{y + 11}" class="group" text-anchor="end">'
                   f'{clients} client{"s" if clients > 1 else ""}</text>')
        y += 14
        for s in systems:
            r = find(results, "cycle", s, clients)
            if not r:
                continue
            label, colour, _ = SYSTEMS[s]
            x0 = x_of(lo)
            out.append(f'<text x="{left - 8}" y="{y + 10}" class="label" text-anchor="end">{esc(label)}</text>')
            out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x_of(r["p99"]) - x0, 1):.1f}" height="13" '
                       f'fill="{colour}" opacity="0.35"/>')
            out.append(f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(x_of(r["p50"]) - x0, 1):.1f}" '
                       f'height="7" fill="{colour}"/>')
            out.append(f'<text x="{x_of(r["p99"]) + 4:.1f}" y="{y + 10}" class="value">'
                       f'{fmt_ms(r["p50"])} / {fmt_ms(r["p99"])} ms</text>')
            y += 16
        y += 12
    bottom = y
    t = lo
    while t <= hi * 1.0001:
        for m in (1, 2, 5):
            v = t * m
            if v > hi * 1.0001:
                break
            x = x_of(v)
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="grid"/>')
            out.append(f'<text x="{x:.1f}" y="{bottom + 12}" class="tick" text-anchor="middle">'
                       f'{round(v, 6):g}</text>')
        t *= 10
    y = bottom + 40
    # scale: p99 against table size, one line per client count and mode
    pts = [r for r in results if r["workload"] == "scale"]
    if pts:
        sizes = sorted({r["leases"] for r in pts})
        out.append(f'<text x="{left}" y="{y}" class="title">Scale: lockext cycle p99 (ms) '
                   'against live leases in the table</text>')
        y += 14
        ph = 150
        pvals = [r["p99"] for r in pts]
        step = nice_step(max(pvals) * 1.1 / 4)
        ymax = step * 4
        x_at = {s: left + 60 + i * (plot_w - 120) / max(len(sizes) - 1, 1) for i, s in enumerate(sizes)}
        for k in range(5):
            v = ymax * k / 4
            yy = y + ph - ph * k / 4
            out.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{left + plot_w}" y2="{yy:.1f}" class="grid"/>')
            out.append(f'<text x="{left - 6}" y="{yy + 3:.1f}" class="tick" text-anchor="end">{v:g}</text>')
        for s in sizes:
            out.append(f'<text x="{x_at[s]:.1f}" y="{y + ph + 14}" class="tick" text-anchor="middle">'
                       f'{num(s)} leases</text>')
        dashes = {"lockext": "", "lockext_epoch": ' stroke-dasharray="5 3"'}
        shades = ["#1f6feb", "#bf3989", "#1a7f37", "#bc4c00"]
        legend_y = y
        for ci, clients in enumerate(cfg.clients):
            for system in ("lockext", "lockext_epoch"):
                line = sorted((r for r in pts if r["clients"] == clients and r["system"] == system),
                              key=lambda r: r["leases"])
                if not line:
                    continue
                coords = " ".join(f"{x_at[r['leases']]:.1f},{y + ph - ph * r['p99'] / ymax:.1f}" for r in line)
                colour = shades[ci % len(shades)]
                out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" '
                           f'stroke-width="2"{dashes[system]}/>')
                for r in line:
                    out.append(f'<circle cx="{x_at[r["leases"]]:.1f}" cy="{y + ph - ph * r["p99"] / ymax:.1f}" '
                               f'r="3" fill="{colour}"><title>{clients} clients, {SYSTEMS[system][0]}, '
                               f'{r["leases"]} leases: p99 {r["p99"]:.3f} ms</title></circle>')
                out.append(f'<line x1="{left + plot_w + 10}" y1="{legend_y + 4}" x2="{left + plot_w + 30}" '
                           f'y2="{legend_y + 4}" stroke="{colour}" stroke-width="2"{dashes[system]}/>')
                out.append(f'<text x="{left + plot_w + 34}" y="{legend_y + 8}" class="value">{clients}c'
                           f'{" epoch" if system == "lockext_epoch" else ""}</text>')
                legend_y += 13
        y += ph + 40
    H = y
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'viewBox="0 0 {W} {H}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">'
            '<style>.title{font-size:14px;font-weight:bold;fill:#24292f}'
            '.group{font-size:11px;font-weight:bold;fill:#24292f}.label{font-size:11px;fill:#24292f}'
            '.value{font-size:10px;fill:#424a53;paint-order:stroke;stroke:white;stroke-width:3px;stroke-linejoin:round}.tick{font-size:10px;fill:#57606a;paint-order:stroke;stroke:white;stroke-width:3px;stroke-linejoin:round}'
            '.grid{stroke:#d0d7de;stroke-width:1}</style>'
            f'<rect width="{W}" height="{H}" fill="white"/>'
            f'<text x="16" y="24" font-size="17" font-weight="bold" fill="#24292f">'
            f'lockext benchmarks: latency</text>')
    return head + "".join(out) + "</svg>\n"


# ---------------------------------------------------------------------------------------

class Config:
    pass


def skip_epoch():
    log("BENCH_SKIP_EPOCH=1: lockext's epoch mode is left out")
    for name, entries in WORKLOADS.items():
        WORKLOADS[name] = [e for e in entries if e[2] != EPOCH]
    SCALE_SYSTEMS[:] = [s for s in SCALE_SYSTEMS if s[0] != "lockext_epoch"]


def config(smoke):
    c = Config()
    c.smoke = smoke
    if smoke:
        c.clients = [1, 4]
        c.round_seconds = 1
        c.rounds = 1
        c.transactions = int(os.environ.get("BENCH_TRANSACTIONS", "25"))
        c.keys = 100000
        c.hb_keys = 2000
        c.scale_sizes = [1000, 5000]
        c.reaper_leases = 5000
        c.reaper_clients = [4]
        c.reaper_margin = 2
        c.reaper_chunk = 1
        c.reaper_max_chunks = 20
        c.warmup = False
    else:
        c.clients = [int(x) for x in os.environ.get("BENCH_CLIENTS", "1,16,64").split(",")]
        c.round_seconds = int(os.environ.get("BENCH_SECONDS", "2"))
        c.rounds = int(os.environ.get("BENCH_ROUNDS", "2"))
        c.transactions = None
        c.keys = 100000
        c.hb_keys = 100000
        c.scale_sizes = [10000, 100000, 1000000]
        c.reaper_leases = int(os.environ.get("BENCH_REAPER_LEASES", "1000000"))
        c.reaper_clients = c.clients
        c.reaper_margin = 30
        c.reaper_chunk = 2
        c.reaper_max_chunks = 60
        c.warmup = True
    if max(c.clients) > 64:
        raise BenchError("at most 64 clients (bench.handoffs_0..63)")
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="every script once, briefly (CI)")
    ap.add_argument("--only", help="comma-separated workloads: cycle,contended,heartbeat,fenced,scale,"
                                   "reaper,shared,semaphore")
    ap.add_argument("--render", metavar="JSON", help="only write the report again from a run's JSON")
    args = ap.parse_args()
    if args.render:
        return render(args.render)
    cfg = config(args.smoke)
    only = set(args.only.split(",")) if args.only else None
    started = time.time()
    build_driver()

    log(f"scratch cluster on port {PG_PORT} in {PG_HOME}, from a copy of the installed "
        "PostgreSQL and lockext")
    cluster = Cluster()
    is_debug = cluster.create(os.environ.get("BENCH_ALLOW_DEBUG") == "1")
    try:
        return run_all(cfg, cluster, only, started, is_debug)
    finally:
        if os.environ.get("BENCH_KEEP") != "1":
            cluster.destroy()


def run_all(cfg, cluster, only, started, is_debug):
    psql_file(os.path.join(HERE, "setup.sql"))
    if os.environ.get("BENCH_SKIP_EPOCH") == "1":
        skip_epoch()
    else:
        try:
            psql("SELECT lockext.lock_acquire('bench:probe', 'bench', '1 second')", options=EPOCH)
        except BenchError as e:
            raise BenchError("lockext in epoch mode fails on this build (BENCH_SKIP_EPOCH=1 "
                             "leaves it out):\n" + str(e))
    psql("TRUNCATE lockext.locks")

    redis_server = Redis()
    try:
        redis_server.start()
        runner = Runner(cfg, redis_server)
        want = lambda w: only is None or w in only
        if want("cycle"):
            runner.workload("cycle", cfg.keys)
        if want("contended"):
            runner.workload("contended", cfg.keys)
        if want("heartbeat"):
            runner.workload("heartbeat", cfg.hb_keys, setup_heartbeat(runner, cfg.hb_keys))
        if want("fenced"):
            runner.workload("fenced", cfg.hb_keys, setup_fenced(runner, cfg.hb_keys))
        if want("scale"):
            scale(runner)
        if want("reaper"):
            reaper(runner)
        for name in ("shared", "semaphore"):
            if want(name):
                runner.workload(name, cfg.keys)
        runner.check_alive()

        pg_version = psql("SHOW server_version")
        results = runner.results
        lockext_version = psql("SELECT extversion FROM pg_extension WHERE extname = 'lockext'")
    finally:
        redis_server.stop()

    elapsed = time.time() - started
    meta = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "command": ("make bench-smoke" if cfg.smoke else "make bench") if not only else
                       "python3 bench/bench.py " + ("--smoke " if cfg.smoke else "") +
                       "--only " + ",".join(sorted(only)),
            "host": socket.gethostname(), "cpus": os.cpu_count(),
            "duration": (f"{cfg.transactions} transactions per client" if cfg.transactions
                         else f"{cfg.rounds} × {cfg.round_seconds} s"),
            "pg_version": pg_version, "redis_version": redis_server.version,
            "library": ("debug build" if is_debug else "release build") + f", lockext {lockext_version}",
            "elapsed_s": round(elapsed), "config": vars(cfg)}
    # Only a full run makes a report for results/; smoke and partial runs stay in tmp/.
    if cfg.smoke:
        outdir, base = os.path.join(TMP, "smoke"), "smoke"
    elif only:
        outdir, base = os.path.join(TMP, "partial"), datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    else:
        outdir, base = os.path.join(HERE, "results"), datetime.datetime.now().strftime("%Y-%m-%d")
    path = write_outputs(cfg, results, meta, outdir, base)
    log(f"report: {os.path.relpath(path, ROOT)} ({elapsed:.0f} s)")


def write_outputs(cfg, results, meta, outdir, base):
    os.makedirs(outdir, exist_ok=True)
    charts = []
    for suffix, make in (("-throughput.svg", chart_throughput), ("-latency.svg", chart_latency)):
        svg = make(cfg, results)
        if svg:
            with open(os.path.join(outdir, base + suffix), "w") as f:
                f.write(svg)
            charts.append(base + suffix)
    md = report(cfg, results, meta, charts)
    md += f"Total run time: {meta['elapsed_s'] / 60:.1f} min.\n"
    path = os.path.join(outdir, base + ".md")
    with open(path, "w") as f:
        f.write(md)
    with open(os.path.join(outdir, base + ".json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1, default=str)
    return path


def render(json_path):
    """Writes the report and charts again from a run's JSON (after changing the report)."""
    with open(json_path) as f:
        data = json.load(f)
    cfg = Config()
    for k, v in data["meta"]["config"].items():
        setattr(cfg, k, v)
    outdir, name = os.path.split(os.path.abspath(json_path))
    path = write_outputs(cfg, data["results"], data["meta"], outdir, name[:-len(".json")])
    log(f"report: {path}")


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        log("FAILED: " + str(e))
        sys.exit(1)
