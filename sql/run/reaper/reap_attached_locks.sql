-- One batch of the reaper: deletes exclusive leases attached to an ended keep-alive
-- (end_keepalives.sql), once their lock is free (the keep-alive's expiry plus the lease's
-- lock-delay), at most $1 of them, and returns each (lock_id), with an event for
-- LISTENers when asked. An ended keep-alive is never renewed, so its leases never live
-- again; FOR UPDATE OF l re-checks the newest version of each lease, so one taken over
-- since (attached to another keep-alive, or none) is left alone.
-- Bounded whatever the statistics say: the victims are chosen once (a MATERIALIZED CTE,
-- which no plan runs again for each row of another input: a nested loop that re-ran a
-- LIMIT ... FOR UPDATE subquery for every lease kept a round busy for minutes on a table
-- whose statistics said it was empty), and the DELETE finds its rows by their key in the
-- victims' array, an index condition: no plan reads the whole table for one batch. (The
-- key alone: a lock's one lease, which nobody changes while the batch holds its lock.)
-- The values of the grants it deletes (lockext.lease_values, src/election.rs) go in the
-- same statement: one probe of the values' key for each row deleted (a LATERAL subquery:
-- whatever the statistics say, no plan compares every value with every row), then a
-- delete by the values' row addresses (a TID scan).
-- A value row that another transaction holds locked (a setter's) is skipped, not waited
-- for, and so is one a setter changed after the statement's snapshot (its newest version
-- is not the one the delete sees): both are left to the reaper's sweep (reap_values.sql).
-- $1 limit (leases at most), $2 notify (lockext.notify: send events), $3 now (the batch's clock)
WITH doomed AS MATERIALIZED (
             SELECT l.lock_id, l.owner
               FROM lockext.keepalives AS k
               JOIN lockext.locks AS l ON l.keepalive = k.keepalive
              WHERE k.ended AND lockext.free_at(k.expires_at, l.lock_delay) <= $3
              LIMIT $1
                FOR UPDATE OF l SKIP LOCKED),
     reaped AS (DELETE FROM lockext.locks AS l
                 WHERE l.lock_id = ANY (ARRAY(SELECT lock_id FROM doomed))
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
