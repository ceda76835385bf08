#!/usr/bin/env bash
# One statement that renews (or re-acquires) many leases, in a database whose lease table
# was vacuumed while it was empty: how long the first such statement takes.
#
#   bash bench/first_statement.sh [N]    N leases (default 10000); ~1 min with the fix
#
# Why: VACUUM of an empty lockext.locks records reltuples = 0 and keeps its pages
# (vacuum_truncate = false), and until the next ANALYZE the planner estimates 0 rows
# however many leases are there since. 0.3.0's renew, release, extend and take-over
# statements joined the row to change to a subquery that found it, and with that estimate
# the join read every lease, once per call: N renewals in one statement cost N^2 (10 000:
# about two minutes). From 0.4.0 on the row is also named by its key, an index condition
# whatever the statistics say. The reaper's clearing and autovacuum make this state common:
# a database whose leases all expired, then a burst of new ones.
#
# Prints, for N leases: the time of one `SELECT count(lock_renew(...)) FROM
# generate_series(1, N)` in a fresh session, twice (the second after the first), and of one
# statement in which the same owner acquires its N lock ids again (lock_acquire extends its
# own lease), with pg_class's reltuples for lockext.locks; then, in a second database whose
# lease table was vacuumed empty at one page, one statement that acquires N new lock ids
# (not fixed, below).
# STATEMENT_TIMEOUT (default 300s) bounds each statement; one that hits it says so.
# The cluster is scripts/cluster.sh's (lockext preloaded) on FS_PORT (default 5598), in
# FS_HOME (/tmp/lockext-first-statement), BENCH_PG_BIN's PostgreSQL; destroyed at the end.
# autovacuum is off for the lease table, so that nothing refreshes its statistics mid-run.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
PG_BIN=${BENCH_PG_BIN:-/usr/lib/postgresql/15/bin}
PORT=${FS_PORT:-5598}
HOME_DIR=${FS_HOME:-/tmp/lockext-first-statement}
TIMEOUT=${STATEMENT_TIMEOUT:-300s}
export PG_BIN LOCKEXT_PORT=$PORT LOCKEXT_HOME=$HOME_DIR
cluster() { bash scripts/cluster.sh "$@" >/dev/null; }
trap 'cluster destroy || true' EXIT
q() { "$PG_BIN/psql" -X -qAt -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d fs "$@"; }
cluster destroy || true
cluster start
"$PG_BIN/psql" -X -qAt -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE fs" >/dev/null
q -c "CREATE EXTENSION lockext" -c "ALTER TABLE lockext.locks SET (autovacuum_enabled = off)"
# The state the reaper and autovacuum leave: a lease table vacuumed while it was empty.
q -c "SELECT count(lockext.lock_acquire('warm' || g, 'o', '1 minute')) FROM generate_series(1, 10) g" \
  -c "SELECT count(lockext.lock_release('warm' || g, 'o')) FROM generate_series(1, 10) g" \
  -c "VACUUM lockext.locks" >/dev/null
# N leases, one autocommit acquire each (a plain burst of clients).
seq 1 "$N" | sed "s/.*/SELECT lockext.lock_acquire('k&', 'o', '1 hour');/" >"$HOME_DIR/acquire.sql"
start=$(date +%s.%N)
q -f "$HOME_DIR/acquire.sql" >/dev/null
echo "acquire $N leases, one statement each: $(echo "$(date +%s.%N) - $start" | bc) s"
echo "lockext.locks reltuples (planner's count): $(q -c "SELECT reltuples FROM pg_class WHERE oid = 'lockext.locks'::regclass")"
timed() {
    local what=$1 sql=$2 out
    start=$(date +%s.%N)
    if out=$(q -c "SET statement_timeout = '$TIMEOUT'" -c "$sql" 2>&1); then
        echo "$what: $(echo "$(date +%s.%N) - $start" | bc) s ($out)"
    else
        echo "$what: timeout or error after $(echo "$(date +%s.%N) - $start" | bc) s: $out"
    fi
}
timed "renew $N leases in one statement, first" \
    "SELECT count(lockext.lock_renew('k' || g, 'o', '1 hour')) FROM generate_series(1, $N) g"
timed "renew $N leases in one statement, again" \
    "SELECT count(lockext.lock_renew('k' || g, 'o', '1 hour')) FROM generate_series(1, $N) g"
timed "re-acquire $N lock ids (same owner) in one statement" \
    "SELECT count(lockext.lock_acquire('k' || g, 'o', '1 hour')) FROM generate_series(1, $N) g"
# Not fixed: a statement that grants N new lock ids (an administrator's bulk load) in a
# database whose lease table is a page that the statistics say holds 0 rows (vacuumed
# empty while small). The free insert's checks (sql/run/exclusive/insert_free.sql: NOT
# EXISTS (... WHERE lock_id = $1)) are planned when the statement starts, and there a
# sequential scan of one page is the cheaper plan; it is kept for the whole statement as
# the table grows: N^2 again. (With a big table vacuumed empty, the same statement is fast.)
"$PG_BIN/psql" -X -qAt -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE fs2" >/dev/null
q2() { "$PG_BIN/psql" -X -qAt -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d fs2 "$@"; }
q2 -c "CREATE EXTENSION lockext" -c "ALTER TABLE lockext.locks SET (autovacuum_enabled = off)" \
   -c "SELECT count(lockext.lock_acquire('warm' || g, 'o', '1 minute')) FROM generate_series(1, 10) g" \
   -c "SELECT count(lockext.lock_release('warm' || g, 'o')) FROM generate_series(1, 10) g" \
   -c "VACUUM lockext.locks" >/dev/null
start=$(date +%s.%N)
if out=$(q2 -c "SET statement_timeout = '$TIMEOUT'" \
        -c "SELECT count(lockext.lock_acquire('n' || g, 'o', '1 hour')) FROM generate_series(1, $N) g" 2>&1); then
    echo "acquire $N new lock ids in one statement, table vacuumed empty at one page: $(echo "$(date +%s.%N) - $start" | bc) s ($out)"
else
    echo "acquire $N new lock ids in one statement, table vacuumed empty at one page: timeout or error after $(echo "$(date +%s.%N) - $start" | bc) s: $out"
fi
