-- The bare UPDATE on a table whose expires_at is indexed, as lockext.locks is (no HOT).
\set id random(1, :keys)
UPDATE bare.leases_indexed SET expires_at = clock_timestamp() + interval '1 hour' WHERE lock_id = 'hb:' || :id;
