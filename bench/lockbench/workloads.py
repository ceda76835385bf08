"""The workloads and which systems each compares: the pgbench script (or Redis mode) and
settings of every system in every workload, the references its ratios are taken against,
and the lookups that find a row of a run's results by workload, system and client count.

This is what the runner runs and what the report and charts divide by; both read it from
here so that a table and a chart can never compare different pairs.
"""
from .shell import log
from .systems import ARTICLE, EPOCH

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


