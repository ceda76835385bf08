#!/usr/bin/env bash
# What an observer (a lock_observe call waiting for the leader of a lock id to change) costs
# the server: the CPU time of N observing backends over a window, from /proc.
#
#   bash bench/observer.sh [N] [SECONDS]    N observers (default 20), window (default 20 s)
#
# Each observer is a psql session running lock_observe on a lock whose leader does not
# change (it knows the leader, so it waits out its timeout, looking every 50 ms). Their
# backends' user + system CPU (utime + stime of /proc/<pid>/stat, in clock ticks) is read
# at the start and the end of the window; the report is the share of one core per
# observer, and for all N. The cluster is scripts/cluster.sh's on OB_PORT (default 5596),
# in OB_HOME (/tmp/lockext-observer), BENCH_PG_BIN's PostgreSQL; destroyed at the end.
# Linux only (/proc). Run it on an otherwise idle machine: the number is CPU time, not
# wall time, but a busy machine makes latches and caches dearer.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20}
SECS=${2:-20}
PG_BIN=${BENCH_PG_BIN:-/usr/lib/postgresql/15/bin}
PORT=${OB_PORT:-5596}
HOME_DIR=${OB_HOME:-/tmp/lockext-observer}
export PG_BIN LOCKEXT_PORT=$PORT LOCKEXT_HOME=$HOME_DIR
cluster() { bash scripts/cluster.sh "$@" >/dev/null; }
q() { "$PG_BIN/psql" -X -qAt -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d postgres "$@"; }
OBSERVERS=()
finish() {
    for pid in "${OBSERVERS[@]}"; do kill "$pid" 2>/dev/null || true; done
    cluster destroy || true
}
trap finish EXIT
cluster destroy || true
cluster start
token=$(q -c "SELECT fence_token FROM lockext.lock_campaign('observed', 'leader', '1 hour', '\"here\"')")
timeout_s=$((SECS + 30))
for _ in $(seq "$N"); do
    q -c "SET application_name = 'observer'" \
      -c "SELECT changed FROM lockext.lock_observe('observed', $token, 1, '$timeout_s seconds')" >/dev/null 2>&1 &
    OBSERVERS+=($!)
done
until [ "$(q -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'observer' AND query LIKE '%lock_observe%'")" = "$N" ]; do
    sleep 0.2
done
sleep 1
pids=$(q -c "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE application_name = 'observer'")
ticks() { local t=0 p; for p in $pids; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
hz=$(getconf CLK_TCK)
t0=$(ticks); s0=$(date +%s.%N)
sleep "$SECS"
t1=$(ticks); s1=$(date +%s.%N)
still=$(q -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'observer' AND state = 'active'")
[ "$still" = "$N" ] || { echo "observer: only $still of $N observers still waiting" >&2; exit 1; }
echo "$N observers, $(printf '%.1f' "$(echo "$s1 - $s0" | bc)") s: CPU $(echo "scale=3; ($t1 - $t0) / $hz" | bc) s" \
     "= $(echo "scale=3; 100 * ($t1 - $t0) / $hz / ($s1 - $s0)" | bc) % of a core in all," \
     "$(echo "scale=3; 100 * ($t1 - $t0) / $hz / ($s1 - $s0) / $N" | bc) % per observer"
