#!/usr/bin/env bash
# Keep-alives against one lock_renew per lease, side by side on one scratch cluster, in one run.
#   bash bench/keepalive.sh           ~2 min: prints the report, writes bench/results/keepalive-<date>.md
#   bash bench/keepalive.sh --smoke   ~15 s: every step at small sizes (not in make bench-smoke); the report is
#                                     printed only; numbers meaningless
# (1) A round renews 10 000 leases: one autocommit lock_renew each, one client, pgbench -M prepared
#     (pgbench/keepalive_lock_renew.sql), against one lock_keepalive_renew of a keep-alive with the
#     same number of attached leases (pgbench/keepalive_renew.sql). Per round: time, statements run
#     (pg_stat_statements with track = all, so lockext's own statements count too), their execution
#     time (top-level statements only: a nested statement's time is inside its caller's), rows
#     updated in lockext's tables, WAL records, bytes and fsyncs (pg_stat_wal). Rounds alternate
#     which side runs first.
# (2) lock_keepalive_renew's latency with 10, 1 000, 10 000 and 100 000 attached leases (pgbench
#     --log: every transaction's latency), in rounds of KA_SECONDS per point, and, for context, an
#     acquire-and-release cycle of a lock attached to a keep-alive and of one with a ttl of its own.
# Leases are attached as a client would take them, in transactions of at most 30 (a plain member is
# refused past max_locks_per_transaction / 2 = 32 in one transaction); the cluster keeps the default
# max_locks_per_transaction (64).
#
# The cluster is scripts/cluster.sh's (lockext preloaded), on its own port and directory, with
# pg_stat_statements preloaded too and lockext.reap_interval = 1h: nothing here expires, and a
# reaper round every second would add its statements to the counts. Destroyed at the end.
# Environment: BENCH_PG_BIN (bin directory of the PostgreSQL 15, with lockext installed, to run;
# default /usr/lib/postgresql/15/bin), KA_PORT (5597), KA_HOME (/tmp/lockext-keepalive),
# KA_SECONDS (one latency point, default 3), KA_ROUNDS (default 3), KA_KEEP=1 (keep the cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
SMOKE=0
case "${1:-}" in
    --smoke) SMOKE=1 ;;
    "") ;;
    *) sed -n '2,25p' "$0" >&2; exit 2 ;;
esac
PG_BIN=${BENCH_PG_BIN:-/usr/lib/postgresql/15/bin}
PORT=${KA_PORT:-5597}
HOME_DIR=${KA_HOME:-/tmp/lockext-keepalive}
if [ "$SMOKE" = 1 ]; then
    SIZES=(10 100) LEASES=100 SECS=${KA_SECONDS:-1} ROUNDS=${KA_ROUNDS:-1} KA_RENEWALS=5
else
    SIZES=(10 1000 10000 100000) LEASES=10000 SECS=${KA_SECONDS:-3} ROUNDS=${KA_ROUNDS:-3} KA_RENEWALS=20
fi
BATCH=30
ROLE=ka_bench
for tool in psql pgbench pg_ctl initdb; do
    [ -x "$PG_BIN/$tool" ] || { echo "keepalive: $PG_BIN/$tool is missing" >&2; exit 1; }
done

