#!/usr/bin/env bash
# lockext in real deployments: the client examples in four languages, PgBouncer in
# transaction pooling mode, a stored procedure. One entry point for CI:
#
#   bash tests/deploy/run.sh
#
# Needs lockext installed into the system PostgreSQL 15 (make install) and runs as root (it
# runs PostgreSQL and PgBouncer as the postgres OS user). Installs what it needs, each only
# when missing: Debian's pgbouncer, golang-go and golang-github-jackc-pgx-v4-dev, psycopg 3
# (PyPI, or Debian's python3-psycopg), pg for Node.js (npm, from examples/node/package-lock.json).
#
# It starts a scratch cluster (scripts/cluster.sh, port $LOCKEXT_DEPLOY_PORT, default 5699,
# files in /tmp/lockext-deploy) and a PgBouncer in front of it (port
# $LOCKEXT_DEPLOY_BOUNCER_PORT, default 6699, pool_mode = transaction), then runs:
#   - each example (Python, Node.js, Go, Rust) directly and through PgBouncer;
#   - tests/deploy/node/tokens.test.js: fencing tokens kept as JavaScript Numbers stay exact;
#   - the stored procedure test directly and through PgBouncer;
#   - the PgBouncer tests (tests/deploy/rust/tests/pgbouncer.rs: the fault suite's contention
#     scenario through a pool, and session advisory locks breaking there), which start their
#     own cluster and PgBouncer;
#   - the Patroni failover test (tests/deploy/patroni/run.sh, about 90 s; installs Debian's
#     patroni and etcd-server), unless LOCKEXT_DEPLOY_PATRONI=0.
# The last line is `N passed, N failed`; the exit status is non-zero on any failure.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/tests/deploy
PORT=${LOCKEXT_DEPLOY_PORT:-5699}
BOUNCER_PORT=${LOCKEXT_DEPLOY_BOUNCER_PORT:-6699}
HOME_DIR=${LOCKEXT_DEPLOY_HOME:-/tmp/lockext-deploy}
BOUNCER_DIR=$HOME_DIR/pgbouncer
LOGS=$HOME_DIR/logs
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HERE/target}
DIRECT_URL="postgresql://postgres@127.0.0.1:$PORT/postgres"
POOLED_URL="postgresql://postgres@127.0.0.1:$BOUNCER_PORT/postgres"
PY=${PYTHON:-python3}
STARTED=$(date +%s)

passed=0
failed=0
failures=()

say() { printf '\n== %s\n' "$*"; }

# run NAME COMMAND...: runs one test, output to the terminal and to $LOGS/NAME.log.
run() {
    local name=$1
    shift
    say "$name"
    local t0=$SECONDS
    if "$@" 2>&1 | tee "$LOGS/$name.log"; [ "${PIPESTATUS[0]}" -eq 0 ]; then
        passed=$((passed + 1))
        echo "-- $name: passed ($((SECONDS - t0)) s)"
    else
        failed=$((failed + 1))
        failures+=("$name")
        echo "-- $name: FAILED ($((SECONDS - t0)) s), log in $LOGS/$name.log"
    fi
}

# A step that everything after it needs: on failure, count it and stop.
need() {
    local name=$1
    shift
    run "$name" "$@"
    if [ "${failures[*]:-}" != "" ] && [ "${failures[-1]}" = "$name" ]; then
        finish
    fi
}

