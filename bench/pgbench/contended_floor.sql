-- Contended, the floor (see cycle_floor.sql) on one row.
\set got 0
INSERT INTO floor.leases (lock_id, owner) VALUES ('hot', 'bench:' || :client_id)
  ON CONFLICT DO NOTHING RETURNING 1 AS got \aset
\if :got
\startpipeline
WITH d AS (DELETE FROM floor.leases WHERE lock_id = 'hot' AND owner = 'bench:' || :client_id RETURNING 1)
SELECT set_config('synchronous_commit', 'off', true), (SELECT count(*) FROM d);
SELECT nextval(('bench.handoffs_' || :client_id)::regclass);
\endpipeline
\endif
