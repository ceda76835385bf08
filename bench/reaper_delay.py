#!/usr/bin/env python3
"""How long the reaper takes to clear expired leases while many others are live or in
their lock-delay (a batch must not read those: it deletes only leases whose lock is free).
Standard library only.

  python3 bench/reaper_delay.py [--delayed 550000] [--live 50000] [--expired 20000]

Starts a scratch cluster (LOCKEXT_HOME=/tmp/lockext-reaperbench, port 5497) with the
installed lockext, loads the leases straight into lockext.locks as the superuser (expired
ones with no delay, expired ones inside a one-day lock-delay, live ones), and reports the
time until the reaper has deleted every expired one, and the reaper's batch statement
timed by EXPLAIN ANALYZE. Run it once per build to compare builds.
"""
import argparse
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, LOCKEXT_PORT="5497", LOCKEXT_HOME="/tmp/lockext-reaperbench")
PSQL = ["/usr/lib/postgresql/15/bin/psql", "-X", "-qAt", "-h", "127.0.0.1", "-p", "5497",
        "-U", "postgres", "-v", "ON_ERROR_STOP=1", "postgres"]


def cluster(cmd):
    subprocess.run(["bash", os.path.join(ROOT, "scripts/cluster.sh"), cmd], env=ENV,
                   check=True, stdout=subprocess.DEVNULL)


def sql(text):
    return subprocess.run(PSQL + ["-c", text], check=True, capture_output=True,
                          text=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--delayed", type=int, default=550_000)
    ap.add_argument("--live", type=int, default=50_000)
    ap.add_argument("--expired", type=int, default=20_000)
    a = ap.parse_args()
    cluster("destroy")
    cluster("start")
    try:
        sql("ALTER SYSTEM SET lockext.reap_interval = '1h'")  # no round while loading
        sql("SELECT pg_reload_conf()")
        time.sleep(2)
        row = ("INSERT INTO lockext.locks (lock_id, owner, fence_token, holder_role, acquired_at, "
               "expires_at, lock_delay) SELECT '{p}' || g, 'o', g, 10, now() - interval '1 hour', "
               "{exp}, {delay} FROM generate_series({lo}, {hi}) AS g")
        n = 0
        for prefix, count, exp, delay in (
                ("delayed-", a.delayed, "now() - interval '1 minute'", "interval '1 day'"),
                ("live-", a.live, "now() + interval '1 hour'", "interval '0'"),
                ("expired-", a.expired, "now() - interval '1 minute'", "interval '0'")):
            sql(row.format(p=prefix, exp=exp, delay=delay, lo=n + 1, hi=n + count))
            n += count
        sql("VACUUM ANALYZE lockext.locks")
        before = int(sql("SELECT coalesce(sum(reaped_total), 0) FROM lockext.reaper_status()"))
        start = time.monotonic()
        sql("ALTER SYSTEM SET lockext.reap_interval = '10ms'")
        sql("SELECT pg_reload_conf()")
        while int(sql("SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'expired-%'")) > 0:
            time.sleep(0.05)
            if time.monotonic() - start > 600:
                raise SystemExit("the reaper did not clear the expired leases in 10 minutes")
        cleared = time.monotonic() - start
        reaped = int(sql("SELECT coalesce(sum(reaped_total), 0) FROM lockext.reaper_status()")) - before
        # The batch statement's scan, as the reaper would run it now (nothing left to delete).
        plan = sql("EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON) "
                   + sql("SELECT CASE WHEN EXISTS (SELECT FROM pg_proc WHERE proname = 'free_at') "
                         "THEN 'SELECT lock_id FROM lockext.locks WHERE lockext.free_at(expires_at, lock_delay) <= now() ORDER BY lockext.free_at(expires_at, lock_delay) LIMIT 1000' "
                         "ELSE 'SELECT lock_id FROM lockext.locks WHERE expires_at <= now() AND expires_at + lock_delay <= now() ORDER BY expires_at LIMIT 1000' END"))
        exec_ms = [l for l in plan.splitlines() if l.startswith("Execution Time")]
        print(f"{a.expired} expired among {a.delayed} delayed and {a.live} live: cleared in "
              f"{cleared:.2f} s (reaper deleted {reaped}); an empty batch's scan: {exec_ms[0] if exec_ms else plan}")
    finally:
        cluster("stop")


if __name__ == "__main__":
    main()
