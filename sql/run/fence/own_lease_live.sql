-- The same for a reader of a bound resource: whether a lease of any kind with that token,
-- the role's, is live now (run under the newest snapshot).
-- $1 lock_id, $2 fence_token, $3 role (the calling role)
SELECT EXISTS (SELECT FROM lockext.locks
                WHERE lock_id = $1 AND fence_token = $2 AND holder_role = $3
                  AND lockext.lease_expiry(expires_at, keepalive) > clock_timestamp())
    OR EXISTS (SELECT FROM lockext.shared_leases
                WHERE lock_id = $1 AND fence_token = $2 AND holder_role = $3
                  AND lockext.lease_expiry(expires_at, keepalive) > clock_timestamp()) AS live
