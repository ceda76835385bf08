-- Every shard of lockext.locks with a placement on this node, with the colocated shards of
-- the other distributed tables (the same range of hash values: the same shardminvalue), by
-- relation name as shards.sql gives them: what the reaper's round reaps on this node.
SELECT l.shardid AS shard,
       shard_name('lockext.locks'::regclass, l.shardid) AS locks,
       shard_name('lockext.shared_leases'::regclass,
                  (SELECT o.shardid FROM pg_dist_shard AS o
                    WHERE o.logicalrelid = 'lockext.shared_leases'::regclass
                      AND o.shardminvalue = l.shardminvalue)) AS shared_leases,
       shard_name('lockext.lease_values'::regclass,
                  (SELECT o.shardid FROM pg_dist_shard AS o
                    WHERE o.logicalrelid = 'lockext.lease_values'::regclass
                      AND o.shardminvalue = l.shardminvalue)) AS lease_values,
       shard_name('lockext.lock_tokens'::regclass,
                  (SELECT o.shardid FROM pg_dist_shard AS o
                    WHERE o.logicalrelid = 'lockext.lock_tokens'::regclass
                      AND o.shardminvalue = l.shardminvalue)) AS lock_tokens,
       shard_name('lockext.token_floor'::regclass,
                  (SELECT o.shardid FROM pg_dist_shard AS o
                    WHERE o.logicalrelid = 'lockext.token_floor'::regclass)) AS token_floor
  FROM pg_dist_shard AS l, pg_dist_placement AS p, pg_dist_local_group AS g
 WHERE l.logicalrelid = 'lockext.locks'::regclass
   AND p.shardid = l.shardid AND p.groupid = g.groupid
 ORDER BY l.shardid
