-- lock_keepalive_revoke: ends the keep-alive (never renewed again, its expiry moved back
-- to now if it was later) and deletes every lease attached to it, each with an event:
-- 'released' when the keep-alive was live, 'expired' when it had already run out. A lease
-- row someone holds locked right now is skipped: it stays attached to an ended keep-alive,
-- dead, and the reaper or the next grant of its lock id clears it. One row per lease
-- deleted; one row with lock_id NULL when none was; no row when the caller holds no such
-- keep-alive (or it is locked by a renewal right now). A lockext_admin member may revoke
-- another role's keep-alive.
-- The values of the grants it deletes (lockext.lease_values, src/election.rs) go in the
-- same statement, found by the deleted rows' keys.
-- A value row that another transaction holds locked (a setter's) is skipped, not waited
-- for, and left to the reaper's sweep (reap_values.sql).
-- $1 keepalive, $2 role (the calling role), $3 now (the call's clock), $4 notify
-- (lockext.notify: send events)
WITH k AS (UPDATE lockext.keepalives AS k
              SET ended = true, expires_at = least(k.expires_at, $3)
             FROM (SELECT keepalive, expires_at > $3 AS live
                     FROM lockext.keepalives
                    WHERE keepalive = $1
                      AND (holder_role = $2 OR pg_has_role($2, 'lockext_admin', 'USAGE'))
                      FOR NO KEY UPDATE SKIP LOCKED) AS c
            WHERE k.keepalive = c.keepalive
           RETURNING k.keepalive, c.live),
     x AS (DELETE FROM lockext.locks AS l
            USING (SELECT lock_id, owner FROM lockext.locks
                    WHERE keepalive = $1 FOR UPDATE SKIP LOCKED) AS c, k
            WHERE l.lock_id = c.lock_id AND l.owner = c.owner
           RETURNING l.lock_id, l.fence_token),
     sh AS (DELETE FROM lockext.shared_leases AS l
             USING (SELECT lock_id, owner FROM lockext.shared_leases
                     WHERE keepalive = $1 FOR UPDATE SKIP LOCKED) AS c, k
             WHERE l.lock_id = c.lock_id AND l.owner = c.owner
            RETURNING l.lock_id, l.fence_token),
     ended AS (SELECT lock_id, fence_token FROM x
               UNION ALL
               SELECT lock_id, fence_token FROM sh),
     ended_values AS MATERIALIZED (
             SELECT v.lock_id, v.fence_token
               FROM lockext.lease_values AS v
              WHERE v.lock_id = ANY (ARRAY(SELECT lock_id FROM ended))
                AND (v.lock_id, v.fence_token) IN (SELECT lock_id, fence_token FROM ended)
                FOR UPDATE OF v SKIP LOCKED),
     values_gone AS (DELETE FROM lockext.lease_values AS v
                      USING ended_values AS e
                      WHERE v.lock_id = ANY (ARRAY(SELECT lock_id FROM ended_values))
                        AND v.lock_id = e.lock_id AND v.fence_token = e.fence_token)
SELECT e.lock_id,
       CASE WHEN $4 AND e.lock_id IS NOT NULL THEN pg_catalog.pg_notify('lockext',
           pg_catalog.json_build_object(
               'event', CASE WHEN k.live THEN 'released' ELSE 'expired' END,
               'lock_id', e.lock_id, 'fence_token', e.fence_token,
               'previous_fence_token', NULL)::text) END AS notified
  FROM k LEFT JOIN ended AS e ON true
