"""Where a run's files are and what the environment chooses: ports, the scratch cluster's
home, the PostgreSQL it copies (BENCH_PG_BIN), and the run's options (Config: client
counts, round length, table sizes), full or smoke.

Every BENCH_* variable is read here, so that the other modules take their settings from
one place and `--render` can rebuild a Config from a run's JSON.
"""
import os

from .shell import BenchError

# bench/, the package's parent: the SQL scripts, setup.sql, redisbench.c and etcdbench/ live there.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(HERE)
# The PostgreSQL (with lockext installed) that a run copies and starts: Debian's by
# default, or a relocated tree's bin directory, e.g. /opt/pg/usr/lib/postgresql/15/bin.
DEFAULT_PG_BIN = "/usr/lib/postgresql/15/bin"
SOURCE_PG_BIN = os.path.realpath(os.environ.get("BENCH_PG_BIN") or DEFAULT_PG_BIN)
PG_PORT = int(os.environ.get("BENCH_PG_PORT", "5599"))
PG_HOME = os.environ.get("BENCH_HOME", "/tmp/lockext-bench")
# The installed PostgreSQL (with lockext), copied at the start of a run: see cluster.Cluster.
SNAPSHOT = os.path.join(PG_HOME, "pg")
PG_BIN = SNAPSHOT + SOURCE_PG_BIN
PGBENCH = os.path.join(PG_BIN, "pgbench")
PSQL = os.path.join(PG_BIN, "psql")
REDIS_PORT = int(os.environ.get("BENCH_REDIS_PORT", "6399"))
REDIS_DIR = os.path.join(PG_HOME, "redis")
# etcd listens for clients on ETCD_PORT and for (no) peers on the next port.
ETCD_PORT = int(os.environ.get("BENCH_ETCD_PORT", "2399"))
ETCD_DIR = os.path.join(PG_HOME, "etcd")
TMP = os.path.join(HERE, "tmp")
SCRIPTS = os.path.join(HERE, "pgbench")
DRIVER = os.path.join(TMP, "redisbench")
# bench/etcdbench (Rust, etcd's own gRPC API through the etcd-client crate), built into
# TMP so that a second run reuses the build.
ETCD_SOURCE = os.path.join(HERE, "etcdbench")
ETCD_TARGET = os.path.join(TMP, "etcdbench-target")
ETCD_DRIVER = os.path.join(ETCD_TARGET, "release", "etcdbench")


class Config:
    pass


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


def keep_cluster():
    return os.environ.get("BENCH_KEEP") == "1"


def skip_epoch_requested():
    return os.environ.get("BENCH_SKIP_EPOCH") == "1"


def allow_debug():
    return os.environ.get("BENCH_ALLOW_DEBUG") == "1"
