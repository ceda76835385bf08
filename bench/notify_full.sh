#!/usr/bin/env bash
# The NOTIFY queue filled by a listener that never reads, for real (8 GB of notifications):
# does lock_release still commit with lockext.notify = on? On 0.3.0 it failed ("too many
# notifications in the NOTIFY queue") and left the lease held; from 0.4.0 on lockext skips
# its events from lockext.notify_queue_limit (half) on, so it must commit.
#
#   bash bench/notify_full.sh [PG_BIN]   (default: the system PostgreSQL 15, lockext installed)
#
# Not part of make test or make bench: it writes about 8 GB under /tmp and takes minutes.
# Prints one line per step and "release: committed" or "release: FAILED <error>".
set -euo pipefail
PG_BIN=${1:-/usr/lib/postgresql/15/bin}
PORT=${NOTIFY_FULL_PORT:-5590}
DIR=/tmp/lockext-notify-full
as_pg() { runuser -u postgres -- "$@"; }
rm -rf "$DIR"; mkdir -p "$DIR"; chown postgres "$DIR"
as_pg "$PG_BIN/initdb" -D "$DIR/data" -U postgres --auth=trust >/dev/null
cat >> "$DIR/data/postgresql.conf" <<CONF
port = $PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$DIR'
shared_preload_libraries = 'lockext'
lockext.notify = on
autovacuum = off
CONF
as_pg "$PG_BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w start >/dev/null
trap 'as_pg "$PG_BIN/pg_ctl" -D "$DIR/data" -m immediate stop >/dev/null 2>&1; rm -rf "$DIR"' EXIT
psql_() { "$PG_BIN/psql" -X -q -At -h 127.0.0.1 -p "$PORT" -U postgres "$@"; }
psql_ -c "CREATE EXTENSION IF NOT EXISTS lockext"
psql_ -c "SELECT lockext.lock_acquire('job', 'w', '1 hour')" >/dev/null
# The stuck listener: LISTEN, then a transaction left open for the whole run.
( printf 'LISTEN lockext;\nBEGIN;\nSELECT 1;\nSELECT pg_sleep(3600);\n' | psql_ >/dev/null 2>&1 ) &
sleep 2
echo "filling the queue until a notification fails (a listener reads nothing)"
for i in $(seq 1 200); do
    used=$(psql_ -c "SELECT round(pg_notification_queue_usage()::numeric, 3)")
    echo "queue used: $used"
    if ! err=$(psql_ -c "SELECT pg_notify('other', repeat('x', 7980) || g) FROM generate_series(1, 20000) g" 2>&1 >/dev/null); then echo "pg_notify: $err"; break; fi
done
echo "queue used: $(psql_ -c "SELECT pg_notification_queue_usage()")"
if out=$(psql_ -c "SELECT lockext.lock_release('job', 'w')" 2>&1); then
    echo "release: committed ($out); still held: $(psql_ -c "SELECT count(*) FROM lockext.locks")"
else
    echo "release: FAILED $out; still held: $(psql_ -c "SELECT count(*) FROM lockext.locks")"
fi
psql_ -c "SELECT name, value FROM lockext.stats WHERE name = 'events_skipped'" 2>/dev/null || true
