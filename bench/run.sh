#!/usr/bin/env bash
# lockext benchmarks, side by side.
#   bash bench/run.sh            full run (make bench): ~15 min, writes bench/results/<date>.md
#   bash bench/run.sh --smoke    every script once, briefly (make bench-smoke, CI): < 1 min
#                                (and about 2 min more the first time, building bench/etcdbench)
# Environment: BENCH_SECONDS (per round, default 2), BENCH_ROUNDS (default 2), BENCH_CLIENTS (1,16,64),
# BENCH_PG_BIN (bin directory of the PostgreSQL 15, with lockext installed, that the run copies;
# default /usr/lib/postgresql/15/bin), BENCH_PG_PORT (5599), BENCH_REDIS_PORT (6399),
# BENCH_ETCD_PORT (2399 and the next), BENCH_HOME (/tmp/lockext-bench), BENCH_KEEP=1 (leave the
# scratch cluster's files), BENCH_SKIP_EPOCH=1, BENCH_ALLOW_DEBUG=1.
# Needs (scripts/bootstrap.sh): postgresql-15 (pgbench, psql), redis-server, etcd-server, cargo and
# protoc (bench/etcdbench), a C compiler,
# binutils (readelf), python3 with matplotlib (the charts). It expects lockext to be installed
# (make install).
set -euo pipefail
cd "$(dirname "$0")/.."
pg_bin=${BENCH_PG_BIN:-/usr/lib/postgresql/15/bin}
missing=()
for tool in "$pg_bin"/pg_config "$pg_bin"/initdb "$pg_bin"/pg_ctl "$pg_bin"/pgbench "$pg_bin"/psql \
        redis-server etcd cargo protoc readelf python3; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || command -v clang >/dev/null 2>&1 \
    || missing+=("a C compiler")
python3 -c 'import matplotlib' >/dev/null 2>&1 || missing+=("matplotlib (for $(command -v python3 || echo python3))")
if [ ${#missing[@]} -gt 0 ]; then
    echo "bench: missing ${missing[*]} (run scripts/bootstrap.sh)" >&2
    exit 1
fi
exec python3 bench/bench.py "$@"
