-- One batch of the reaper: deletes exclusive leases attached to an ended keep-alive
-- (end_keepalives.sql), once their lock is free (the keep-alive's expiry plus the lease's
-- lock-delay), at most $1 of them, and returns each (lock_id), with an event for
-- LISTENers when asked. An ended keep-alive is never renewed, so its leases never live
-- again; FOR UPDATE OF l re-checks the newest version of each lease, so one taken over
-- since (attached to another keep-alive, or none) is left alone.
-- $1 limit (leases at most), $2 notify (lockext.notify: send events), $3 now (the batch's clock)
WITH reaped AS (DELETE FROM lockext.locks AS l
                 USING (SELECT l.lock_id, l.owner
                          FROM lockext.keepalives AS k
                          JOIN lockext.locks AS l ON l.keepalive = k.keepalive
                         WHERE k.ended AND lockext.free_at(k.expires_at, l.lock_delay) <= $3
                         LIMIT $1
                           FOR UPDATE OF l SKIP LOCKED) AS doomed
                 WHERE l.lock_id = doomed.lock_id AND l.owner = doomed.owner
                RETURNING l.lock_id, l.fence_token)
SELECT lock_id,
       CASE WHEN $2 THEN pg_catalog.pg_notify('lockext', pg_catalog.json_build_object(
           'event', 'expired', 'lock_id', lock_id, 'fence_token', fence_token,
           'previous_fence_token', NULL)::text) END
  FROM reaped
