#!/usr/bin/env bash
# lockext in a two-node Patroni cluster through a failover, once with asynchronous
# replication and once with synchronous_mode (tests/deploy/rust/tests/patroni.rs):
#
#   bash tests/deploy/patroni/run.sh
#
# Needs lockext installed into the system PostgreSQL 15 (make install), or into the one
# whose bin directory LOCKEXT_PG_BIN names (make deploy-test PG=18), and root (Patroni
# and PostgreSQL run as the postgres OS user). Installs Debian's patroni and etcd-server
# when missing. Everything listens on free loopback ports; files go to /tmp/lockext-patroni
# (kept only when a scenario fails). About 90 s on 2 cores, plus the first build.
# The last line is `N passed, N failed`; the exit status is non-zero on any failure.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/tests/deploy/target}
LOG=${TMPDIR:-/tmp}/lockext-patroni-test.log

missing=()
for p in patroni etcd-server; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null || {
        echo "could not install ${missing[*]}"
        echo "0 passed, 1 failed"
        exit 1
    }
fi

cargo test --release --quiet --manifest-path "$ROOT/tests/deploy/rust/Cargo.toml" --test patroni \
    -- --test-threads=1 --nocapture 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
result=$(grep -E '^test result: ' "$LOG" | tail -1)
passed=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$result")
failed=$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$result")
passed=${passed:-0}
failed=${failed:-0}
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1 # the build or the harness failed
fi
echo "$passed passed, $failed failed"
[ "$status" -eq 0 ]
