-- Shard $1 of lockext.locks, and the shards of the other distributed tables colocated with
-- it (the same range of hash values: the same shardminvalue; lockext.resources's by resource
-- id), and the one shard of the
-- reference table lockext.token_floor (on every node), by relation name
-- (schema-qualified, quoted as needed). Citus names a shard after its table and the shard's
-- id (lockext.locks_102008), which the statements then name instead of the table
-- (statements::with_relations).
-- $1 shard
SELECT shard_name('lockext.locks'::regclass, l.shardid) AS locks,
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
       shard_name('lockext.resources'::regclass,
                  (SELECT o.shardid FROM pg_dist_shard AS o
                    WHERE o.logicalrelid = 'lockext.resources'::regclass
                      AND o.shardminvalue = l.shardminvalue)) AS resources,
       shard_name('lockext.token_floor'::regclass,
                  (SELECT o.shardid FROM pg_dist_shard AS o
                    WHERE o.logicalrelid = 'lockext.token_floor'::regclass)) AS token_floor
  FROM pg_dist_shard AS l
 WHERE l.logicalrelid = 'lockext.locks'::regclass AND l.shardid = $1
