#!/bin/bash
# 3-node Citus cluster on ports 6500 (coordinator), 6501, 6502. Run as root; servers run as postgres.
set -e
B=/work/citus-proto/pg18/bin
D=/work/citus-proto/data
N="nice -n 19 ionice -c3"
case "$1" in
init)
  for p in 6500 6501 6502; do
    su postgres -c "$N $B/initdb -D $D/n$p -U postgres --auth=trust -E UTF8 --no-locale >/dev/null"
    cat >> $D/n$p/postgresql.conf <<C
port = $p
listen_addresses = '127.0.0.1'
unix_socket_directories = '/tmp'
shared_preload_libraries = 'citus'
wal_level = logical
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 100
shared_buffers = 128MB
max_worker_processes = 32
max_replication_slots = 10
max_wal_senders = 10
citus.max_background_task_executors_per_node = 1
C
  done ;;
start)
  for p in 6500 6501 6502; do su postgres -c "$N $B/pg_ctl -D $D/n$p -l $D/n$p.log -w start >/dev/null"; done ;;
stop)
  for p in 6500 6501 6502; do su postgres -c "$B/pg_ctl -D $D/n$p -m fast -w stop >/dev/null" || true; done ;;
join)
  for p in 6500 6501 6502; do $B/psql -h 127.0.0.1 -p $p -U postgres -qc "CREATE EXTENSION citus"; done
  $B/psql -h 127.0.0.1 -p 6500 -U postgres -q <<S
SELECT citus_set_coordinator_host('127.0.0.1', 6500);
SELECT citus_add_node('127.0.0.1', 6501);
SELECT citus_add_node('127.0.0.1', 6502);
S
  ;;
esac
