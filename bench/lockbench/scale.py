"""The workloads that measure lockext alone against the size of its table: scale (the
cycle with 10k to 1M live leases, each size a database of its own so that all sizes run
in the same rounds) and reaper (a million leases expiring at once while cycles run, the
cycle's latency before, during and after the reaper clears them).

Their rows have workload "scale" or "reaper" and the extra fields leases, clear_s, rate
and the per-window percentiles; the report gives them tables of their own.
"""
import threading
import time

from .cluster import psql
from .fills import fill_lockext
from .runner import percentile
from .shell import BenchError, log
from .workloads import SCALE_SYSTEMS

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