export PG_BIN LOCKEXT_PORT=$PORT LOCKEXT_HOME=$HOME_DIR
WORK=$HOME_DIR/work
cluster() { bash scripts/cluster.sh "$@" >/dev/null; }
finish() {
    local rc=$?
    if [ "${KA_KEEP:-0}" = 1 ]; then cluster stop || true; else cluster destroy || true; fi
    [ $rc = 0 ] || echo "keepalive: failed (server log: $HOME_DIR/postgres.log)" >&2
}
trap finish EXIT
log() { echo "keepalive: $*" >&2; }
# psql as the superuser, or as the benchmark's role (a plain lockext_user member).
q() { "$PG_BIN/psql" -X -qAt -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d postgres "$@"; }
qa() { "$PG_BIN/psql" -X -qAt -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U "$ROLE" -d postgres "$@"; }
# pgbench as the benchmark's role; its output in $WORK/<tag>.out, its log in $WORK/<tag>.log.*
pgb() {
    local tag=$1; shift
    rm -f "$WORK/$tag".log.*
    if ! "$PG_BIN/pgbench" -n -M prepared -c 1 -h 127.0.0.1 -p "$PORT" -U "$ROLE" \
            -l --log-prefix "$WORK/$tag.log" "$@" postgres >"$WORK/$tag.out" 2>&1 \
        || grep -q aborted "$WORK/$tag.out"; then
        cat "$WORK/$tag.out" >&2
        exit 1
    fi
}
tps_of() { sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$WORK/$1.out"; }
# A pgbench run's backend has ended, and had time to flush its statistics (pg_stat_wal,
# pg_stat_user_tables are flushed as a backend exits, just after it leaves pg_stat_activity).
settle() {
    until [ "$(q -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'")" = 0 ]; do
        sleep 0.05
    done
    sleep 0.3
}
# The cluster's counters, one line: statements run (every level), top-level execution time
# (ms), rows updated and HOT-updated in lockext's tables, WAL records, full-page images, WAL
# bytes, WAL fsyncs (last: (2) reads it so).
# The query itself is left out (it names pg_stat_statements); nothing else runs meanwhile.
counters() {
    settle
    q -F ' ' -c "SELECT (SELECT sum(calls) FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat%'),
                        (SELECT round(sum(total_exec_time)::numeric, 3) FROM pg_stat_statements
                          WHERE toplevel AND query NOT LIKE '%pg_stat%'),
                        (SELECT sum(n_tup_upd) FROM pg_stat_user_tables WHERE schemaname = 'lockext'),
                        (SELECT sum(n_tup_hot_upd) FROM pg_stat_user_tables WHERE schemaname = 'lockext'),
                        wal_records, wal_fpi, wal_bytes, wal_sync FROM pg_stat_wal"
}
# Adds the difference of two counters() lines to the totals named by $3 (an array).
add_delta() {
    local -n tot=$3
    local -a a=($1) b=($2)
    local i
    for i in "${!a[@]}"; do
        tot[$i]=$(awk -v t="${tot[$i]:-0}" -v x="${a[$i]}" -v y="${b[$i]}" 'BEGIN { printf "%.3f", t + y - x }')
    done
}
# Latencies (ms) of every transaction in the logs of the given tags: "n avg p50 p99".
latencies() {
    local files=()
    local t
    for t in "$@"; do files+=("$WORK/$t".log.*); done
    awk '{ print $3 / 1000 }' "${files[@]}" | sort -g | awk '
        { v[NR] = $1; s += $1 }
        END { if (NR == 0) exit 1
              p50 = v[int(NR * 0.50 + 0.999999)]; p99 = v[int(NR * 0.99 + 0.999999)]
              printf "%d %.3f %.3f %.3f\n", NR, s / NR, p50, p99 }'
}
# pgbench -r's average latency (ms) of the statement of the run $1 that contains $2.
statement_ms() { awk -v pat="$2" 'index($0, pat) && $1 ~ /^[0-9.]+$/ { print $1; exit }' "$WORK/$1.out"; }
# A number with $2 decimals (default 2), its thousands apart by a space as in the other reports.
fmt() {
    awk -v x="$1" -v d="${2:-2}" 'BEGIN {
        s = sprintf("%.*f", d, x); i = index(s, "."); if (i == 0) i = length(s) + 1
        int_ = substr(s, 1, i - 1); rest = substr(s, i); out = ""
        while (length(int_) > 3 && substr(int_, length(int_) - 3, 1) ~ /[0-9]/) {
            out = " " substr(int_, length(int_) - 2) out; int_ = substr(int_, 1, length(int_) - 3)
        }
        print int_ out rest }'
}
ratio() {
    if awk -v b="$2" 'BEGIN { exit !(b > 0) }'; then echo "$(fmt "$(awk -v a="$1" -v b="$2" 'BEGIN { print a / b }')" 0)×"
    elif awk -v a="$1" 'BEGIN { exit !(a > 0) }'; then echo "∞"
    else echo "—"; fi
}

log "scratch cluster on port $PORT in $HOME_DIR ($PG_BIN)"
cluster destroy
cluster start
cat >>"$HOME_DIR/data/postgresql.conf" <<'CONF'

