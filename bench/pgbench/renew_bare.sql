-- Heartbeat yardstick: a bare single-row UPDATE by primary key (expires_at not indexed).
\set id random(1, :keys)
UPDATE bare.leases SET expires_at = clock_timestamp() + interval '1 hour' WHERE lock_id = 'hb:' || :id;
