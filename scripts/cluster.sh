#!/usr/bin/env bash
# A scratch PostgreSQL cluster with lockext preloaded, owned by the postgres OS user,
# listening on loopback only. PostgreSQL refuses to run as root, hence runuser.
#
#   scripts/cluster.sh start      initdb if needed, start, CREATE EXTENSION lockext
#   scripts/cluster.sh stop       stop it
#   scripts/cluster.sh restart    stop, then start
#   scripts/cluster.sh psql ...   psql on it (arguments go to psql)
#   scripts/cluster.sh shell      psql when there is a terminal; else run the demonstration
#   scripts/cluster.sh destroy    stop it and delete its files
#
# LOCKEXT_PORT (default 5499) and LOCKEXT_HOME (default /tmp/lockext) choose where; PG_BIN
# (default the system PostgreSQL 15) which server, e.g. 18 (/opt/lockext-postgresql/18/bin)
# or a relocated copy with its own lockext.
set -euo pipefail

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PORT=${LOCKEXT_PORT:-5499}
HOME_DIR=${LOCKEXT_HOME:-/tmp/lockext}
DATA=$HOME_DIR/data
LOG=$HOME_DIR/postgres.log
HERE=$(cd "$(dirname "$0")" && pwd)

as_postgres() { runuser -u postgres -- "$@"; }
psql_() { "$PG_BIN/psql" -X -h 127.0.0.1 -p "$PORT" -U postgres -v ON_ERROR_STOP=1 "$@"; }

init() {
    if [ -f "$DATA/PG_VERSION" ]; then
        local made server
        made=$(cat "$DATA/PG_VERSION")
        server=$("$PG_BIN/postgres" --version | sed -n 's/^postgres (PostgreSQL) \([0-9]*\).*/\1/p')
        if [ "$made" != "$server" ]; then
            echo "lockext: the cluster in $HOME_DIR was made by PostgreSQL $made, and $PG_BIN is $server:" \
                "choose another LOCKEXT_HOME, or destroy this one (scripts/cluster.sh destroy)" >&2
            exit 1
        fi
        # A cluster made by an older version of this script narrowed the reaper to database
        # postgres: lockext.database is left at its default ('*': every database with
        # lockext), as README's quick start describes.
        as_postgres sed -i "/^lockext.database = 'postgres'\$/d" "$DATA/postgresql.conf"
        return
    fi
    mkdir -p "$HOME_DIR"
    chown postgres:postgres "$HOME_DIR"
    as_postgres "$PG_BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 \
        --locale=C.UTF-8 >/dev/null
    cat >>"$DATA/postgresql.conf" <<CONF

# lockext scratch cluster
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$HOME_DIR'
max_connections = 200
shared_preload_libraries = 'lockext'
lockext.reap_interval = '1s'
log_line_prefix = '%m [%p] %b '
CONF
}

running() { as_postgres "$PG_BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

start() {
    init
    if ! running; then
        # The port asked for now, whatever the cluster was made with.
        as_postgres "$PG_BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 -o "-p $PORT" start >/dev/null
    fi
    # A cluster made by an older build gets the extension updated to this build's version.
    local out
    if ! out=$(psql_ -q -d postgres -c "CREATE EXTENSION IF NOT EXISTS lockext" \
                     -c "ALTER EXTENSION lockext UPDATE" 2>&1); then
        echo "$out" >&2
        echo "lockext: the cluster in $HOME_DIR is not answering on port $PORT (running on another? log: $LOG)" >&2
        exit 1
    fi
    echo "$out" | grep -v NOTICE || true
    echo "lockext is running: psql -h 127.0.0.1 -p $PORT -U postgres postgres  (log: $LOG)"
}

stop() {
    if [ -f "$DATA/PG_VERSION" ] && running; then
        as_postgres "$PG_BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    restart) stop; start ;;
    psql) shift; psql_ -d postgres "$@" ;;
    shell)
        if [ -t 0 ] && [ -t 1 ]; then
            psql_ -d postgres
        else
            psql_ -d postgres -f "$HERE/demo.sql"
        fi ;;
    destroy) stop; rm -rf "$HOME_DIR" ;;
    *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
