-- One batch of the reaper: deletes expired shared leases and permits whose lock is free, at most
-- $1 of them, and returns each (lock_id), with an event for LISTENers when asked.
-- Oldest first, through the index on when a lease's lock is free (lockext.free_at: its
-- expiry plus its lock-delay), with the batch's clock (read once) as an index condition,
-- so the scan stops at the first lease not yet free: a batch reads what it may delete, not
-- every lease, live or in its lock-delay (clock_timestamp() is volatile, and would make it
-- a filter over the whole index). FOR UPDATE re-checks on the newest version of each row,
-- so a lease renewed a moment ago is left alone.
-- $1 limit (leases at most), $2 notify (lockext.notify: send events), $3 now (the batch's clock)
WITH reaped AS (DELETE FROM lockext.shared_leases AS l
                 USING (SELECT lock_id, owner
                          FROM lockext.shared_leases
                         WHERE lockext.free_at(expires_at, lock_delay) <= $3
                         ORDER BY lockext.free_at(expires_at, lock_delay)
                         LIMIT $1
                           FOR UPDATE SKIP LOCKED) AS doomed
                 WHERE l.lock_id = doomed.lock_id AND l.owner = doomed.owner
                RETURNING l.lock_id, l.fence_token)
SELECT lock_id,
       CASE WHEN $2 THEN pg_catalog.pg_notify('lockext', pg_catalog.json_build_object(
           'event', 'expired', 'lock_id', lock_id, 'fence_token', fence_token,
           'previous_fence_token', NULL)::text) END
  FROM reaped
