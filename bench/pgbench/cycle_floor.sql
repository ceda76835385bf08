-- The floor: one single-row INSERT committed durably (the grant), one DELETE committed
-- with synchronous_commit = off set by set_config(..., true) (the release).
\set id random(1, :keys)
\set got 0
INSERT INTO floor.leases (lock_id, owner) VALUES ('lock:' || :id, 'bench:' || :client_id)
  ON CONFLICT DO NOTHING RETURNING 1 AS got \aset
\if :got
WITH d AS (DELETE FROM floor.leases WHERE lock_id = 'lock:' || :id AND owner = 'bench:' || :client_id RETURNING 1)
SELECT set_config('synchronous_commit', 'off', true), (SELECT count(*) FROM d);
\endif
