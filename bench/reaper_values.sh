#!/bin/bash
# What a reaper round costs in a database that keeps many values and has nothing to reap
# (issue 34, item 4): the execution time of each statement a round runs, for one or more
# source trees side by side, on one scratch cluster.
#
#   bash bench/reaper_values.sh [label=/path/to/source/tree ...]
#
# Each label=tree names a lockext source tree (default: this one, as "this"); its
# sql/run/reaper/*.sql are the statements measured, and its src/reaper.rs says whether an
# ordinary round runs reap_values.sql (every round) or only a sweep round does (a tree whose
# reap_batch runs it under `if sweep`). The cluster runs the lockext installed in
# RV_PG_BIN's PostgreSQL (default /usr/lib/postgresql/15/bin; a relocated tree's bin, as
# the cluster tests' LOCKEXT_PG_BIN): the trees compared must share its SQL objects (the
# statements call lockext.free_at and lockext.lease_expiry, and read its tables), which
# is so for statement changes alone. Port RV_PORT (default 5595), data in RV_HOME (default
# /tmp/lockext-reaper-values, destroyed at the end).
# The database holds RV_VALUES live grants with a value each (default 20000; lock_campaign,
# ttl 1 hour: nothing to reap), vacuumed and analyzed. Each statement of a round is
# PREPAREd with the parameters the reaper passes (limit lockext.reap_batch_size's 1000,
# notify off, now) and run RV_RUNS times (default 30) as EXPLAIN (ANALYZE, TIMING OFF)
# EXECUTE in a transaction rolled back; the median execution time of each is printed, and
# a round's total: the sum over the statements an ordinary round of that tree runs (a
# sweep round of a tree that sweeps adds reap_values). The fork and connection of a
# round's worker (about 13 ms of CPU, issue 34 item 1) are not in it.
# RV_STATS=empty: the tables are vacuumed empty before they are filled, never analyzed,
# and their statistics then say them empty (relpages 94, reltuples 0: what a VACUUM of an
# emptied table leaves, as tests/cluster/tests/reaper_bounded.rs sets them), to see the
# plans that such statistics choose (use a small RV_VALUES and RV_RUNS: a plan that
# compares every value with every lease takes seconds at 5 000).
set -euo pipefail

BIN=${RV_PG_BIN:-/usr/lib/postgresql/15/bin}
PORT=${RV_PORT:-5595}
HOME_DIR=${RV_HOME:-/tmp/lockext-reaper-values}
VALUES=${RV_VALUES:-20000}
RUNS=${RV_RUNS:-30}
HERE=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || set -- "this=$HERE"

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
psql=("$BIN/psql" -X -qAt -h 127.0.0.1 -p "$PORT" -U postgres -v ON_ERROR_STOP=1 postgres)

rm -rf "$HOME_DIR"; mkdir -p "$HOME_DIR"
[ "$(id -u)" != 0 ] || chown postgres:postgres "$HOME_DIR"
as_pg "$BIN/initdb" -D "$HOME_DIR/data" -U postgres --auth=trust >/dev/null
cat >>"$HOME_DIR/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$HOME_DIR'
shared_preload_libraries = 'lockext'
fsync = off
autovacuum = off
lockext.database = ''
lockext.role_values_size = '1GB'
EOF
as_pg "$BIN/pg_ctl" -D "$HOME_DIR/data" -l "$HOME_DIR/log" -w start >/dev/null
trap "as_pg '$BIN/pg_ctl' -D '$HOME_DIR/data' -m immediate stop >/dev/null 2>&1 || true; rm -rf '$HOME_DIR'" EXIT

"${psql[@]}" -c "CREATE EXTENSION lockext"
[ "${RV_STATS:-}" != empty ] ||
    "${psql[@]}" -c "VACUUM lockext.locks, lockext.shared_leases, lockext.keepalives, lockext.lease_values"
