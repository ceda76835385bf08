#!/usr/bin/env bash
# Two builds of lockext.so, side by side on one scratch cluster: the library is swapped (and
# the server restarted) between runs, in rounds, so that the machine's drift hits both.
#   bash bench/ab.sh A.so B.so [rounds]     (each .so from `cargo pgrx package`; AB_CLIENTS="1 16")
# Prints cycles/s of bench/pgbench/cycle_lockext.sql (AB_SCRIPT=shared_lockext: another script)
# per build, mode and client count, and
# leaves the installed library as it found it. For a CPU profile of one build, see
# docs/profile-2026-12-01.md.
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1 B=$2 ROUNDS=${3:-3}
LIB=$(/usr/lib/postgresql/15/bin/pg_config --pkglibdir)/lockext.so
SAVED=$(mktemp)
cp "$LIB" "$SAVED"
export LOCKEXT_PORT=5496 LOCKEXT_HOME=/tmp/lockext-ab
P="/usr/lib/postgresql/15/bin/psql -X -qAt -h 127.0.0.1 -p $LOCKEXT_PORT -U postgres"
PGB=/usr/lib/postgresql/15/bin/pgbench
restore() { install -m 755 "$SAVED" "$LIB"; rm -f "$SAVED"; bash scripts/cluster.sh stop >/dev/null 2>&1 || true; }
trap restore EXIT
bash scripts/cluster.sh destroy >/dev/null 2>&1 || true
bash scripts/cluster.sh start >/dev/null
$P -c "CREATE EXTENSION IF NOT EXISTS lockext" >/dev/null
$P -f bench/setup.sql >/dev/null 2>&1
for round in $(seq "$ROUNDS"); do
  for build in "$A" "$B"; do
    install -m 755 "$build" "$LIB"
    bash scripts/cluster.sh restart >/dev/null
    for mode in grant epoch; do
      opts=""
      [ "$mode" = epoch ] && opts="-c lockext.durability=epoch -c synchronous_commit=off"
      for c in ${AB_CLIENTS:-1 16}; do
        tps=$(PGOPTIONS="$opts" $PGB -n -M prepared -c "$c" -j 2 -T 8 -D keys=100000 \
                -h 127.0.0.1 -p "$LOCKEXT_PORT" -U postgres -f "bench/pgbench/${AB_SCRIPT:-cycle_lockext}.sql" postgres \
              2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
        echo "round $round  $(basename "$build")  $mode  $c clients  $tps cycles/s"
      done
    done
  done
done
