-- The floor of a read lock (see shared_floor.sql) with both statements committed
-- asynchronously: the yardstick of lockext's epoch mode.
WITH i AS (INSERT INTO floor.shared_leases (lock_id, owner) VALUES ('hot', 'bench:' || :client_id) RETURNING 1)
SELECT set_config('synchronous_commit', 'off', true), (SELECT count(*) FROM i);
WITH d AS (DELETE FROM floor.shared_leases WHERE lock_id = 'hot' AND owner = 'bench:' || :client_id RETURNING 1)
SELECT set_config('synchronous_commit', 'off', true), (SELECT count(*) FROM d);
