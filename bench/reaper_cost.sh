#!/bin/bash
# What the reaper costs with many databases (issue 34, item 1): the CPU of its launcher and
# of its rounds, with N idle databases and with N databases each clearing leases, for one
# or more builds side by side in one run.
#
#   bash bench/reaper_cost.sh [label=/path/to/postgresql/15/bin ...]
#
# Each label=bin names a PostgreSQL bin directory whose $libdir has the lockext to measure
# (a relocated tree, as the cluster tests' LOCKEXT_PG_BIN); default: the system one. For
# each, a scratch cluster (port REAPER_BENCH_PORT, default 5850, then +1 per build; data in
# /tmp/reaper-bench-<label>, destroyed at the end) with N databases (REAPER_BENCH_DBS,
# default 100) that have lockext, default reaper settings (reap_interval 1 s), autovacuum
# off (its workers would count in the postmaster's children), then two windows of
# REAPER_BENCH_WINDOW seconds (default 30):
#   idle:     no lease anywhere;
#   clearing: before the window, L leases (REAPER_BENCH_LEASES, default 10) in each
#             database, expiring one per second from 8 s after their grant, all inside
#             the window (with the default 30 s).
# CPU: the launcher's utime+stime (/proc/<pid>/stat) over the window, and the rounds'
# (exited children of the postmaster: its cutime+cstime; no client connects during the
# window, and the few statements that read reaper_status at both ends are counted too).
# Rounds: the postmaster's DEBUG1 lines "starting background worker process "lockext
# reaper ..."" over the window; leases reaped: reaper_status's reaped_total (a build whose
# reaper_status shows fewer databases undercounts: 0.3.0 shows 16 of them; the rows column
# says how many). Prints a Markdown table.
set -euo pipefail

N=${REAPER_BENCH_DBS:-100}
WINDOW=${REAPER_BENCH_WINDOW:-30}
LEASES=${REAPER_BENCH_LEASES:-10}
PORT=${REAPER_BENCH_PORT:-5850}
HZ=$(getconf CLK_TCK)
[ $# -gt 0 ] || set -- "system=/usr/lib/postgresql/15/bin"

as_pg() { runuser -u postgres -- "$@"; }

ticks() { # utime+stime, or cutime+cstime (fields 14,15 / 16,17) of a pid
    awk -v a="$2" -v b="$3" '{ sub(/^.*\) /, ""); print $(a-2) + $(b-2) }' "/proc/$1/stat"
}

run_build() {
    local label=$1 bin=$2 port=$3 home=/tmp/reaper-bench-$1
    local psql=("$bin/psql" -X -qAt -h 127.0.0.1 -p "$port" -U postgres -v ON_ERROR_STOP=1)
    rm -rf "$home"; mkdir -p "$home"; chown postgres:postgres "$home"
    as_pg "$bin/initdb" -D "$home/data" -U postgres --auth=trust >/dev/null
    cat >>"$home/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$home'
shared_preload_libraries = 'lockext'
autovacuum = off
max_connections = 200
fsync = off
log_min_messages = debug1
EOF
    as_pg "$bin/pg_ctl" -D "$home/data" -l "$home/log" -w start >/dev/null
    trap "as_pg '$bin/pg_ctl' -D '$home/data' -m immediate stop >/dev/null 2>&1 || true; rm -rf '$home'" RETURN
    "${psql[@]}" postgres -c "CREATE DATABASE rb0" >/dev/null
    "${psql[@]}" rb0 -c "CREATE EXTENSION lockext" >/dev/null
    for i in $(seq 1 $((N - 1))); do
        "${psql[@]}" postgres -c "CREATE DATABASE rb$i TEMPLATE rb0" >/dev/null
    done
    local pm launcher
    pm=$(head -1 "$home/data/postmaster.pid")
    rounds() {
        "${psql[@]}" rb0 -c "SELECT coalesce(sum(rounds), 0), coalesce(sum(reaped_total), 0), count(*) FROM lockext.reaper_status()"
    }
    # Every database's first round (or, for a build that shows fewer, a while).
    for _ in $(seq 1 120); do
        [ "$(rounds | cut -d'|' -f3)" -ge "$((N < 16 ? N : 16))" ] && break
        sleep 1
    done
    sleep 5
    launcher=$(pgrep -f "lockext launcher" -P "$pm" | head -1)
    measure() { # scenario
        local l0 c0 r0 l1 c1 r1 s0 s1
        l0=$(ticks "$launcher" 14 15); c0=$(ticks "$pm" 16 17); s0=$(rounds)
        r0=$(grep -c 'starting background worker process "lockext reaper' "$home/log" || true)
        sleep "$WINDOW"
        r1=$(grep -c 'starting background worker process "lockext reaper' "$home/log" || true)
        s1=$(rounds); l1=$(ticks "$launcher" 14 15); c1=$(ticks "$pm" 16 17)
        local reaped0 reaped1 rows
        reaped0=$(echo "$s0" | cut -d'|' -f2); reaped1=$(echo "$s1" | cut -d'|' -f2)
        rows=$(echo "$s1" | cut -d'|' -f3)
        awk -v label="$label" -v sc="$1" -v w="$WINDOW" -v hz="$HZ" -v n="$N" \
            -v l=$((l1 - l0)) -v c=$((c1 - c0)) -v r=$((r1 - r0)) \
            -v reaped=$((reaped1 - reaped0)) -v rows="$rows" 'BEGIN {
            cpu = (l + c) / hz
            printf "| %s | %s | %d | %d s | %d (%d rows) | %d | %.2f s | %.2f s | %.1f %% | %s |\n",
                label, sc, n, w, r, rows, reaped, l / hz, c / hz, 100 * cpu / w,
                (r > 0 ? sprintf("%.1f ms", 1000 * c / hz / r) : "-")
        }'
    }
    measure idle
    # Leases that expire one per second from 8 s after their grant on, in every database
    # (their clients gone before the window starts).
    for i in $(seq 0 $((N - 1))); do
        "${psql[@]}" "rb$i" -c "SELECT count(lockext.lock_acquire('k' || g, 'dead', make_interval(secs => 7 + g))) FROM generate_series(1, $LEASES) AS g" >/dev/null
    done
    sleep 1
    measure clearing
}

echo "| build | scenario | databases | window | rounds started (reaper_status rows) | leases reaped | launcher CPU | rounds' CPU | of a core | CPU per round |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for spec in "$@"; do
    run_build "${spec%%=*}" "${spec#*=}" "$PORT"
    PORT=$((PORT + 1))
done
