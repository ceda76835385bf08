"""The workloads and which systems each compares: the pgbench script (or Redis mode) and
settings of every system in every workload, the references its ratios are taken against,
the project's performance targets as pairs of those systems, and the lookups that find a
row of a run's results by workload, system and client count.

This is what the runner runs and what the report and charts divide by; both read it from
here so that a table, a chart and a target can never compare different pairs.
"""
from collections import namedtuple

from .shell import log
from .systems import ARTICLE, EPOCH

# workload -> [(system, pgbench script, ("redis", mode, fsync) or ("etcd", mode, lease), PGOPTIONS)]
def redis(mode, fsync):
    return ("redis", mode, fsync)


def etcd(mode, lease):
    return ("etcd", mode, lease)


WORKLOADS = {
    "cycle": [
        ("lockext", "cycle_lockext", ""),
        ("lockext_async", "cycle_lockext_async", ""),
        ("lockext_epoch", "cycle_lockext", EPOCH),
        ("article", "cycle_article", ARTICLE),
        ("advisory", "cycle_advisory", ""),
        ("floor", "cycle_floor", ""),
        ("floor_async", "cycle_floor_async", ""),
        ("floor_fn", "cycle_floor_fn", ""),
        ("floor_fn_async", "cycle_floor_fn_async", ""),
        ("redis_always", redis("cycle", "always"), ""),
        ("redis_everysec", redis("cycle", "everysec"), ""),
        ("etcd", etcd("cycle", "per-cycle"), ""),
        ("etcd_session", etcd("cycle", "session"), ""),
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
        ("etcd", etcd("contended", "per-cycle"), ""),
        ("etcd_session", etcd("contended", "session"), ""),
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
        ("lockext_guarded", "fenced_guarded", ""),
        ("lockext_guarded_declared", "fenced_guarded_declared", ""),
        ("unguarded", "fenced_unguarded", ""),
        ("unguarded_tx", "fenced_unguarded_tx", ""),
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

# The project's performance targets, each a ratio of two systems of one workload at the
# same client count within one run. metric "tps": the system's throughput over the
# reference's, at least goal; "p99": the system's 99th percentile latency over the
# reference's, at most goal; "wal_records": the system's WAL records per operation minus
# the reference's, at most goal. reference SAME_COMMIT is the heartbeat's bare UPDATE
# committed the way the row commits (floor_of). A target with system None has no pair in
# the workloads; missing says why.
Target = namedtuple("Target", "name workload system reference metric goal missing")
SAME_COMMIT = "same_commit"
TARGETS = [
    Target("cycle, default durability", "cycle", "lockext", "floor", "tps", 0.9, None),
    Target("cycle, epoch mode", "cycle", "lockext_epoch", "floor_async", "tps", 0.8, None),
    Target("cycle, default durability / etcd's lock recipe", "cycle", "lockext", "etcd", "tps",
           2.0, None),
    Target("fenced writes, default durability", "fenced", "lockext", "article", "tps", 1.0, None),
    Target("fenced writes, epoch mode", "fenced", "lockext_epoch", "article", "tps", 1.0, None),
    Target("guarded UPDATE, token in SET", "fenced", "lockext_guarded", "unguarded", "tps", 0.8,
           None),
    # The declared way is a transaction of four statements (BEGIN, declare_token, UPDATE,
    # COMMIT): its reference is the same transaction without lockext, not a lone UPDATE.
    Target("guarded UPDATE, token declared", "fenced", "lockext_guarded_declared",
           "unguarded_tx", "tps", 0.8, None),
    Target("heartbeat (renew), default durability", "heartbeat", "lockext", SAME_COMMIT, "tps",
           0.9, None),
    Target("heartbeat (renew), client commits the renewal async", "heartbeat", "lockext_async",
           SAME_COMMIT, "tps", 0.9, None),
    Target("heartbeat (renew), epoch mode", "heartbeat", None, SAME_COMMIT, "tps", 0.9,
           "the heartbeat workload has no epoch-mode system"),
    Target("shared lease on one id, default durability", "shared", "lockext_shared",
           "floor_shared", "tps", 0.7, None),
    Target("shared lease on one id, epoch mode", "shared", "lockext_shared_epoch",
           "floor_shared_async", "tps", 0.7, None),
    Target("p99 of a cycle, default durability", "cycle", "lockext", "floor", "p99", 1.5, None),
    Target("p99 of a cycle, epoch mode", "cycle", "lockext_epoch", "floor_async", "p99", 1.5,
           None),
    Target("WAL records per cycle, default durability", "cycle", "lockext", "floor",
           "wal_records", 1.0, None),
    Target("WAL records per cycle, epoch mode", "cycle", "lockext_epoch", "floor_async",
           "wal_records", 1.0, None),
]


def skip_epoch():
    log("BENCH_SKIP_EPOCH=1: lockext's epoch mode is left out")
    for name, entries in WORKLOADS.items():
        WORKLOADS[name] = [e for e in entries if e[2] != EPOCH]
    SCALE_SYSTEMS[:] = [s for s in SCALE_SYSTEMS if s[0] != "lockext_epoch"]


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



def target_reference(target, row, results):
    """The system a target's row is divided by: its reference, or for SAME_COMMIT the
    heartbeat's floor committed the way the row commits."""
    if target.reference == SAME_COMMIT:
        return floor_of(target.workload, row, results)[1]
    return target.reference
