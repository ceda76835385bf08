-- lock_set_value and lock_campaign: stores the value of the caller's live grant, the one
-- with exactly this lock id, owner, role and token, and counts its version (1 for the
-- first value of a grant). A value belongs to one grant (its token): a holder whose lease
-- ran out, was released or taken over matches no live lease and changes nothing, and a
-- value stored a moment before that happened belongs to a grant no reader shows
-- (holders.sql joins on the live lease's token). No lease row is locked: a setter never
-- delays a grant, renewal or release. Where it stores, it deletes the values of this lock
-- id whose grant is gone (released, taken over, or its expired lease reaped: no lease row
-- has its token), which nobody shows, skipping any another transaction has locked (a
-- stale holder's open transaction must not hold up the new holder). An expired lease in
-- its lock-delay keeps its value: a renewal that read the clock before the expiry may
-- still renew it.
-- What one role stores is bounded (lockext.role_values_size, $8): the values of its rows
-- (live grants' and ended ones' not deleted yet), each counted as at least 1 kB so that the
-- sum reads a bounded number of rows, plus this one, replacing this grant's own. Over it,
-- nothing changes (no row stored, no orphan deleted) and fits says so. The sum reads
-- committed rows: setters of one role running at the same moment each see the others'
-- rows only once committed.
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 now (the call's clock),
-- $5 fence_token, $6 value, $7 notify (lockext.notify: send a value_set event),
-- $8 role_values_size (bytes)
WITH held AS (
    SELECT lock_id, fence_token FROM lockext.locks
     WHERE lock_id = $1 AND owner = $2 AND fence_token = $5 AND holder_role = $3
       AND lockext.lease_expiry(expires_at, keepalive) > $4
    UNION ALL
    SELECT lock_id, fence_token FROM lockext.shared_leases
     WHERE lock_id = $1 AND owner = $2 AND fence_token = $5 AND holder_role = $3
       AND lockext.lease_expiry(expires_at, keepalive) > $4
), room AS (
    SELECT coalesce(sum(greatest(pg_column_size(o.value), 1024)), 0)
           + greatest(pg_column_size($6), 1024) <= $8 AS fits
      FROM lockext.lease_values AS o
     WHERE o.holder_role = $3 AND NOT (o.lock_id = $1 AND o.fence_token = $5)
), stored AS (
    INSERT INTO lockext.lease_values AS v
           (lock_id, fence_token, owner, value, version, set_at, holder_role)
    SELECT lock_id, fence_token, $2, $6, 1, $4, $3 FROM held WHERE (SELECT fits FROM room) LIMIT 1
    ON CONFLICT (lock_id, fence_token)
       DO UPDATE SET value = excluded.value, version = v.version + 1, set_at = excluded.set_at
    RETURNING v.lock_id, v.fence_token, v.version
), orphans AS (
    DELETE FROM lockext.lease_values AS v
     USING (SELECT lock_id, fence_token
              FROM lockext.lease_values AS o
             WHERE o.lock_id = $1 AND o.fence_token <> $5 AND EXISTS (SELECT FROM held)
               AND (SELECT fits FROM room)
               AND NOT EXISTS (SELECT FROM lockext.locks AS l
                                WHERE l.lock_id = o.lock_id AND l.fence_token = o.fence_token)
               AND NOT EXISTS (SELECT FROM lockext.shared_leases AS s
                                WHERE s.lock_id = o.lock_id AND s.fence_token = o.fence_token)
               FOR UPDATE SKIP LOCKED) AS orphan
     WHERE v.lock_id = orphan.lock_id AND v.fence_token = orphan.fence_token
)
SELECT s.version, r.fits, EXISTS (SELECT FROM held) AS held,
       CASE WHEN $7 AND s.version IS NOT NULL THEN pg_catalog.pg_notify('lockext',
           pg_catalog.json_build_object('event', 'value_set', 'lock_id', s.lock_id,
           'fence_token', s.fence_token, 'previous_fence_token', NULL,
           'version', s.version)::text) END AS notified
  FROM room AS r LEFT JOIN stored AS s ON true