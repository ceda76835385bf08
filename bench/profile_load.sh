#!/usr/bin/env bash
# One load point, profiled: pgbench SCRIPT at C clients for T s on the scratch cluster,
# with, over the middle W seconds: wait events of every client backend sampled every 10 ms,
# the machine's CPU split (/proc/stat: user, system, softirq, idle, iowait; niced work left out),
# pgbench's own CPU (/proc/PID/stat), context switches (/proc/stat ctxt).
#   bash bench/profile_load.sh SCRIPT CLIENTS [PGOPTIONS]
# SCRIPT is a file of bench/pgbench/ without .sql; the cluster is scripts/cluster.sh's on
# LOCKEXT_PORT (default 5496) with bench/setup.sql loaded (docs/profile-2026-12-01.md, "At 16
# and 64 clients", gives the commands). Prints one line of CPU and switches per cycle, then
# the share of samples of each wait event and state.
set -euo pipefail
SCRIPT=$1 C=$2 OPTS=${3:-}
PORT=${LOCKEXT_PORT:-5496} T=${T:-16} W=${W:-10}
B=/usr/lib/postgresql/15/bin
P="$B/psql -X -qAt -h 127.0.0.1 -p $PORT -U postgres postgres"
OUT=$(mktemp -d)
j=1; [ "$C" -gt 1 ] && j=2
PGOPTIONS="$OPTS" $B/pgbench -n -M prepared -c "$C" -j $j -T "$T" -D keys=100000 \
   -h 127.0.0.1 -p "$PORT" -U postgres -f "$(dirname "$0")/pgbench/$SCRIPT.sql" postgres >"$OUT/pgb" 2>&1 &
PGB=$!
sleep 3
cpu() { awk '/^cpu /{print $2, $3, $4, $5, $6, $7, $8} /^ctxt/{print $2}' /proc/stat | tr '\n' ' '; }
pgbcpu() { awk '{print $14+$15}' /proc/$PGB/stat; }
xacts() { $P -c "SELECT xact_commit FROM pg_stat_database WHERE datname='postgres'"; }
read -r u0 n0 s0 i0 w0 irq0 sirq0 ct0 <<<"$(cpu)"; pb0=$(pgbcpu); x0=$(xacts)
$P -c "DROP TABLE IF EXISTS prof_samples; CREATE UNLOGGED TABLE prof_samples(wait text, state text, n int)" >/dev/null
n=$((W*100))
$P -c "DO \$\$ DECLARE t0 timestamptz; BEGIN FOR i IN 1..$n LOOP t0 := clock_timestamp(); PERFORM pg_stat_clear_snapshot();
  INSERT INTO prof_samples SELECT coalesce(wait_event_type||':'||wait_event,'CPU'), state, count(*) FROM pg_stat_activity
   WHERE backend_type='client backend' AND pid <> pg_backend_pid() AND application_name='pgbench' GROUP BY 1,2;
  PERFORM pg_sleep(greatest(0, 0.01 - extract(epoch FROM clock_timestamp()-t0))); END LOOP; END \$\$" >/dev/null
read -r u1 n1 s1 i1 w1 irq1 sirq1 ct1 <<<"$(cpu)"; pb1=$(pgbcpu); x1=$(xacts)
wait $PGB || true
tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$OUT/pgb")
lat=$(sed -n 's/^latency average = \([0-9.]*\).*/\1/p' "$OUT/pgb")
python3 - "$SCRIPT" "$C" "$tps" $u0 $n0 $s0 $i0 $w0 $irq0 $sirq0 $ct0 $pb0 $x0 $u1 $n1 $s1 $i1 $w1 $irq1 $sirq1 $ct1 $pb1 $x1 <<'PY'
import sys
s, c, tps = sys.argv[1], int(sys.argv[2]), float(sys.argv[3] or 0)
a = list(map(int, sys.argv[4:14])); b = list(map(int, sys.argv[14:24]))
d = [y - x for x, y in zip(a, b)]
u, n, sy, idle, iow, irq, sirq, ct, pb, xa = d
hz = 100
busy = (u + sy + irq + sirq) / hz
total = (u + sy + irq + sirq + idle + iow) / hz
secs = total / 2
cycles = tps * secs
print(f"{s:28s} c={c:3d} tps={tps:9.0f} busy={busy/total*100:5.1f}% iowait={iow/hz/total*100:4.1f}%  "
      f"cpu_us/cycle={busy/cycles*1e6:6.1f} (user {u/hz/cycles*1e6:5.1f} sys {(sy+irq+sirq)/hz/cycles*1e6:5.1f}) "
      f"pgbench_us/cycle={pb/hz/cycles*1e6:5.1f} server_us/cycle={(busy-pb/hz)/cycles*1e6:6.1f} cs/cycle={ct/cycles:5.2f} xacts/cycle={xa/cycles:4.2f}")
PY
$P -c "SELECT wait || ' ' || coalesce(state,'') || ' ' || round(100.0*sum(n)/(SELECT sum(n) FROM prof_samples),1) || '%' FROM prof_samples GROUP BY wait, state ORDER BY sum(n) DESC LIMIT 8" | sed 's/^/    /'
rm -rf "$OUT"