# bench/keepalive.sh: statements counted at every level; no reaper rounds while measuring
shared_preload_libraries = 'lockext,pg_stat_statements'
pg_stat_statements.track = all
lockext.reap_interval = '1h'
CONF
cluster restart
mkdir -p "$WORK"
q -c "CREATE EXTENSION pg_stat_statements" \
  -c "CREATE ROLE $ROLE LOGIN" -c "GRANT lockext_user TO $ROLE"
started=$(date -u '+%Y-%m-%d %H:%M UTC')

# ---- leases ------------------------------------------------------------------------------
declare -A KA
for n in "${SIZES[@]}"; do
    KA[$n]=$(qa -c "SELECT keepalive FROM lockext.lock_keepalive_grant('1 hour')")
done
KA_CYCLE=$(qa -c "SELECT keepalive FROM lockext.lock_keepalive_grant('1 hour')")
[[ " ${SIZES[*]} " == *" $LEASES "* ]] || { log "LEASES ($LEASES) must be one of the sizes"; exit 1; }
# One statement per transaction of $BATCH acquires: kr:<i> with a ttl of their own (the
# lock_renew side), and k<n>:<i> attached to keep-alive KA[n].
{
    for ((a = 1; a <= LEASES; a += BATCH)); do
        echo "SELECT count(*) FROM generate_series($a, $((a + BATCH - 1 < LEASES ? a + BATCH - 1 : LEASES))) AS g, LATERAL lockext.lock_acquire('kr:' || g, 'bench', '1 hour') AS l WHERE l IS NOT NULL;"
    done
    for n in "${SIZES[@]}"; do
        for ((a = 1; a <= n; a += BATCH)); do
            echo "SELECT count(*) FROM generate_series($a, $((a + BATCH - 1 < n ? a + BATCH - 1 : n))) AS g, LATERAL lockext.lock_acquire('k$n:' || g, 'bench', NULL, keepalive => ${KA[$n]}) AS l WHERE l IS NOT NULL;"
        done
    done
} >"$WORK/fill.sql"
total=$LEASES
for n in "${SIZES[@]}"; do total=$((total + n)); done
log "taking $total leases, $BATCH per transaction"
t0=$(date +%s.%N)
qa -f "$WORK/fill.sql" >/dev/null
fill_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
for n in "${SIZES[@]}"; do
    got=$(q -c "SELECT count(*) FROM lockext.locks WHERE keepalive = ${KA[$n]}")
    [ "$got" = "$n" ] || { log "keep-alive of $n has $got leases attached"; exit 1; }
done
got=$(q -c "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'kr:%' AND keepalive IS NULL")
[ "$got" = "$LEASES" ] || { log "$got of the $LEASES unattached leases were granted"; exit 1; }
q -c "VACUUM ANALYZE" -c "CHECKPOINT"
stat() { q -c "SELECT value FROM lockext.stats WHERE name = '$1'"; }
renewed0=$(stat renewals_ok) karenewed0=$(stat keepalive_renewals_ok)
renew_from=$(q -c "SELECT now()")

# ---- (1) one round: LEASES lock_renew calls against one keep-alive renewal ---------------------
# WAL and rows are the whole cluster's: autovacuum is off meanwhile, so that a vacuum of
# lockext.locks (which the lock_renew side's 10 000 dead rows a round call for) lands in
# neither side's counts. That work is left out, in the lock_renew side's favour.
# A warm-up of each side first (plans kept, pages read), not counted.
q -c "ALTER SYSTEM SET autovacuum = off" -c "SELECT pg_reload_conf()" >/dev/null
pgb warm_renew -t "$LEASES" -D n=0 -f bench/pgbench/keepalive_lock_renew.sql
pgb warm_ka -t "$KA_RENEWALS" -D ka="${KA[$LEASES]}" -f bench/pgbench/keepalive_renew.sql
declare -a TOT_R=() TOT_K=()
ms_r=0 ms_k=0
for ((r = 1; r <= ROUNDS; r++)); do
    order="renew ka"
    [ $((r % 2)) = 0 ] && order="ka renew"
    for side in $order; do
        before=$(counters)
        if [ "$side" = renew ]; then
            pgb "r1_renew_$r" -t "$LEASES" -D n=0 -f bench/pgbench/keepalive_lock_renew.sql
            add_delta "$before" "$(counters)" TOT_R
            ms_r=$(awk -v t="$ms_r" -v tps="$(tps_of "r1_renew_$r")" -v n="$LEASES" 'BEGIN { print t + n / tps * 1000 }')
        else
            pgb "r1_ka_$r" -t "$KA_RENEWALS" -D ka="${KA[$LEASES]}" -f bench/pgbench/keepalive_renew.sql
            add_delta "$before" "$(counters)" TOT_K
            ms_k=$(awk -v t="$ms_k" -v tps="$(tps_of "r1_ka_$r")" 'BEGIN { print t + 1000 / tps }')
        fi
    done
    log "round $r of $ROUNDS (renewals)"
