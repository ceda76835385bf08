-- lock_release: deletes the caller's shared lease or permit (found by lock id and owner) whether or
-- not it has expired (that is only cleanup), and reports whether the lease was still live:
-- only then did the caller hold the lock. A lockext_admin member may release another
-- role's lease.
-- The row changed is named by its key ($1, $2) as well as joined to c: an index condition
-- whatever the statistics say (with none, a join on c alone read every lease per call).
-- The values of the grants it deletes (lockext.lease_values, src/election.rs) go in the
-- same statement: one probe of the values' key for each row deleted (a LATERAL subquery:
-- whatever the statistics say, no plan compares every value with every row), then a
-- delete by the values' row addresses (a TID scan).
-- A value row that another transaction holds locked (a setter's) is skipped, not waited
-- for, and so is one a setter changed after the statement's snapshot (its newest version
-- is not the one the delete sees): both are left to the reaper's sweep (reap_values.sql).
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 now (the call's clock),
-- $5 fence_token (NULL: whichever grant the caller holds) (lease::Held, HELD_PARAMS)
WITH released AS (DELETE FROM lockext.shared_leases AS l
                    USING (SELECT lock_id, owner, lockext.lease_expiry(expires_at, keepalive) > $4 AS live
                             FROM lockext.shared_leases
                            WHERE lock_id = $1 AND owner = $2
                              AND (holder_role = $3 OR pg_has_role($3, 'lockext_admin', 'USAGE'))
                              AND ($5::bigint IS NULL OR fence_token = $5)
                              FOR UPDATE SKIP LOCKED) AS c
                    WHERE l.lock_id = $1 AND l.owner = $2 AND l.lock_id = c.lock_id AND l.owner = c.owner
                   RETURNING c.live, l.lock_id, l.fence_token),
     ended_values AS MATERIALIZED (
             SELECT x.ctid
               FROM released AS r,
                    LATERAL (SELECT v.ctid FROM lockext.lease_values AS v
                              WHERE v.lock_id = r.lock_id AND v.fence_token = r.fence_token
                                FOR UPDATE SKIP LOCKED) AS x),
     values_gone AS (DELETE FROM lockext.lease_values AS v
                      WHERE v.ctid = ANY (ARRAY(SELECT ctid FROM ended_values)))
SELECT live, fence_token FROM released
