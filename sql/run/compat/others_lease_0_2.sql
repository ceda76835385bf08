-- Whether another role's lease matches, in either table, for an administrator's renew or
-- release (0.2.0).
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 fence_token (NULL: any)
SELECT EXISTS (SELECT FROM lockext.locks
                WHERE lock_id = $1 AND owner = $2
                  AND holder_role <> $3 AND ($4::bigint IS NULL OR fence_token = $4))
    OR EXISTS (SELECT FROM lockext.shared_leases
                WHERE lock_id = $1 AND owner = $2
                  AND holder_role <> $3 AND ($4::bigint IS NULL OR fence_token = $4))
       AS others
