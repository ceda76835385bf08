-- lock_keepalive_revoke, second statement (after revoke.sql ended the keep-alive, under
-- a snapshot taken after that, which sees every lease attached before it): deletes every
-- lease attached to it, each with an event: 'released' when the keep-alive was live, 'expired'
-- when it had already run out. A lease row someone holds locked right now is skipped: it
-- stays attached to an ended keep-alive, dead, and the reaper or the next grant of its lock
-- id clears it. One row per lease deleted.
-- The values of the grants it deletes (lockext.lease_values, src/election.rs) go in the
-- same statement: one probe of the values' key for each row deleted (a LATERAL subquery:
-- whatever the statistics say, no plan compares every value with every row), then a
-- delete by the values' row addresses (a TID scan).
-- A value row that another transaction holds locked (a setter's) is skipped, not waited
-- for, and so is one a setter changed after the statement's snapshot (its newest version
-- is not the one the delete sees): both are left to the reaper's sweep (reap_values.sql).
-- $1 keepalive, $2 live (the keep-alive was live when revoked), $3 notify (lockext.notify:
-- send events)
WITH x AS (DELETE FROM lockext.locks AS l
            USING (SELECT lock_id, owner FROM lockext.locks
                    WHERE keepalive = $1 FOR UPDATE SKIP LOCKED) AS c
            WHERE l.lock_id = c.lock_id AND l.owner = c.owner
           RETURNING l.lock_id, l.fence_token),
     sh AS (DELETE FROM lockext.shared_leases AS l
             USING (SELECT lock_id, owner FROM lockext.shared_leases
                     WHERE keepalive = $1 FOR UPDATE SKIP LOCKED) AS c
             WHERE l.lock_id = c.lock_id AND l.owner = c.owner
            RETURNING l.lock_id, l.fence_token),
     ended AS (SELECT lock_id, fence_token FROM x
               UNION ALL
               SELECT lock_id, fence_token FROM sh),
     ended_values AS MATERIALIZED (
             SELECT x.ctid
               FROM ended AS r,
                    LATERAL (SELECT v.ctid FROM lockext.lease_values AS v
                              WHERE v.lock_id = r.lock_id AND v.fence_token = r.fence_token
                                FOR UPDATE SKIP LOCKED) AS x),
     values_gone AS (DELETE FROM lockext.lease_values AS v
                      WHERE v.ctid = ANY (ARRAY(SELECT ctid FROM ended_values)))
SELECT e.lock_id,
       CASE WHEN $3 THEN pg_catalog.pg_notify('lockext',
           pg_catalog.json_build_object(
               'event', CASE WHEN $2 THEN 'released' ELSE 'expired' END,
               'lock_id', e.lock_id, 'fence_token', e.fence_token,
               'previous_fence_token', NULL)::text) END AS notified
  FROM ended AS e
