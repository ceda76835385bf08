-- One batch of the reaper: deletes expired shared leases and permits whose lock is free, at most
-- $1 of them, and returns each (lock_id), with an event for LISTENers when asked.
-- Oldest first, through the index on when a lease's lock is free (lockext.free_at: its
-- expiry plus its lock-delay), with the batch's clock (read once) as an index condition,
-- so the scan stops at the first lease not yet free: a batch reads what it may delete, not
-- every lease, live or in its lock-delay (clock_timestamp() is volatile, and would make it
-- a filter over the whole index). FOR UPDATE re-checks on the newest version of each row,
-- so a lease renewed a moment ago is left alone.
-- Bounded whatever the statistics say: the victims are chosen once (a MATERIALIZED CTE,
-- which no plan runs again for each row of another input: a nested loop that re-ran a
-- LIMIT ... FOR UPDATE subquery for every lease kept a round busy for minutes on a table
-- whose statistics said it was empty), and the DELETE finds its rows by the
-- victims' row addresses (a TID scan): no plan reads the whole table for one batch, nor
-- every lease of a lock that many hold. A victim is locked by the batch and unchanged
-- since its lock (a row that changed after the statement's snapshot and still looked
-- expired would be left to the next batch: the address is its newest version's).
-- The values of the grants it deletes (lockext.lease_values, src/election.rs) go in the
-- same statement: one probe of the values' key for each row deleted (a LATERAL subquery:
-- whatever the statistics say, no plan compares every value with every row), then a
-- delete by the values' row addresses (a TID scan).
-- A value row that another transaction holds locked (a setter's) is skipped, not waited
-- for, and so is one a setter changed after the statement's snapshot (its newest version
-- is not the one the delete sees): both are left to the reaper's sweep (reap_values.sql).
-- $1 limit (leases at most), $2 notify (lockext.notify: send events), $3 now (the batch's clock)
WITH doomed AS MATERIALIZED (
             SELECT lock_id, owner, ctid
               FROM lockext.shared_leases
              WHERE lockext.free_at(expires_at, lock_delay) <= $3
              ORDER BY lockext.free_at(expires_at, lock_delay)
              LIMIT $1
                FOR UPDATE SKIP LOCKED),
     reaped AS (DELETE FROM lockext.shared_leases AS l
                 WHERE l.ctid = ANY (ARRAY(SELECT ctid FROM doomed))
                RETURNING l.lock_id, l.fence_token),
     ended_values AS MATERIALIZED (
             SELECT x.ctid
               FROM reaped AS r,
                    LATERAL (SELECT v.ctid FROM lockext.lease_values AS v
                              WHERE v.lock_id = r.lock_id AND v.fence_token = r.fence_token
                                FOR UPDATE SKIP LOCKED) AS x),
     values_gone AS (DELETE FROM lockext.lease_values AS v
                      WHERE v.ctid = ANY (ARRAY(SELECT ctid FROM ended_values)))
SELECT lock_id,
       CASE WHEN $2 THEN pg_catalog.pg_notify('lockext', pg_catalog.json_build_object(
           'event', 'expired', 'lock_id', lock_id, 'fence_token', fence_token,
           'previous_fence_token', NULL)::text) END
  FROM reaped
