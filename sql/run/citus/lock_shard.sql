-- Holds shard $1's metadata lock in ShareLock mode to the end of the transaction: a shard
-- move or split takes it in ExclusiveLock mode on every node before its last catch-up, so
-- it waits for this call's commit, and this call, once it has the lock, reads where the
-- shard is as the move left it (placement_here.sql).
-- $1 shard
SELECT lock_shard_metadata(5, ARRAY[$1]) AS locked
