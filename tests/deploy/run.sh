#!/usr/bin/env bash
# lockext in real deployments: the client libraries and the client examples in four
# languages, PgBouncer in transaction pooling mode, a stored procedure. One entry point for CI:
#
#   bash tests/deploy/run.sh
#
# Needs lockext installed into the system PostgreSQL 15 (make install), or into the copy
# of PostgreSQL that $PG_BIN names (its bin directory, as for scripts/cluster.sh), and runs
# as root (it runs PostgreSQL and PgBouncer as the postgres OS user). Installs what it
# needs, each only when missing: Debian's pgbouncer, golang-go and
# golang-github-jackc-pgx-v4-dev, psycopg 3 (PyPI, or Debian's python3-psycopg), pg for
# Node.js (npm, from examples/node/package-lock.json); and each run, the client libraries
# as a user would: clients/python with pip into a virtualenv, clients/node with npm into a
# scratch application (both in $LOCKEXT_DEPLOY_HOME).
#
# It starts a scratch cluster (scripts/cluster.sh, port $LOCKEXT_DEPLOY_PORT, default 5699,
# files in $LOCKEXT_DEPLOY_HOME, default /tmp/lockext-deploy) and a PgBouncer in front of
# it (port $LOCKEXT_DEPLOY_BOUNCER_PORT, default 6699, pool_mode = transaction), then runs:
#   - the client libraries' tests (clients/python/tests, clients/node/test) directly and
#     through PgBouncer;
#   - tests/deploy/scratch.sh: `make run` and `make stop` (the scratch cluster's reaper in a
#     second database, README's quick start step 4), on a cluster of its own (port
#     $LOCKEXT_DEPLOY_PORT - 1);
#   - each example (Python, Node.js, Go, Rust) directly and through PgBouncer;
#   - the leader election example (examples/election: three Python processes, the leader
#     killed with SIGKILL, a follower taking over) directly and through PgBouncer;
#   - tests/deploy/node/tokens.test.js: fencing tokens kept as JavaScript Numbers stay exact;
#   - the stored procedure test directly and through PgBouncer;
#   - the PgBouncer tests (tests/deploy/rust/tests/pgbouncer.rs: the fault suite's contention
#     scenario through a pool, and session advisory locks breaking there), which start their
#     own cluster and PgBouncer;
#   - the Patroni failover test (tests/deploy/patroni/run.sh, about 90 s; installs Debian's
#     patroni and etcd-server), unless LOCKEXT_DEPLOY_PATRONI=0.
# LOCKEXT_DEPLOY_ONLY="client- example-python" runs only the steps whose names start with
# one of those words (the installs and services always run), e.g. to try one part.
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
VENV=$HOME_DIR/venv # clients/python installed, for its tests and the Python example
NODE_APP=$HOME_DIR/node-app # clients/node installed, for its tests
PSQL=${PG_BIN:+$PG_BIN/}psql
STARTED=$(date +%s)

passed=0
failed=0
failures=()

say() { printf '\n== %s\n' "$*"; }

wanted() {
    [ -z "${LOCKEXT_DEPLOY_ONLY:-}" ] && return 0
    local w
    for w in install services $LOCKEXT_DEPLOY_ONLY; do
        case $1 in "$w"*) return 0 ;; esac
    done
    return 1
}

# run NAME COMMAND...: runs one test, output to the terminal and to $LOGS/NAME.log.
run() {
    local name=$1
    shift
    wanted "$name" || return 0
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
    [ -f "$ROOT/examples/node/node_modules/pg/package.json" ] &&
        [ -f "$ROOT/examples/node/node_modules/lockext/package.json" ] && return 0
    (cd "$ROOT/examples/node" && npm ci --no-audit --no-fund --loglevel=error)
}

