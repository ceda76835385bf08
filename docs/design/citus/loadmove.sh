#!/bin/bash
# usage: loadmove.sh naive|fixed  -- contention on 40 lock ids through the coordinator, shard moves
# and a rebalance in the middle; then per-lock-id check of the tokens.
V=$1; B=/work/citus-proto/pg18/bin; P="$B/psql -h 127.0.0.1 -U postgres -X -p 6500 -Atq"
N="nice -n 19 ionice -c3"
$P -c "TRUNCATE proto.leases, proto.lock_tokens, proto.grants"
$B/psql -h 127.0.0.1 -U postgres -X -p 6501 -Atqc "SELECT setval('proto.ledger', 1, false)"
$B/psql -h 127.0.0.1 -U postgres -X -p 6504 -Atqc "SELECT setval('proto.ledger', 100000)"
if [ "$V" = plain ]; then nice -n 19 ionice -c3 python3 /work/citus-proto/dins.py 30 ${SC:-off} > /work/citus-proto/client-$V.log 2>&1 & else nice -n 19 ionice -c3 python3 /work/citus-proto/client.py $V 4 30 > /work/citus-proto/client-$V.log 2>&1 & fi
PB=$!
sleep 5
mv1() { # move every shard of the colocation group on $1 that holds test ids to $2, one by one
  for s in $($P -c "SELECT p.shardid FROM pg_dist_shard_placement p JOIN pg_dist_shard d USING (shardid) WHERE d.logicalrelid='proto.leases'::regclass AND p.nodeport=$1 ORDER BY 1 LIMIT $3"); do
    t0=$(date +%s.%N)
    $P -c "SELECT citus_move_shard_placement($s, '127.0.0.1', $1, '127.0.0.1', $2, shard_transfer_mode := 'force_logical')" >/dev/null
    echo "move $s $1->$2: start $t0 end $(date +%s.%N)"
  done
}
mv1 6504 6501 3      # high ledger -> low ledger: the dangerous direction
sleep 2
t0=$(date +%s.%N)
$P -c "SELECT rebalance_table_shards(shard_transfer_mode := 'force_logical')" >/dev/null
echo "rebalance: start $t0 end $(date +%s.%N)"
wait $PB
cat /work/citus-proto/client-$V.log
$P -F ' ' <<'S'
SELECT 'variant', variant, 'grants', count(*), 'lock_ids', count(DISTINCT lock_id),
       'backwards', count(*) FILTER (WHERE token <= prev), 'max_drop', coalesce(max(prev - token) FILTER (WHERE token <= prev), 0)
FROM (SELECT *, lag(token) OVER (PARTITION BY lock_id ORDER BY at, token) prev FROM proto.grants) s GROUP BY variant;
SELECT 'by node', node, count(*) FROM proto.grants GROUP BY node ORDER BY node;
SELECT 'placements', nodeport, count(*) FROM pg_dist_shard_placement p JOIN pg_dist_shard d USING (shardid) WHERE d.logicalrelid='proto.leases'::regclass GROUP BY 1,2 ORDER BY 2;
S
