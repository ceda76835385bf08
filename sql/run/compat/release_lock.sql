-- An older SQL version's lock_release (0.1.0 and 0.2.0): deletes the caller's own
-- exclusive lease, live or not (deleting a dead one is cleanup), and says whether it was
-- live: only then did the caller hold the lock.
-- The row changed is named by its key ($1, $2) as well as joined to c: an index condition
-- whatever the statistics say (with none, a join on c alone read every lease per call).
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 now (the call's clock),
-- $5 fence_token (NULL: whichever grant the caller holds)
DELETE FROM lockext.locks AS l
 USING (SELECT lock_id, owner, expires_at > $4 AS live
          FROM lockext.locks
         WHERE lock_id = $1 AND owner = $2 AND holder_role = $3
           AND ($5::bigint IS NULL OR fence_token = $5)
           FOR UPDATE SKIP LOCKED) AS c
 WHERE l.lock_id = $1 AND l.owner = $2 AND l.lock_id = c.lock_id AND l.owner = c.owner
RETURNING c.live, l.fence_token
