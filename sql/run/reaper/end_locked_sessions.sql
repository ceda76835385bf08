-- The second step (see lock_ended_sessions.sql): of the rows the first step locked, deletes
-- those whose session still looks dead, with the backend table read again now that the
-- locks are held, and returns each (lock_id), with an event for LISTENers when asked.
-- Bounded whatever the statistics say: the rows are chosen once (MATERIALIZED CTEs, which
-- no plan runs again for each row of another input) and found by their key in the first
-- step's arrays, an index condition.
-- The values of the grants it deletes (lockext.lease_values, src/election.rs) go in the
-- same statement: one probe of the values' key for each row deleted (a LATERAL subquery:
-- whatever the statistics say, no plan compares every value with every row), then a
-- delete by the values' row addresses (a TID scan).
-- A value row that another transaction holds locked (a setter's) is skipped, not waited
-- for, and so is one a setter changed after the statement's snapshot (its newest version
-- is not the one the delete sees): both are left to the reaper's sweep (reap_values.sql).
-- $1 notify (lockext.notify: send events), $2 lock_ids and $3 owners of lockext.locks,
-- $4 shared_lock_ids and $5 shared_owners of lockext.shared_leases (the first step's arrays)
WITH xc AS MATERIALIZED (
        SELECT lock_id, owner
          FROM lockext.locks AS s
         WHERE s.lock_id = ANY ($2::text[])
           AND (s.lock_id, s.owner) IN (SELECT * FROM unnest($2::text[], $3::text[]))
           AND s.session_start IS NOT NULL
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_stat_get_activity(NULL) AS a
                            WHERE a.pid = s.taker_pid
                              AND a.backend_start = s.session_start)
           FOR UPDATE SKIP LOCKED),
     shc AS MATERIALIZED (
        SELECT lock_id, owner
          FROM lockext.shared_leases AS s
         WHERE s.lock_id = ANY ($4::text[])
           AND (s.lock_id, s.owner) IN (SELECT * FROM unnest($4::text[], $5::text[]))
           AND s.session_start IS NOT NULL
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_stat_get_activity(NULL) AS a
                            WHERE a.pid = s.taker_pid
                              AND a.backend_start = s.session_start)
           FOR UPDATE SKIP LOCKED),
     x AS (DELETE FROM lockext.locks AS l
            USING xc AS c
            WHERE l.lock_id = ANY (ARRAY(SELECT lock_id FROM xc))
              AND l.lock_id = c.lock_id AND l.owner = c.owner
           RETURNING l.lock_id, l.fence_token),
     sh AS (DELETE FROM lockext.shared_leases AS l
             USING shc AS c
             WHERE l.lock_id = ANY (ARRAY(SELECT lock_id FROM shc))
               AND l.lock_id = c.lock_id AND l.owner = c.owner
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
       CASE WHEN $1 THEN pg_catalog.pg_notify('lockext', pg_catalog.json_build_object(
           'event', 'session_ended', 'lock_id', lock_id, 'fence_token', fence_token,
           'previous_fence_token', NULL)::text) END
  FROM reaped
