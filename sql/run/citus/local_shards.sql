-- Every shard of lockext.locks with a placement on this node: what the reaper's round reaps
-- on this node, each with its colocated shards (colocated.sql, looked up once per backend and
-- shard).
SELECT l.shardid AS shard
  FROM pg_dist_shard AS l, pg_dist_placement AS p, pg_dist_local_group AS g
 WHERE l.logicalrelid = 'lockext.locks'::regclass
   AND p.shardid = l.shardid AND p.groupid = g.groupid
 ORDER BY l.shardid
