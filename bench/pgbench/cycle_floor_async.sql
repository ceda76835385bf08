-- Past the floor: the same INSERT and DELETE, both committed asynchronously. What a grant
-- costs when nothing waits for the disk (the reference for lockext's epoch mode).
\set id random(1, :keys)
\set got 0
WITH i AS (INSERT INTO floor.leases (lock_id, owner) VALUES ('lock:' || :id, 'bench:' || :client_id)
             ON CONFLICT DO NOTHING RETURNING 1)
SELECT set_config('synchronous_commit', 'off', true), (SELECT count(*) FROM i) AS got \gset
\if :got
WITH d AS (DELETE FROM floor.leases WHERE lock_id = 'lock:' || :id AND owner = 'bench:' || :client_id RETURNING 1)
SELECT set_config('synchronous_commit', 'off', true), (SELECT count(*) FROM d);
\endif
