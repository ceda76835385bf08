-- The exiting backend's own session-bound leases, of both tables: deletes them and returns
-- each (lock_id), with an event for LISTENers when asked.
-- A lease row another transaction holds locked (a renewal or release of this lease in
-- flight, from another connection) is skipped here, and waited for by the exit hook
-- (session.rs), which runs this statement again until mine_left.sql finds none of the
-- session's rows left, for one second at most: once skipped for good, the renewal
-- committed after the exit and the lease outlived its session (the schedule explorer's
-- renew x session_end). Not a lock wait: an exiting backend cannot time one out (see
-- exit_settings.sql). Past the second, the reaper ends what is left.
-- The values of the grants it deletes (lockext.lease_values, src/election.rs) go in the
-- same statement: one probe of the values' key for each row deleted (a LATERAL subquery:
-- whatever the statistics say, no plan compares every value with every row), then a
-- delete by the values' row addresses (a TID scan).
-- A value row that another transaction holds locked (a setter's) is skipped, not waited
-- for, and so is one a setter changed after the statement's snapshot (its newest version
-- is not the one the delete sees): both are left to the reaper's sweep (reap_values.sql).
-- $1 pid (the exiting backend's), $2 started (its start), $3 notify (lockext.notify: send events)
WITH x AS (DELETE FROM lockext.locks AS l
            USING (SELECT lock_id, owner
                     FROM lockext.locks AS s
                    WHERE s.session_start IS NOT NULL
                      AND s.taker_pid = $1 AND s.session_start = $2
                      FOR UPDATE SKIP LOCKED) AS c
            WHERE l.lock_id = c.lock_id AND l.owner = c.owner
           RETURNING l.lock_id, l.fence_token),
     sh AS (DELETE FROM lockext.shared_leases AS l
             USING (SELECT lock_id, owner
                      FROM lockext.shared_leases AS s
                     WHERE s.session_start IS NOT NULL
                       AND s.taker_pid = $1 AND s.session_start = $2
                       FOR UPDATE SKIP LOCKED) AS c
             WHERE l.lock_id = c.lock_id AND l.owner = c.owner
            RETURNING l.lock_id, l.fence_token),
     reaped AS (SELECT lock_id, fence_token FROM x
                UNION ALL
                SELECT lock_id, fence_token FROM sh),
     ended_values AS MATERIALIZED (
             SELECT x.ctid
               FROM reaped AS r,
                    LATERAL (SELECT v.ctid FROM lockext.lease_values AS v
                              WHERE v.lock_id = r.lock_id AND v.fence_token = r.fence_token
                                FOR UPDATE SKIP LOCKED) AS x),
     values_gone AS (DELETE FROM lockext.lease_values AS v
                      WHERE v.ctid = ANY (ARRAY(SELECT ctid FROM ended_values)))
SELECT lock_id,
       CASE WHEN $3 THEN pg_catalog.pg_notify('lockext', pg_catalog.json_build_object(
           'event', 'session_ended', 'lock_id', lock_id, 'fence_token', fence_token,
           'previous_fence_token', NULL)::text) END
  FROM reaped
