-- A shared acquire's look (run under the newest snapshot, after passing the gate): the
-- exclusive lease, the caller's own row, and one live permit of someone else's if there is
-- any (then the id is a semaphore). Not every shared lease of the id: a shared acquire
-- does not depend on the others, and reading them all made it cost as much as there were
-- holders. Columns as look.sql's.
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 ttl, $5 now (the call's clock),
-- $6 token (the new grant's), $7 lock_delay, $8 session_start (NULL: not session-bound),
-- $9 permits, $10 slot, $11 keepalive (NULL: none) (grant::Params, ACQUIRE_PARAMS: every
-- acquire statement takes all eleven)
SELECT false AS shared, lockext.lease_expiry(expires_at, keepalive) AS expires_at,
       lockext.free_at(lockext.lease_expiry(expires_at, keepalive), lock_delay) AS free_at,
       owner = $2 AND holder_role = $3 AS mine, owner = $2 AS owner_named,
       NULL::integer AS permits
  FROM lockext.locks
 WHERE lock_id = $1
UNION ALL
SELECT true, lockext.lease_expiry(expires_at, keepalive),
       lockext.free_at(lockext.lease_expiry(expires_at, keepalive), lock_delay), holder_role = $3, true,
       permits
  FROM lockext.shared_leases
 WHERE lock_id = $1 AND owner = $2
UNION ALL
(SELECT true, lockext.lease_expiry(expires_at, keepalive),
       lockext.free_at(lockext.lease_expiry(expires_at, keepalive), lock_delay), false, false, permits
   FROM lockext.shared_leases
  WHERE lock_id = $1 AND permits IS NOT NULL AND owner <> $2
    AND lockext.lease_expiry(expires_at, keepalive) + lock_delay > $5
  LIMIT 1)
