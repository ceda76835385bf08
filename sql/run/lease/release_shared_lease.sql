-- lock_release: deletes the caller's shared lease or permit (found by lock id and owner) whether or
-- not it has expired (that is only cleanup), and reports whether the lease was still live:
-- only then did the caller hold the lock. A lockext_admin member may release another
-- role's lease.
-- The row changed is named by its key ($1, $2) as well as joined to c: an index condition
-- whatever the statistics say (with none, a join on c alone read every lease per call).
-- The values of the grant it deletes (lockext.lease_values, src/election.rs) are deleted by
-- a second statement (end_values.sql), run only when has_values says there are some: most
-- leases have none, and a data-modifying CTE for them cost about a tenth of a cycle's CPU
-- (its executor start-up, paid on every release). has_values reads under this statement's
-- snapshot, so it is true whenever a value the same statement could have deleted exists;
-- end_values.sql, under the same snapshot or a newer one, deletes those (and any committed
-- since, in READ COMMITTED).
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 now (the call's clock),
-- $5 fence_token (NULL: whichever grant the caller holds) (lease::Held, HELD_PARAMS)
DELETE FROM lockext.shared_leases AS l
 USING (SELECT lock_id, owner, lockext.lease_expiry(expires_at, keepalive) > $4 AS live
          FROM lockext.shared_leases
         WHERE lock_id = $1 AND owner = $2
           AND (holder_role = $3 OR pg_has_role($3, 'lockext_admin', 'USAGE'))
           AND ($5::bigint IS NULL OR fence_token = $5)
           FOR UPDATE SKIP LOCKED) AS c
 WHERE l.lock_id = $1 AND l.owner = $2 AND l.lock_id = c.lock_id AND l.owner = c.owner
RETURNING c.live, l.fence_token,
          EXISTS (SELECT FROM lockext.lease_values AS v
                   WHERE v.lock_id = l.lock_id AND v.fence_token = l.fence_token) AS has_values
