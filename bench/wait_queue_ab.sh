#!/usr/bin/env bash
# The wait queue's cost, two builds of lockext.so side by side (issue 34, item 3): one
# scratch cluster, the library swapped and the server restarted between runs, in rounds.
#   bash bench/wait_queue_ab.sh A.so B.so [rounds] ["max_connections values"]
# With one lease held and one session waiting for it (so that every acquire looks at the
# queue and every release's commit wakes through it), 16 pgbench clients run
# bench/pgbench/cycle_lockext.sql on random ids, then 16 clients all wait for one lock
# (each attempt waits in the queue, then releases): cycles/s and hand-offs/s per build.
# BENCH_PG_BIN (default Debian's) chooses the server; WQ_PORT (5598) and WQ_HOME
# (/tmp/lockext-wait-queue) its port and directory. Leaves the installed library as it was.
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1 B=$2 ROUNDS=${3:-3} MCS=${4:-"100 1100"}
BIN=${BENCH_PG_BIN:-/usr/lib/postgresql/15/bin}
LIB=$($BIN/pg_config --pkglibdir)/lockext.so
H=${WQ_HOME:-/tmp/lockext-wait-queue} PORT=${WQ_PORT:-5598}
D=$H/data
mkdir -p "$H"
SAVED=$H/saved.so
cp "$LIB" "$SAVED"
AS="runuser -u postgres --"
P="$BIN/psql -X -qAt -h 127.0.0.1 -p $PORT -U postgres"
restore() {
  $AS "$BIN/pg_ctl" -D "$D" -m immediate stop >/dev/null 2>&1 || true
  install -m 755 "$SAVED" "$LIB"
  rm -rf "$H"
}
trap restore EXIT
rm -rf "$D"
chown postgres:postgres "$H"
$AS "$BIN/initdb" -D "$D" -U postgres --auth=trust >/dev/null
cat >>"$D/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$H'
shared_preload_libraries = 'lockext'
lockext.durability = epoch
synchronous_commit = off
CONF
cat >"$H/contended.sql" <<'SQL'
SELECT coalesce(fence_token, 0) AS tok FROM lockext.lock_acquire('hot', 'bench:' || :client_id, '30 seconds', wait => '10 seconds') \gset
\if :tok > 0
SELECT lockext.lock_release('hot', 'bench:' || :client_id, :tok);
\endif
SQL
chmod 644 "$H/contended.sql"
created=0
for round in $(seq "$ROUNDS"); do
  for mc in $MCS; do
    for build in "$A" "$B"; do
      $AS "$BIN/pg_ctl" -D "$D" -m fast stop >/dev/null 2>&1 || true
      install -m 755 "$build" "$LIB"
      $AS "$BIN/pg_ctl" -D "$D" -l "$H/log" -o "-c max_connections=$mc" -w start >/dev/null
      if [ $created = 0 ]; then $P -c "CREATE EXTENSION lockext" >/dev/null; created=1; fi
      $P -c "SELECT lockext.lock_acquire('parked', 'holder', '1 hour')" >/dev/null
      ($P -c "SELECT lockext.lock_acquire('parked', 'waiter', '1 minute', wait => '1 hour')" >/dev/null 2>&1 &)
      until [ "$($P -c "SELECT count(*) FROM lockext.waiters")" = 1 ]; do sleep 0.1; done
      cyc=$($BIN/pgbench -n -M prepared -c 16 -j 2 -T 8 -D keys=100000 -h 127.0.0.1 -p "$PORT" -U postgres \
              -f bench/pgbench/cycle_lockext.sql postgres 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
      con=$($BIN/pgbench -n -M prepared -c 16 -j 2 -T 8 -h 127.0.0.1 -p "$PORT" -U postgres \
              -f "$H/contended.sql" postgres 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
      $P -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%wait => ''1 hour''%' AND pid <> pg_backend_pid()" >/dev/null
      $P -c "SELECT lockext.lock_release('parked', 'holder')" >/dev/null
      echo "round $round  max_connections=$mc  $(basename "$build")  cycle $cyc/s  hand-offs $con/s"
    done
  done
done
