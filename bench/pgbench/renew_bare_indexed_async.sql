-- The indexed bare UPDATE committed asynchronously.
\set id random(1, :keys)
WITH u AS (UPDATE bare.leases_indexed SET expires_at = clock_timestamp() + interval '1 hour' WHERE lock_id = 'hb:' || :id RETURNING 1)
SELECT set_config('synchronous_commit', 'off', true), (SELECT count(*) FROM u);
