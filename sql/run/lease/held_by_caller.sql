-- Is the caller's lease live (by the clock of the call), in either table? Run under the
-- newest snapshot. Parameters as release_lock.sql's (lease::Held, HELD_PARAMS):
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 now (the call's clock),
-- $5 fence_token (NULL: whichever grant the caller holds)
SELECT EXISTS (SELECT FROM lockext.locks
                WHERE lock_id = $1 AND owner = $2 AND lockext.lease_expiry(expires_at, keepalive) > $4
                  AND (holder_role = $3 OR pg_has_role($3, 'lockext_admin', 'USAGE'))
                  AND ($5::bigint IS NULL OR fence_token = $5))
    OR EXISTS (SELECT FROM lockext.shared_leases
                WHERE lock_id = $1 AND owner = $2 AND lockext.lease_expiry(expires_at, keepalive) > $4
                  AND (holder_role = $3 OR pg_has_role($3, 'lockext_admin', 'USAGE'))
                  AND ($5::bigint IS NULL OR fence_token = $5)) AS held
