#!/usr/bin/env bash
# How long a new connection's first lock_acquire takes, for two builds of lockext.so side by
# side: in a database of a million leases and in an empty one.
#
#   bash bench/first_grant.sh A.so B.so [rounds]   (each .so from `cargo pgrx package`)
#
# Why: before its first grant in an installation a backend adopts the database's token
# evidence (docs/tokens.md, "Adoption"), the highest token of every lease table, by
# sequential scan; since 0.4.0 the server records which installations it adopted
# (src/adopted.rs), so a connection made while nothing changed reads nothing. A client that
# connects per request pays this on every request.
#
# Each round installs each build in turn (install(1): a new file, never rewritten in place)
# into BENCH_PG_BIN's PostgreSQL (default the system 15), restarts the cluster, and makes 15
# new connections per database, each timing its first lock_acquire (psql's \timing, so a
# round trip included). Prints the first connection's time (it reads: the server's first
# after its start) and the median of the other 14. The cluster is scripts/cluster.sh's on
# FG_PORT (default 5597) in FG_HOME (/tmp/lockext-first-grant), destroyed at the end, and the
# installed library is put back as it was.
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1 B=$2 ROUNDS=${3:-2}
BIN=${BENCH_PG_BIN:-/usr/lib/postgresql/15/bin}
LIB=$("$BIN/pg_config" --pkglibdir)/lockext.so
SAVED=$(mktemp)
cp "$LIB" "$SAVED"
export LOCKEXT_PORT=${FG_PORT:-5597} LOCKEXT_HOME=${FG_HOME:-/tmp/lockext-first-grant} PG_BIN=$BIN
P="$BIN/psql -X -qAt -h 127.0.0.1 -p $LOCKEXT_PORT -U postgres"
restore() { install -m 755 "$SAVED" "$LIB"; rm -f "$SAVED"; bash scripts/cluster.sh destroy >/dev/null 2>&1 || true; }
trap restore EXIT
bash scripts/cluster.sh destroy >/dev/null 2>&1 || true
bash scripts/cluster.sh start >/dev/null
$P -c "ALTER SYSTEM SET lockext.database = ''" -c "SELECT pg_reload_conf()" >/dev/null
$P -c "CREATE EXTENSION IF NOT EXISTS lockext" >/dev/null
$P -c "INSERT INTO lockext.locks (lock_id, owner, fence_token, holder_role, acquired_at, expires_at)
       SELECT 'fill-' || g, 'o', g, 10, now(), now() + interval '1 day'
         FROM generate_series(1, 1000000) g" >/dev/null
$P -c "CREATE DATABASE empty" >/dev/null
$P -d empty -c "CREATE EXTENSION lockext" >/dev/null
for round in $(seq "$ROUNDS"); do
  for build in "$A" "$B"; do
    install -m 755 "$build" "$LIB"
    bash scripts/cluster.sh restart >/dev/null
    for db in postgres empty; do
      times=()
      for i in $(seq 15); do
        t=$(printf '\\timing on\nSELECT (lockext.lock_acquire(%s, %s, %s)).fence_token > 0;\n' \
              "'first-grant-' || pg_backend_pid() || '-$round-$i'" "'o'" "interval '1 minute'" \
            | $P -d "$db" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p')
        times+=("$t")
      done
      leases=$([ "$db" = postgres ] && echo "1 000 000 leases" || echo "no lease")
      echo "round $round  $(basename "$build")  $leases: first ${times[0]} ms, median of the next 14 $(printf '%s\n' "${times[@]:1}" | sort -n | sed -n '7p') ms"
    done
  done
done
