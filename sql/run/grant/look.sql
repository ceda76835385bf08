-- The look (run under the newest snapshot, after passing the gate): every lease of the
-- lock id, of either table, as plain by-value columns. Each kind sums them up its own way:
-- one append of two index probes starts faster in the executor than joins and aggregates
-- that summed them up in SQL (docs/profile-2026-12-01.md).
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
       lockext.free_at(lockext.lease_expiry(expires_at, keepalive), lock_delay),
       owner = $2 AND holder_role = $3, owner = $2, permits
  FROM lockext.shared_leases
 WHERE lock_id = $1
