-- Whether that exclusive grant, the role's, is live now (run under the newest snapshot,
-- whatever the caller's snapshot says).
-- $1 lock_id, $2 fence_token, $3 role (the calling role)
SELECT EXISTS (SELECT FROM lockext.locks
                WHERE lock_id = $1 AND fence_token = $2 AND holder_role = $3
                  AND lockext.lease_expiry(expires_at, keepalive) > clock_timestamp()) AS live