done
q -c "ALTER SYSTEM RESET autovacuum" -c "SELECT pg_reload_conf()" >/dev/null
# Every call renewed what it named (lock_renew and lock_keepalive_renew answer NULL otherwise).
want_r=$(((ROUNDS + 1) * LEASES)) want_k=$(((ROUNDS + 1) * KA_RENEWALS))
got_r=$(($(stat renewals_ok) - renewed0)) got_k=$(($(stat keepalive_renewals_ok) - karenewed0))
[ "$got_r" = "$want_r" ] && [ "$got_k" = "$want_k" ] \
    || { log "renewals: $got_r of $want_r lock_renew, $got_k of $want_k keep-alive renewals succeeded"; exit 1; }
# ...each of its own lease, every one of them (renewed after renew_from, for an hour).
got=$(q -c "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'kr:%' AND expires_at > '$renew_from'::timestamptz + interval '1 hour'")
[ "$got" = "$LEASES" ] || { log "only $got of the $LEASES leases were renewed"; exit 1; }
# Per round: the lock_renew side's totals over ROUNDS rounds, the keep-alive's over
# ROUNDS * KA_RENEWALS renewals (each renewal is a round: it renews every lease once).
per() { awk -v x="$1" -v n="$2" 'BEGIN { print x / n }'; }
row1() {  # label, lock_renew value, keep-alive value, decimals
    local a b
    a=$(fmt "$2" "$4") b=$(fmt "$3" "$4")
    if [ "$b" = 0 ]; then  # shown as 0 (a few in all the rounds): no ratio worth printing
        printf '| %s | %s | %s | — |\n' "$1" "$a" "$b"
    else
        printf '| %s | %s | %s | %s |\n' "$1" "$a" "$b" "$(ratio "$2" "$3")"
    fi
}
nk=$((ROUNDS * KA_RENEWALS))
T1=$(
    echo "| per round (every lease renewed once) | $(fmt "$LEASES" 0) × \`lock_renew\` | 1 × \`lock_keepalive_renew\`, $(fmt "$LEASES" 0) attached | ratio |"
    echo "|---|---:|---:|---:|"
    row1 "time (ms)" "$(per "$ms_r" "$ROUNDS")" "$(per "$ms_k" "$ROUNDS")" 2
    row1 "statements run (pg_stat_statements calls, every level)" "$(per "${TOT_R[0]}" "$ROUNDS")" "$(per "${TOT_K[0]}" "$nk")" 0
    row1 "statements' execution time (ms, top level)" "$(per "${TOT_R[1]}" "$ROUNDS")" "$(per "${TOT_K[1]}" "$nk")" 3
    row1 "rows updated in lockext's tables" "$(per "${TOT_R[2]}" "$ROUNDS")" "$(per "${TOT_K[2]}" "$nk")" 0
    row1 "... of which HOT" "$(per "${TOT_R[3]}" "$ROUNDS")" "$(per "${TOT_K[3]}" "$nk")" 0
    row1 "WAL records" "$(per "${TOT_R[4]}" "$ROUNDS")" "$(per "${TOT_K[4]}" "$nk")" 0
    row1 "... of which full-page images" "$(per "${TOT_R[5]}" "$ROUNDS")" "$(per "${TOT_K[5]}" "$nk")" 0
    row1 "WAL bytes" "$(per "${TOT_R[6]}" "$ROUNDS")" "$(per "${TOT_K[6]}" "$nk")" 0
    row1 "WAL fsyncs" "$(per "${TOT_R[7]}" "$ROUNDS")" "$(per "${TOT_K[7]}" "$nk")" 0
)
stmt_ratio=$(awk -v a="${TOT_R[0]}" -v b="${TOT_K[0]}" -v r="$ROUNDS" -v k="$nk" 'BEGIN { print (a / r) / (b / k) }')
time_ratio=$(awk -v a="${TOT_R[1]}" -v b="${TOT_K[1]}" -v r="$ROUNDS" -v k="$nk" 'BEGIN { print (a / r) / (b / k) }')

