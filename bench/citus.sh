#!/usr/bin/env bash
# lockext on a Citus cluster (docs/citus.md, docs/scale.md): grants per second through the
# coordinator with one worker and with two, straight to the workers, and lockext on one
# server without Citus, each measured the same way on this machine, in one run.
#   bash bench/citus.sh     about 2 minutes; prints a Markdown table
# Each point: pgbench, CITUS_BENCH_CLIENTS clients (default 8) for CITUS_BENCH_SECONDS (10), the
# cycle of bench/pgbench/cycle_lockext.sql (acquire a random lock id of 1 000, release it).
# Straight to the workers: each worker's pgbench uses only lock ids whose shard it holds
# (listed in a table of that worker's, bench.ids), and the others use the same lookup so
# that every point does the same statements. Nodes as the Citus tests run them: PostgreSQL
# 18 from /opt/lockext-postgresql/18 with Citus (`make citus`) and lockext (`make install
# PG=18`), on ports CITUS_BENCH_PORT (6700) and the next three, fsync on, default durability.
# On 2 cores every node, and pgbench, share the same cores: the ratios show the overhead of
# the hop and the routing, not what more machines give (docs/scale.md models that).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${CITUS_BENCH_PG_BIN:-/opt/lockext-postgresql/18/bin}
BASE=${CITUS_BENCH_PORT:-6700}
CLIENTS=${CITUS_BENCH_CLIENTS:-8}
SECONDS_=${CITUS_BENCH_SECONDS:-10}
HOME_=${CITUS_BENCH_HOME:-/tmp/lockext-citus-bench}
COORD=$BASE W1=$((BASE + 1)) W2=$((BASE + 2)) PLAIN=$((BASE + 3))
[ -f "$B/../lib/citus.so" ] || { echo "citus bench: no Citus in $B/.. (make citus)" >&2; exit 1; }

as_pg() { su postgres -c "$*"; }
sql() { "$B/psql" -h 127.0.0.1 -p "$1" -U postgres -qAtX -v ON_ERROR_STOP=1 -c "$2"; }
node() { # port, preload
    as_pg "$B/initdb -D $HOME_/n$1 -U postgres --auth=trust -E UTF8 --no-locale >/dev/null"
    cat >>"$HOME_/n$1/postgresql.conf" <<C
port = $1
listen_addresses = '127.0.0.1'
unix_socket_directories = '$HOME_'
shared_preload_libraries = '$2'
wal_level = logical
max_connections = 200
shared_buffers = 256MB
max_worker_processes = 32
max_replication_slots = 10
max_wal_senders = 10
C
    as_pg "$B/pg_ctl -D $HOME_/n$1 -l $HOME_/n$1.log -w start >/dev/null"
}
stop_all() {
    for p in $COORD $W1 $W2 $PLAIN; do
        [ -d "$HOME_/n$p" ] && as_pg "$B/pg_ctl -D $HOME_/n$p -m immediate -w stop >/dev/null 2>&1" || true
    done
}
trap 'stop_all; cp "$HOME_/pgbench.log" /tmp/citus-bench-pgbench.log 2>/dev/null || true' EXIT
stop_all
rm -rf "$HOME_"; mkdir -p "$HOME_"; chown postgres: "$HOME_"

for p in $COORD $W1 $W2; do node $p 'citus,lockext'; sql $p "CREATE EXTENSION citus"; done
node $PLAIN lockext
sql $PLAIN "CREATE EXTENSION lockext"
sql $COORD "SELECT citus_set_coordinator_host('127.0.0.1', $COORD)" >/dev/null
sql $COORD "SELECT citus_add_node('127.0.0.1', $W1)" >/dev/null
sql $COORD "CREATE EXTENSION lockext"
sql $COORD "CALL lockext.citus_distribute(32)" >/dev/null

# The lock ids each node's pgbench uses: 1 000 ids, all of them, or those of one worker.
ids() { # port, where (all | the port whose shards to keep)
    sql "$1" "SET citus.enable_ddl_propagation = off; CREATE SCHEMA IF NOT EXISTS bench;
              DROP TABLE IF EXISTS bench.ids; CREATE TABLE bench.ids (n int PRIMARY KEY, k int)"
    local list
    if [ "$2" = all ]; then
        list=$(seq 1 1000)
    else
        list=$(sql $COORD "SELECT i FROM generate_series(1, 4000) AS i
                            WHERE (SELECT nodeport FROM pg_dist_shard_placement
                                    WHERE shardid = get_shard_id_for_distribution_column('lockext.locks', 'lock:' || i)) = $2
                            LIMIT 1000")
    fi
    printf '%s\n' "$list" | awk '{print NR "\t" $0}' |
        "$B/psql" -h 127.0.0.1 -p "$1" -U postgres -qAtX -c "COPY bench.ids FROM STDIN"
    sql "$1" "SELECT count(*) FROM bench.ids"
}
cat >"$HOME_/cycle.sql" <<'S'
\set n random(1, :keys)
SELECT k FROM bench.ids WHERE n = :n \gset
SELECT coalesce(fence_token, 0) AS tok FROM lockext.lock_acquire('lock:' || :k, 'bench:' || :client_id, '30 seconds') \gset
\if :tok > 0
SELECT lockext.lock_release('lock:' || :k, 'bench:' || :client_id, :tok);
\endif
S
chown postgres: "$HOME_/cycle.sql"
# Cycles per second of pgbench on `port` (ids in bench.ids there: `keys` of them).
run() { # port keys
    "$B/pgbench" -h 127.0.0.1 -p "$1" -U postgres -n -f "$HOME_/cycle.sql" -D keys="$2" \
        -c "$CLIENTS" -j 2 -T "$SECONDS_" postgres 2>>"$HOME_/pgbench.log" |
        sed -n 's/^tps = \([0-9.]*\) .*/\1/p' | cut -d. -f1
}

row() { printf '| %s | %s |\n' "$1" "$2"; }
echo "| point ($CLIENTS clients, ${SECONDS_} s, PostgreSQL 18, $(nproc) cores) | cycles/s |"
echo "|---|---:|"
k=$(ids $PLAIN all); row "one server, no Citus" "$(run $PLAIN "$k")"
k=$(ids $COORD all); row "1 worker, through the coordinator" "$(run $COORD "$k")"
k=$(ids $W1 all); row "1 worker, straight to it" "$(run $W1 "$k")"
sql $COORD "SELECT citus_add_node('127.0.0.1', $W2)" >/dev/null
sql $COORD "SELECT rebalance_table_shards(shard_transfer_mode => 'force_logical')" >/dev/null
k=$(ids $COORD all); row "2 workers, through the coordinator" "$(run $COORD "$k")"
k1=$(ids $W1 $W1); k2=$(ids $W2 $W2)
run $W1 "$k1" >"$HOME_/w1.tps" & run $W2 "$k2" >"$HOME_/w2.tps"; wait
row "2 workers, straight to each (ids of its shards), sum" "$(( $(cat "$HOME_/w1.tps") + $(cat "$HOME_/w2.tps") ))"
