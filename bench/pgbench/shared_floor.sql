-- The floor of a read lock: one row per reader of the one id "hot", keyed (lock_id, owner);
-- a single-row INSERT committed durably (the grant), a DELETE committed with
-- synchronous_commit = off (the release). A plain INSERT: a reader's row left behind is an
-- error, not a refusal.
INSERT INTO floor.shared_leases (lock_id, owner) VALUES ('hot', 'bench:' || :client_id);
WITH d AS (DELETE FROM floor.shared_leases WHERE lock_id = 'hot' AND owner = 'bench:' || :client_id RETURNING 1)
SELECT set_config('synchronous_commit', 'off', true), (SELECT count(*) FROM d);
