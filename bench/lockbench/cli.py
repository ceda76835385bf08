"""One run from start to end: the command line, the scratch cluster and Redis, the
workloads in their order, and the files a run leaves (report, charts, JSON), or only the
report and charts again from a run's JSON (--render).

Smoke runs write to bench/tmp/smoke/, runs with --only to bench/tmp/partial/; only a full
run writes to bench/results/.
"""
import argparse
import datetime
import json
import os
import socket
import time

from .charts import CHARTS
from .cluster import Cluster, Etcd, Redis, psql, psql_file
from .config import (HERE, PG_HOME, PG_PORT, ROOT, SOURCE_PG_BIN, TMP, Config, allow_debug, config,
                     keep_cluster, skip_epoch_requested)
from .fills import setup_fenced, setup_heartbeat
from .report import report
from .runner import Runner, build_driver, build_etcd_driver
from .scale import reaper, scale
from .shell import BenchError, log
from .systems import EPOCH
from .workloads import skip_epoch

DESCRIPTION = """lockext benchmarks, side by side in one run. Started by bench/run.sh.

Every PostgreSQL system runs under the real pgbench (-M prepared), Redis under
bench/redisbench.c and etcd under bench/etcdbench (same shape: N connections on J threads). All systems of a workload run
back to back at each client count, for the same duration, against one scratch cluster and
one Redis; everything is reported as ratios within this run."""


def main():
    ap = argparse.ArgumentParser(description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
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
    build_etcd_driver()

    log(f"scratch cluster on port {PG_PORT} in {PG_HOME}, from a copy of the PostgreSQL in "
        f"{SOURCE_PG_BIN} and its lockext")
    cluster = Cluster()
    is_debug = cluster.create(allow_debug())
    try:
        return run_all(cfg, cluster, only, started, is_debug)
    finally:
        if not keep_cluster():
            cluster.destroy()


def run_all(cfg, cluster, only, started, is_debug):
    psql_file(os.path.join(HERE, "setup.sql"))
    if skip_epoch_requested():
        skip_epoch()
    else:
        try:
            psql("SELECT lockext.lock_acquire('bench:probe', 'bench', '1 second')", options=EPOCH)
        except BenchError as e:
            raise BenchError("lockext in epoch mode fails on this build (BENCH_SKIP_EPOCH=1 "
                             "leaves it out):\n" + str(e))
    psql("TRUNCATE lockext.locks")

    redis_server, etcd_server = Redis(), Etcd()
    try:
        redis_server.start()
        etcd_server.start()
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
        etcd_server.stop()

    elapsed = time.time() - started
    meta = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "command": ("make bench-smoke" if cfg.smoke else "make bench") if not only else
                       "python3 bench/bench.py " + ("--smoke " if cfg.smoke else "") +
                       "--only " + ",".join(sorted(only)),
            "host": socket.gethostname(), "cpus": os.cpu_count(),
            "duration": (f"{cfg.transactions} transactions per client" if cfg.transactions
                         else f"{cfg.rounds} × {cfg.round_seconds} s"),
            "pg_version": pg_version, "redis_version": redis_server.version,
            "etcd_version": etcd_server.version,
            "library": ("debug build" if is_debug else "release build") + f", lockext {lockext_version}",
            "elapsed_s": round(elapsed), "config": vars(cfg)}
    # Only a full run makes a report for results/; smoke and partial runs stay in tmp/.
    if cfg.smoke:
        outdir, base = os.path.join(TMP, "smoke"), "smoke"
    elif only:
        outdir, base = os.path.join(TMP, "partial"), datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    else:
        outdir, base = os.path.join(HERE, "results"), datetime.datetime.now().strftime("%Y-%m-%d")
    path = write_outputs(cfg, results, meta, outdir, base, require_charts=cfg.smoke and not only)
    log(f"report: {os.path.relpath(path, ROOT)} ({elapsed:.0f} s)")


def write_outputs(cfg, results, meta, outdir, base, require_charts=False):
    """Writes the JSON (first, so that a chart that fails loses no measurement: --render
    draws again from it), the charts and the markdown. require_charts (a smoke run of
    every workload, as CI runs it) makes a chart that draws nothing an error."""
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, base + ".json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1, default=str)
    charts, undrawn = [], []
    for suffix, draw in CHARTS:
        if draw(cfg, results, os.path.join(outdir, base + suffix)):
            charts.append(base + suffix)
        else:
            undrawn.append(base + suffix)
    md = report(cfg, results, meta, charts)
    md += f"Total run time: {meta['elapsed_s'] / 60:.1f} min.\n"
    path = os.path.join(outdir, base + ".md")
    with open(path, "w") as f:
        f.write(md)
    if require_charts and undrawn:
        raise BenchError(f"no {', '.join(undrawn)}: every workload ran, so the chart code broke")
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
