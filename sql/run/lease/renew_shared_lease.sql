-- lock_renew: extends the caller's live shared lease or permit, found by lock id and owner (renew
-- and release look in either table), and counts the renewal. A lockext_admin member may
-- renew another role's lease.
-- A lease attached to a keep-alive is left as it is and returned with its keepalive, which
-- lock_renew refuses (its keep-alive renews it).
-- The row changed is named by its key ($1, $2) as well as joined to c: an index condition
-- whatever the statistics say (with none, a join on c alone read every lease per call).
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 now (the call's clock),
-- $5 fence_token (NULL: whichever grant the caller holds), $6 ttl (lease::Held, RENEW_PARAMS)
UPDATE lockext.shared_leases AS l
   SET expires_at = CASE WHEN l.keepalive IS NULL THEN $4 + $6 ELSE l.expires_at END,
       renewals = CASE WHEN l.keepalive IS NULL THEN l.renewals + 1 ELSE l.renewals END
  FROM (SELECT lock_id, owner
          FROM lockext.shared_leases
         WHERE lock_id = $1 AND owner = $2 AND lockext.lease_expiry(expires_at, keepalive) > $4
           AND (holder_role = $3 OR pg_has_role($3, 'lockext_admin', 'USAGE'))
           AND ($5::bigint IS NULL OR fence_token = $5)
           FOR UPDATE SKIP LOCKED) AS c
 WHERE l.lock_id = $1 AND l.owner = $2 AND l.lock_id = c.lock_id AND l.owner = c.owner
RETURNING l.lock_id, l.expires_at, l.keepalive
