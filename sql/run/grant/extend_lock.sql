-- Extends the caller's own live exclusive lease, the same grant; never takes anything new.
-- Returns what exclusive/take_over.sql returns.
-- The row changed is named by its key ($1, $2) as well as joined to c: an index condition
-- whatever the statistics say (with none, a join on c alone read every lease per call).
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 ttl, $5 now (the call's clock),
-- $6 token (the new grant's), $7 lock_delay, $8 session_start (NULL: not session-bound),
-- $9 permits, $10 slot, $11 keepalive (NULL: none) (grant::Params, ACQUIRE_PARAMS: every
-- acquire statement takes all eleven)
UPDATE lockext.locks AS l
   SET owner = $2,
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
  FROM (SELECT lock_id, owner, fence_token AS old_token, true AS same_grant
          FROM lockext.locks
         WHERE lock_id = $1 AND owner = $2 AND holder_role = $3
           AND lockext.lease_expiry(expires_at, keepalive) > $5
           FOR UPDATE SKIP LOCKED) AS c
 WHERE l.lock_id = $1 AND l.owner = $2 AND l.lock_id = c.lock_id AND l.owner = c.owner
RETURNING l.lock_id, l.owner, l.fence_token, l.acquired_at,
          lockext.lease_expiry(l.expires_at, l.keepalive) AS expires_at,
          false AS minted, c.old_token AS previous_token
