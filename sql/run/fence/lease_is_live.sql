-- lock_check: whether a grant of either table is live now, by the server's clock (run
-- under the newest snapshot).
-- $1 lock_id, $2 fence_token
SELECT EXISTS (SELECT FROM lockext.locks
                WHERE lock_id = $1 AND fence_token = $2 AND lockext.lease_expiry(expires_at, keepalive) > clock_timestamp())
    OR EXISTS (SELECT FROM lockext.shared_leases
                WHERE lock_id = $1 AND fence_token = $2 AND lockext.lease_expiry(expires_at, keepalive) > clock_timestamp()) AS live