finish() {
    cleanup
    say "summary"
    [ ${#failures[@]} -gt 0 ] && echo "failed: ${failures[*]}"
    echo "total $(($(date +%s) - STARTED)) s"
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit $?
}

# ---------------------------------------------------------------------------------------
# Installs (idempotent)
# ---------------------------------------------------------------------------------------

apt_updated=
apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ -z "$apt_updated" ]; then
        apt-get update -qq || return 1
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

install_python() {
    "$PY" -c 'import psycopg' 2>/dev/null && return 0
    "$PY" -m pip install -q 'psycopg[binary]' && return 0
    # A Debian python3 refuses pip (externally managed): use Debian's psycopg 3.
    apt_install python3-psycopg && PY=/usr/bin/python3 && "$PY" -c 'import psycopg'
}

install_node() {
    command -v node >/dev/null || apt_install nodejs npm || return 1
    command -v npm >/dev/null || apt_install npm || return 1
    [ -f "$ROOT/examples/node/node_modules/pg/package.json" ] && return 0
    (cd "$ROOT/examples/node" && npm ci --no-audit --no-fund --loglevel=error)
}

install_all() {
    apt_install pgbouncer golang-go golang-github-jackc-pgx-v4-dev || return 1
    if [ "${LOCKEXT_DEPLOY_PATRONI:-1}" != 0 ]; then
        apt_install patroni etcd-server || return 1
    fi
    install_python || return 1
    install_node || return 1
    command -v cargo >/dev/null || { echo "cargo is missing (scripts/bootstrap.sh installs it)"; return 1; }
    echo "python: $("$PY" -c 'import psycopg, sys; print(sys.executable, "psycopg", psycopg.__version__)')"
    echo "node: $(node --version), pg $(node -p 'require("'"$ROOT"'/examples/node/node_modules/pg/package.json").version')"
    echo "go: $(go version), $(pgbouncer --version | head -1)"
}

# ---------------------------------------------------------------------------------------
# Services
# ---------------------------------------------------------------------------------------

cluster() { LOCKEXT_PORT=$PORT LOCKEXT_HOME=$HOME_DIR bash "$ROOT/scripts/cluster.sh" "$@"; }

start_services() {
    cluster start || return 1
    mkdir -p "$BOUNCER_DIR"
    cat >"$BOUNCER_DIR/pgbouncer.ini" <<INI
[databases]
postgres = host=127.0.0.1 port=$PORT dbname=postgres pool_size=4
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $BOUNCER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $BOUNCER_DIR/userlist.txt
pool_mode = transaction
max_client_conn = 200
logfile = $BOUNCER_DIR/pgbouncer.log
pidfile = $BOUNCER_DIR/pgbouncer.pid
INI
    echo '"postgres" ""' >"$BOUNCER_DIR/userlist.txt"
    chown -R postgres:postgres "$BOUNCER_DIR"
    runuser -u postgres -- pgbouncer -d "$BOUNCER_DIR/pgbouncer.ini" || return 1
    for _ in $(seq 1 100); do
        psql -X -q -h 127.0.0.1 -p "$BOUNCER_PORT" -U postgres -d postgres -c 'SELECT 1' >/dev/null 2>&1 && {
            echo "pgbouncer (transaction pooling, 4 server connections) on 127.0.0.1:$BOUNCER_PORT"
            return 0
        }
        sleep 0.1
    done
    echo "pgbouncer did not start:"
    cat "$BOUNCER_DIR/pgbouncer.log"
    return 1
}

cleanup() {
    if [ -f "$BOUNCER_DIR/pgbouncer.pid" ]; then
        kill "$(cat "$BOUNCER_DIR/pgbouncer.pid")" 2>/dev/null
        rm -f "$BOUNCER_DIR/pgbouncer.pid"
    fi
    [ -n "${LOCKEXT_DEPLOY_KEEP:-}" ] || cluster stop >/dev/null 2>&1
}
trap 'cleanup; exit 130' INT TERM

# ---------------------------------------------------------------------------------------
# Builds
# ---------------------------------------------------------------------------------------

GO_BIN=$HOME_DIR/bin/lockext-example-go
RUST_BIN=$CARGO_TARGET_DIR/release/lockext-example

build_go() {
    mkdir -p "$(dirname "$GO_BIN")"
    (cd "$ROOT/examples/go" && GO111MODULE=off GOPATH=/usr/share/gocode go build -o "$GO_BIN" .)
}

build_rust() {
    cargo build --release --quiet --manifest-path "$ROOT/examples/rust/Cargo.toml" &&
        cargo test --release --quiet --no-run --manifest-path "$HERE/rust/Cargo.toml"
}

# ---------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------

example() { # example LANG URL
    local lang=$1
    export LOCKEXT_URL=$2
    case $lang in
        python) "$PY" "$ROOT/examples/python/lockext_example.py" ;;
        node) node "$ROOT/examples/node/lockext_example.js" ;;
        go) "$GO_BIN" ;;
        rust) "$RUST_BIN" ;;
    esac
}

procedure() { LOCKEXT_URL=$1 "$PY" "$HERE/procedure/test_procedure.py"; }

# Fencing tokens kept as JavaScript Numbers (the seed article's `fenceToken: number`):
# they must be safe integers. Uses pg from examples/node (install_node).
node_tokens() { LOCKEXT_URL=$1 node --test "$HERE/node/tokens.test.js"; }

pgbouncer_tests() {
    cargo test --release --quiet --manifest-path "$HERE/rust/Cargo.toml" --test pgbouncer -- --test-threads=1 --nocapture
}

cluster destroy >/dev/null 2>&1 # a clean slate; the files of this run stay for inspection
mkdir -p "$LOGS"
need install install_all
"$PY" -c 'import psycopg' 2>/dev/null || PY=/usr/bin/python3 # install_python fell back to Debian's
need services start_services
need build-go build_go
need build-rust build_rust
for lang in python node go rust; do
    run "example-$lang" example "$lang" "$DIRECT_URL"
    run "example-$lang-pgbouncer" example "$lang" "$POOLED_URL"
done
run node-tokens node_tokens "$DIRECT_URL"
run procedure procedure "$DIRECT_URL"
run procedure-pgbouncer procedure "$POOLED_URL"
run pgbouncer pgbouncer_tests
if [ "${LOCKEXT_DEPLOY_PATRONI:-1}" != 0 ]; then
    run patroni bash "$HERE/patroni/run.sh"
fi
finish
