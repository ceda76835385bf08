-- lock_holders and lock_observe: the live grants of a lock id (by the call's clock), oldest
-- grant (lowest token) first, each with its value and the value's version (0: none set).
-- The first row is the leader, as in etcd's election: for an exclusive lock its only
-- holder, for shared leases and permits the oldest grant still live. A value whose grant
-- is not live is never shown: the join is on the live lease's token.
-- $1 lock_id, $2 now (the call's clock), $3 limit (NULL: every holder)
SELECT h.owner, h.kind, h.fence_token, v.value, coalesce(v.version, 0) AS version,
       h.acquired_at, h.expires_at
  FROM (SELECT 'exclusive'::text AS kind, owner, fence_token, acquired_at,
               lockext.lease_expiry(expires_at, keepalive) AS expires_at
          FROM lockext.locks
         WHERE lock_id = $1 AND lockext.lease_expiry(expires_at, keepalive) > $2
        UNION ALL
        SELECT CASE WHEN permits IS NULL THEN 'shared' ELSE 'permit' END, owner, fence_token,
               acquired_at, lockext.lease_expiry(expires_at, keepalive)
          FROM lockext.shared_leases
         WHERE lock_id = $1 AND lockext.lease_expiry(expires_at, keepalive) > $2) AS h
  LEFT JOIN lockext.lease_values AS v ON v.lock_id = $1 AND v.fence_token = h.fence_token
 ORDER BY h.fence_token
 LIMIT $3
