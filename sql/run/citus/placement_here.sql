-- Whether shard $1 has a placement on this node (its group), and whether this node is the
-- coordinator (group 0), which holds no shard of lockext's. Read under the newest snapshot,
-- after the shard's metadata lock is held (lock_shard.sql).
-- $1 shard
SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_placement AS p, pg_catalog.pg_dist_local_group AS g
                WHERE p.shardid = $1 AND p.groupid = g.groupid) AS here,
       (SELECT groupid = 0 FROM pg_catalog.pg_dist_local_group) AS coordinator