# One grant (and value) a transaction: a statement holds at most half of
# max_locks_per_transaction claims.
"${psql[@]}" -c "DO \$\$ BEGIN
    FOR i IN 1..$VALUES LOOP
        PERFORM lockext.lock_campaign('value-' || i, 'node-' || i, '1 hour',
                                      jsonb_build_object('addr', 'node-' || i || ':5432'));
        COMMIT;
    END LOOP;
END \$\$"
if [ "${RV_STATS:-}" != empty ]; then
    "${psql[@]}" -c "VACUUM ANALYZE lockext.locks, lockext.shared_leases, lockext.keepalives, lockext.lease_values"
else
    "${psql[@]}" -c "UPDATE pg_class SET relpages = 94, reltuples = 0 \
                      WHERE oid IN ('lockext.locks'::regclass, 'lockext.lease_values'::regclass)"
fi
stored=$("${psql[@]}" -c "SELECT count(*) FROM lockext.lease_values")
echo "values stored: $stored (live grants: $("${psql[@]}" -c "SELECT count(*) FROM lockext.locks"))"
echo

python3 - "$RUNS" "${psql[*]}" "$@" <<'PY'
import json, re, shlex, statistics, subprocess, sys

runs, psql, trees = int(sys.argv[1]), shlex.split(sys.argv[2]), sys.argv[3:]
# A round with nothing to reap, in reap_batch's order, then next_due; the parameters the
# reaper passes (limit, notify, now). purge_keepalives and end_locked_sessions run only
# when the step before found rows.
ROUND = [
    ("reap_locks", "int4, bool, timestamptz", "1000, false, clock_timestamp()"),
    ("reap_shared_leases", "int4, bool, timestamptz", "1000, false, clock_timestamp()"),
    ("end_keepalives", "int4, timestamptz", "1000, clock_timestamp()"),
    ("reap_attached_locks", "int4, bool, timestamptz", "1000, false, clock_timestamp()"),
    ("reap_attached_shared_leases", "int4, bool, timestamptz", "1000, false, clock_timestamp()"),
    ("lock_ended_keepalives", "int4", "1000"),
    ("reap_values", "int4", "1000"),
    ("lock_ended_sessions", "int4", "1000"),
    ("next_due", "timestamptz", "clock_timestamp()"),
]

def median_ms(text, types, args):
    script = [f"PREPARE s({types}) AS {text};"]
    for _ in range(runs):
        script += ["BEGIN;", f"EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) EXECUTE s({args});",
                   "ROLLBACK;"]
    out = subprocess.run(psql, input="\n".join(script), capture_output=True, text=True,
                         check=True).stdout
    times = [plan[0]["Execution Time"] for plan in
             (json.loads(chunk) for chunk in re.findall(r"^\[.*?^\]$", out, re.S | re.M))]
    assert len(times) == runs, out[:2000]
    return statistics.median(times)

rows, totals = [], []
for arg in trees:
    label, tree = arg.split("=", 1)
    reaper = open(f"{tree}/src/reaper.rs").read()
    sweeps_only = re.search(r"if sweep \{\s*let values = REAP_VALUES", reaper) is not None
    total = sweep_extra = 0.0
    for name, types, args in ROUND:
        text = open(f"{tree}/sql/run/reaper/{name}.sql").read()
        ms = median_ms(text, types, args)
        in_round = not (name == "reap_values" and sweeps_only)
        rows.append((label, name, ms, "every round" if in_round else "sweep rounds only"))
        if in_round:
            total += ms
        else:
            sweep_extra += ms
    totals.append((label, total, total + sweep_extra))

print(f"| tree | statement | median execution ({runs} runs) | run in |")
print("|---|---|---|---|")
for label, name, ms, when in rows:
    print(f"| {label} | {name} | {ms:.3f} ms | {when} |")
print()
print("| tree | ordinary round (sum of its statements) | sweep round |")
print("|---|---|---|")
for label, total, sweep in totals:
    print(f"| {label} | {total:.3f} ms | {sweep:.3f} ms |")
PY
