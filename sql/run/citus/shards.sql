-- The shard of lockext.locks that holds lock id $1: each call's first statement on a
-- distributed installation (citus.rs). Its colocated shards' names are looked up once per
-- backend and shard (colocated.sql): a shard keeps its id and its name when it moves, and
-- an id is never used again (a split makes new ones).
-- $1 lock_id
SELECT get_shard_id_for_distribution_column('lockext.locks', $1) AS shard