# The client libraries, installed from ./clients the way their READMEs say, fresh each run
# ($HOME_DIR starts empty). The virtualenv sees the system's packages, so psycopg comes
# from there when the base Python has it (Debian's python3-psycopg), else from PyPI.
install_clients() {
    "$PY" -m venv --system-site-packages "$VENV" 2>/dev/null ||
        { apt_install python3-venv && rm -rf "$VENV" && "$PY" -m venv --system-site-packages "$VENV"; } || return 1
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$ROOT/clients/python" || return 1
    mkdir -p "$NODE_APP"
    echo '{ "name": "lockext-deploy-app", "private": true }' >"$NODE_APP/package.json"
    # --install-links: a copy of the package, as from a registry (a link would test the
    # source folder); npm installs its peer dependency pg beside it.
    (cd "$NODE_APP" && npm install --install-links --no-audit --no-fund --loglevel=error "$ROOT/clients/node") || return 1
    echo "clients: $("$VENV/bin/python" -c 'import lockext, psycopg; print("python lockext", lockext.__version__, "psycopg", psycopg.__version__)'), node lockext $(node -p 'require("'"$NODE_APP"'/node_modules/lockext/package.json").version') pg $(node -p 'require("'"$NODE_APP"'/node_modules/pg/package.json").version')"
}

install_all() {
    apt_install pgbouncer golang-go golang-github-jackc-pgx-v4-dev || return 1
    if [ "${LOCKEXT_DEPLOY_PATRONI:-1}" != 0 ]; then
        apt_install patroni etcd-server || return 1
    fi
    install_python || return 1
    install_node || return 1
    install_clients || return 1
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
; Hand out idle server connections in turn, not the last used one: a client's next
; transaction then lands on another server connection whenever several are open, so a
; client relying on session state (a named prepared statement) fails here, not in production.
server_round_robin = 1
max_client_conn = 200
logfile = $BOUNCER_DIR/pgbouncer.log
pidfile = $BOUNCER_DIR/pgbouncer.pid
INI
    echo '"postgres" ""' >"$BOUNCER_DIR/userlist.txt"
    chown -R postgres:postgres "$BOUNCER_DIR"
    runuser -u postgres -- pgbouncer -d "$BOUNCER_DIR/pgbouncer.ini" || return 1
    for _ in $(seq 1 100); do
        "$PSQL" -X -q -h 127.0.0.1 -p "$BOUNCER_PORT" -U postgres -d postgres -c 'SELECT 1' >/dev/null 2>&1 && {
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
        python) "$VENV/bin/python" "$ROOT/examples/python/lockext_example.py" ;;
        election) "$VENV/bin/python" "$ROOT/examples/election/election.py" ;;
        node) node "$ROOT/examples/node/lockext_example.js" ;;
        go) "$GO_BIN" ;;
        rust) "$RUST_BIN" ;;
    esac
}

# The client libraries' tests: the library connects to $1, the tests reach the server
# directly for what a pooler hides (a backend to terminate, a second database).
client_python() {
    LOCKEXT_URL=$1 LOCKEXT_DIRECT_URL=$DIRECT_URL "$VENV/bin/python" -m unittest discover -v -s "$ROOT/clients/python/tests"
}
client_node() {
    LOCKEXT_URL=$1 LOCKEXT_DIRECT_URL=$DIRECT_URL LOCKEXT_NODE_APP=$NODE_APP node --test "$ROOT/clients/node/test/"
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
for lang in python node; do
    run "client-$lang" "client_$lang" "$DIRECT_URL"
    run "client-$lang-pgbouncer" "client_$lang" "$POOLED_URL"
done
for lang in python election node go rust; do
    run "example-$lang" example "$lang" "$DIRECT_URL"
    run "example-$lang-pgbouncer" example "$lang" "$POOLED_URL"
done
run node-tokens node_tokens "$DIRECT_URL"
run scratch env LOCKEXT_SCRATCH_PORT=$((PORT - 1)) LOCKEXT_SCRATCH_HOME="$HOME_DIR/scratch" bash "$HERE/scratch.sh"
run procedure procedure "$DIRECT_URL"
run procedure-pgbouncer procedure "$POOLED_URL"
run pgbouncer pgbouncer_tests
if [ "${LOCKEXT_DEPLOY_PATRONI:-1}" != 0 ]; then
    run patroni bash "$HERE/patroni/run.sh"
fi
finish