# ---- (2) latency against the number of attached leases ------------------------------------
declare -A STMTS SYNCS
cycles="attached unattached"
for ((r = 1; r <= ROUNDS; r++)); do
    points=("${SIZES[@]}" $cycles)
    if [ $((r % 2)) = 0 ]; then  # reversed every other round
        rev=()
        for ((i = ${#points[@]} - 1; i >= 0; i--)); do rev+=("${points[$i]}"); done
        points=("${rev[@]}")
    fi
    for p in "${points[@]}"; do
        before=$(counters)
        case $p in
            attached) pgb "r2_${p}_$r" -r -T "$SECS" -D ka="$KA_CYCLE" -f bench/pgbench/keepalive_cycle_attached.sql ;;
            unattached) pgb "r2_${p}_$r" -r -T "$SECS" -f bench/pgbench/keepalive_cycle_unattached.sql ;;
            *) pgb "r2_${p}_$r" -r -T "$SECS" -D ka="${KA[$p]}" -f bench/pgbench/keepalive_renew.sql ;;
        esac
        after=$(counters)
        n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$WORK/r2_${p}_$r.out")
        STMTS[$p]=$(awk -v t="${STMTS[$p]:-0}" -v a="${before%% *}" -v b="${after%% *}" -v n="$n" -v r="$ROUNDS" \
            'BEGIN { print t + (b - a) / n / r }')
        SYNCS[$p]=$(awk -v t="${SYNCS[$p]:-0}" -v a="${before##* }" -v b="${after##* }" -v n="$n" -v r="$ROUNDS" \
            'BEGIN { print t + (b - a) / n / r }')
    done
    log "round $r of $ROUNDS (latency)"
done
failed=$(($(stat keepalive_renewals_failed) + $(stat renewals_failed)))
[ "$failed" = 0 ] || { log "$failed renewals answered NULL"; exit 1; }
for n in "${SIZES[@]}"; do
    got=$(q -c "SELECT count(*) FROM lockext.holders WHERE keepalive = ${KA[$n]} AND expires_at > now() + interval '50 minutes'")
    [ "$got" = "$n" ] || { log "only $got of the $n leases of keep-alive ${KA[$n]} are live"; exit 1; }
done
tags() { local r; for ((r = 1; r <= ROUNDS; r++)); do echo "r2_$1_$r"; done; }
acq_ms() {  # the acquire's own average (pgbench -r), over every transaction of the rounds
    local r s=0 n=0 k
    for ((r = 1; r <= ROUNDS; r++)); do
        k=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$WORK/r2_$1_$r.out")
        s=$(awk -v s="$s" -v x="$(statement_ms "r2_$1_$r" lock_acquire)" -v k="$k" 'BEGIN { print s + x * k }')
        n=$((n + k))
    done
    awk -v s="$s" -v n="$n" 'BEGIN { printf "%.3f", s / n }'
}
declare -A AVG
T2=$(
    echo "| call | attached leases | transactions | average (ms) | p50 (ms) | p99 (ms) | statements per transaction | WAL fsyncs per transaction |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    for p in "${SIZES[@]}"; do
        read -r cnt avg p50 p99 < <(latencies $(tags "$p"))
        echo "| \`lock_keepalive_renew\` | $(fmt "$p" 0) | $(fmt "$cnt" 0) | $avg | $p50 | $p99 | $(fmt "${STMTS[$p]}" 1) | $(fmt "${SYNCS[$p]}" 2) |"
    done
    for c in $cycles; do
        read -r cnt avg p50 p99 < <(latencies $(tags "$c"))
        if [ "$c" = attached ]; then what="\`lock_acquire(keepalive =>)\` + \`lock_release\`"; else what="\`lock_acquire(ttl)\` + \`lock_release\`"; fi
        echo "| $what (the acquire alone: $(acq_ms "$c") ms) | $([ "$c" = attached ] && echo "1" || echo "—") | $(fmt "$cnt" 0) | $avg | $p50 | $p99 | $(fmt "${STMTS[$c]}" 1) | $(fmt "${SYNCS[$c]}" 2) |"
    done
)
read -r _ avg_lo _ p99_lo < <(latencies $(tags "${SIZES[0]}"))
read -r _ avg_hi _ p99_hi < <(latencies $(tags "${SIZES[-1]}"))
flat=$(awk -v a="$avg_lo" -v b="$avg_hi" 'BEGIN { printf "%.2f", b / a }')
flat99=$(awk -v a="$p99_lo" -v b="$p99_hi" 'BEGIN { printf "%.2f", b / a }')
met() { awk -v x="$1" -v op="$2" -v g="$3" 'BEGIN { ok = (op == ">=") ? x >= g : x <= g; print ok ? "met" : "**missed**" }'; }

