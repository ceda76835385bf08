-- The caller's own shared lease or permit: extended when live (same grant, same slot),
-- renewed with a new token (and the slot just claimed) when not. A row of the same owner
-- name but another role is taken only once it is free. Returns what
-- exclusive/take_over.sql returns.
-- A lease dead because its keep-alive expired is taken only once that keep-alive is ended
-- (lockext.end_keepalive; see grant/clear_dead_exclusive.sql). The grant is attached to
-- keep-alive $11 (its own expiry then 'infinity': lockext.lease_expiry), or to none.
-- The row changed is named by its key ($1, $2) as well as joined to c: an index condition
-- whatever the statistics say (with none, a join on c alone read every lease per call).
-- A take-over that mints a new token deletes the replaced grant's value
-- (lockext.lease_values, src/election.rs) in the same statement, found by one probe of the
-- values' key (a LATERAL subquery) and deleted by its row address; the caller's own grant
-- extended keeps it.
-- A value row that another transaction holds locked (a setter's) is skipped, not waited
-- for, and so is one a setter changed after the statement's snapshot (its newest version
-- is not the one the delete sees): both are left to the reaper's sweep (reap_values.sql).
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 ttl, $5 now (the call's clock),
-- $6 token (the new grant's), $7 lock_delay, $8 session_start (NULL: not session-bound),
-- $9 permits, $10 slot, $11 keepalive (NULL: none) (grant::Params, ACQUIRE_PARAMS: every
-- acquire statement takes all eleven)
WITH taken AS (UPDATE lockext.shared_leases AS l
                   SET permits = $9,
                       slot = CASE WHEN c.same_grant THEN l.slot ELSE $10 END,
                       owner = $2,
                       holder_role = $3,
                       fence_token = CASE WHEN c.same_grant THEN l.fence_token ELSE $6 END,
                       acquired_at = CASE WHEN c.same_grant THEN l.acquired_at ELSE $5 END,
                       expires_at = CASE WHEN $11 IS NULL THEN $5 + $4 ELSE 'infinity' END,
                       keepalive = $11,
                       renewals = CASE WHEN c.same_grant THEN l.renewals + 1 ELSE 0 END,
                       lock_delay = $7,
                       session_start = $8,
                       taker_pid = pg_backend_pid(),
                       application_name = current_setting('application_name'),
                       client_addr = inet_client_addr()
                  FROM (SELECT lock_id, owner, fence_token AS old_token,
                               lockext.lease_expiry(expires_at, keepalive) > $5 AND holder_role = $3 AS same_grant
                          FROM lockext.shared_leases
                         WHERE lock_id = $1 AND owner = $2
                           AND (holder_role = $3
                                OR lockext.lease_expiry(expires_at, keepalive) + lock_delay <= $5
                                   AND (keepalive IS NULL OR lockext.end_keepalive(keepalive, $5)))
                           FOR UPDATE SKIP LOCKED) AS c
                 WHERE l.lock_id = $1 AND l.owner = $2 AND l.lock_id = c.lock_id AND l.owner = c.owner
                RETURNING l.lock_id, l.owner, l.fence_token, l.acquired_at,
                          lockext.lease_expiry(l.expires_at, l.keepalive) AS expires_at,
                          NOT c.same_grant AS minted, c.old_token AS previous_token),
     ended_values AS MATERIALIZED (
             SELECT x.ctid
               FROM taken AS r,
                    LATERAL (SELECT v.ctid FROM lockext.lease_values AS v
                              WHERE v.lock_id = r.lock_id AND v.fence_token = r.previous_token
                                FOR UPDATE SKIP LOCKED) AS x
              WHERE r.minted),
     values_gone AS (DELETE FROM lockext.lease_values AS v
                      WHERE v.ctid = ANY (ARRAY(SELECT ctid FROM ended_values)))
SELECT lock_id, owner, fence_token, acquired_at, expires_at, minted, previous_token FROM taken
