-- 0.2.0's lock_renew: the caller's own exclusive lease, by lock id and owner, extended
-- when live, its renewals counted.
-- The row changed is named by its key ($1, $2) as well as joined to c: an index condition
-- whatever the statistics say (with none, a join on c alone read every lease per call).
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 ttl, $5 now (the call's clock),
-- $6 fence_token (NULL: whichever grant the caller holds)
UPDATE lockext.locks AS l
   SET expires_at = $5 + $4,
       renewals = l.renewals + 1
  FROM (SELECT lock_id, owner
          FROM lockext.locks
         WHERE lock_id = $1 AND owner = $2 AND expires_at > $5 AND holder_role = $3
           AND ($6::bigint IS NULL OR fence_token = $6)
           FOR UPDATE SKIP LOCKED) AS c
 WHERE l.lock_id = $1 AND l.owner = $2 AND l.lock_id = c.lock_id AND l.owner = c.owner
RETURNING l.expires_at