# ---- report -------------------------------------------------------------------------------
version=$(q -c "SELECT extversion FROM pg_extension WHERE extname = 'lockext'")
pgversion=$(q -c "SHOW server_version")
cmd="bash bench/keepalive.sh"
[ "$SMOKE" = 0 ] || cmd="$cmd --smoke"
[ "$PG_BIN" = /usr/lib/postgresql/15/bin ] || cmd="BENCH_PG_BIN=$PG_BIN $cmd"
smoke_note=""
[ "$SMOKE" = 0 ] || smoke_note=" **Smoke run: numbers meaningless.**"
REPORT=$(cat <<EOF
# Keep-alives: one renewal for many leases

$started, $(nproc) CPUs, PostgreSQL $pgversion, lockext $version ($PG_BIN), one client,
default settings (\`synchronous_commit = on\`, \`lockext.durability = grant\`). \`$cmd\` (${SECS} s per latency point,
$ROUNDS rounds, the order reversed every other round; leases taken $BATCH per transaction:
$(fmt "$total" 0) in $fill_s s).$smoke_note

## Targets

| target | measured | goal | |
|---|---:|---:|---|
| statements run: $(fmt "$LEASES" 0) \`lock_renew\` / 1 keep-alive renewal | $(fmt "$stmt_ratio" 0)× | ≥ 50× | $(met "$stmt_ratio" ">=" 50) |
| statements' execution time, same ratio | $(fmt "$time_ratio" 0)× | ≥ 50× | $(met "$time_ratio" ">=" 50) |
| keep-alive renewal, average at $(fmt "${SIZES[-1]}" 0) / at $(fmt "${SIZES[0]}" 0) attached leases | $flat× | ≤ 1.5× (flat) | $(met "$flat" "<=" 1.5) |
| ... p99, same | $flat99× | ≤ 1.5× (flat) | $(met "$flat99" "<=" 1.5) |

## Renewing $(fmt "$LEASES" 0) leases

$T1

A round of the lock_renew side is $(fmt "$LEASES" 0) autocommit statements (pgbench -t, -M prepared);
the keep-alive side is one statement. pg_stat_statements counts every statement, lockext's
own included (track = all); the execution time is of top-level statements only. Rows
updated and WAL come from pg_stat_user_tables and pg_stat_wal, the whole cluster's, with
autovacuum off meanwhile (the vacuum that the lock_renew side's dead rows call for is not
counted). lockext commits a transaction that only renews without waiting for its flush
(src/commit.rs), whatever synchronous_commit says: the fsyncs are the WAL writer's.

## Latency against the number of attached leases

$T2

Latency is of one whole pgbench transaction (one autocommit call, with its commit), from
pgbench --log over all rounds. The cycles take a random free lock and release it; "the
acquire alone" is pgbench -r's average for the lock_acquire statement. A grant commits
durably (one fsync each: the last column); a renewal does not wait for its flush.
EOF
)
echo "$REPORT"
if [ "$SMOKE" = 1 ]; then
    # Every number was filled in: an empty cell means a step measured nothing.
    ! grep -qE '\| *\|' <<<"$T1"$'\n'"$T2" || { log "a cell of the report is empty"; exit 1; }
else
    out=bench/results/keepalive-$(date -u +%Y-%m-%d-%H%M).md
    echo "$REPORT" >"$out"
    log "wrote $out"
fi
