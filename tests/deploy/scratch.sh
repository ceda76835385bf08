#!/usr/bin/env bash
# The scratch cluster and the quick start as README describes them, through the Makefile:
#   - `make run` starts the cluster and remembers where; `make stop`, told nothing, stops
#     that one (not the default /tmp/lockext);
#   - its reaper serves every database that has lockext (lockext.database left at its
#     default), a second database too;
#   - quick start step 4, read from README.md, runs as written while step 2's lease on
#     job:7 is still held: the only errors are the two it shows (22004, then 55L01).
# Uses the lockext installed in the PostgreSQL that $PG_BIN names (default the system's):
# `make run` is run without its install step (`-o install`). Port $LOCKEXT_SCRATCH_PORT
# (default 5698), files in $LOCKEXT_SCRATCH_HOME (default /tmp/lockext-scratch).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PORT=${LOCKEXT_SCRATCH_PORT:-5698}
HOME_DIR=${LOCKEXT_SCRATCH_HOME:-/tmp/lockext-scratch}
LAST_RUN=$HOME_DIR-last-run # not the default's: a user's own `make run` is left alone
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
export PG_BIN
psql_() { "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$PORT" -U postgres -v ON_ERROR_STOP=1 "$@"; }
running() { runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$HOME_DIR/data" status >/dev/null 2>&1; }
fail() { echo "FAILED: $*"; exit 1; }
cleanup() { LOCKEXT_HOME=$HOME_DIR LOCKEXT_PORT=$PORT bash "$ROOT/scripts/cluster.sh" destroy; rm -f "$LAST_RUN"; }
trap cleanup EXIT

cleanup
# As README says it: LOCKEXT_HOME from the environment, PORT on make's command line. No
# terminal: after starting the cluster it plays scripts/demo.sql.
LOCKEXT_HOME=$HOME_DIR make -s -C "$ROOT" -o install run PORT="$PORT" LAST_RUN="$LAST_RUN" </dev/null >/dev/null
running || fail "make run did not start the cluster in $HOME_DIR"
echo "make run: cluster in $HOME_DIR on port $PORT; remembered: $(tr '\n' ' ' <"$LAST_RUN")"

# The reaper serves a second database of the cluster.
[ "$(psql_ -d postgres -Atc 'SHOW lockext.database')" = '*' ] || fail "lockext.database is not '*'"
psql_ -d postgres -c 'CREATE DATABASE second'
psql_ -d second -c 'CREATE EXTENSION lockext' \
    -c "SELECT lockext.lock_acquire('reaped', 'o', '1 second')" >/dev/null
for _ in $(seq 1 300); do
    [ "$(psql_ -d second -Atc "SELECT count(*) FROM lockext.locks WHERE lock_id = 'reaped'")" = 0 ] && break
    sleep 0.1
done
[ "$(psql_ -d second -Atc "SELECT count(*) FROM lockext.locks WHERE lock_id = 'reaped'")" = 0 ] ||
    fail "the expired lease in database second was not reaped within 30 s"
echo "the reaper cleared an expired lease in database second"

# Quick start: step 2's grant is left held (its release not run), then step 4 as written.
readme=$ROOT/README.md
step2=$(sed -n '/^\*\*2\. A lock from psql\*\*/,/^\*\*3\./p' "$readme" | grep -F '\gset')
step4=$(sed -n '/^\*\*4\. A guarded table\.\*\*/,/^```$/p' "$readme" | sed -n '/^```sql$/,/^```$/p' | sed '1d;$d')
[ -n "$step2" ] && [ -n "$step4" ] || fail "README's quick start steps 2 and 4 not found"
psql_ -d postgres -c 'CREATE DATABASE quickstart'
psql_ -d quickstart -c 'CREATE EXTENSION lockext'
out=$(printf '%s\n\\set VERBOSITY verbose\n%s\n' "$step2" "$step4" |
    "$PG_BIN/psql" -X -h 127.0.0.1 -p "$PORT" -U postgres -d quickstart 2>&1) || true
echo "$out" | sed 's/^/    /'
errors=$(echo "$out" | sed -n 's/^\(psql:[^ ]* \)\{0,1\}ERROR: *\([0-9A-Z]\{5\}\):.*/\2/p' | tr '\n' ' ')
[ "$errors" = "22004 55L01 " ] || fail "step 4's errors were '$errors', not the two README shows (22004 55L01)"
[ "$(psql_ -d quickstart -Atc 'SELECT state FROM jobs WHERE id = 7')" = done ] || fail "job 7 is not done"
echo "quick start step 4 ran as README shows it, with step 2's lease still held"

# `make stop`, told neither LOCKEXT_HOME nor PORT, stops what `make run` started.
env -u LOCKEXT_HOME -u PORT -u LOCKEXT_PORT make -s -C "$ROOT" stop LAST_RUN="$LAST_RUN" >/dev/null
running && fail "make stop left the cluster of the last make run ($HOME_DIR) running"
echo "make stop stopped it"
