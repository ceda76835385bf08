-- Whether shard $1 has a placement on this node (its group), and whether this call came
-- over one of Citus's own connections (a call delegated from another node: Citus names
-- them so), which tells a call routed before a shard move from one Citus never delegated.
-- Read under the newest snapshot, before and after the shard's metadata lock is held
-- (lock_shard.sql).
-- $1 shard
SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_placement AS p, pg_catalog.pg_dist_local_group AS g
                WHERE p.shardid = $1 AND p.groupid = g.groupid) AS here,
       current_setting('application_name') LIKE 'citus\_internal gpid=%' AS internal
