-- The common grant in one statement: a new exclusive lease where the lock id has no lease
-- row at all, in either table (none live, none dead, none being deleted). Nothing when one
-- exists: the look (grant/look.sql) and the steps after it decide then. Run only under a
-- snapshot taken after the gate was passed (READ COMMITTED: each statement's own), so the
-- one-time NOT EXISTS checks see every lease committed before; no acquire of the id can be
-- in flight past its gate, so no row can appear between the checks and the insert, and the
-- insert needs no ON CONFLICT (whose speculative insertion costs a WAL record of its own).
-- The token is minted in the statement (lockext.grant_token, $6 unused), only once the
-- checks passed: a statement that grants nothing mints nothing.
-- Returns what take_over.sql returns.
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 ttl, $5 now (the call's clock),
-- $6 token (the new grant's), $7 lock_delay, $8 session_start (NULL: not session-bound),
-- $9 permits, $10 slot, $11 keepalive (NULL: none) (grant::Params, ACQUIRE_PARAMS: every
-- acquire statement takes all eleven)
INSERT INTO lockext.locks AS l
       (lock_id, owner, holder_role, fence_token, acquired_at, expires_at, renewals,
        lock_delay, session_start, taker_pid, application_name, client_addr, keepalive)
SELECT $1, $2, $3, lockext.grant_token(), $5, CASE WHEN $11 IS NULL THEN $5 + $4 ELSE 'infinity' END, 0, $7, $8,
       pg_backend_pid(), current_setting('application_name'), inet_client_addr(), $11
 WHERE NOT EXISTS (SELECT FROM lockext.locks WHERE lock_id = $1)
   AND NOT EXISTS (SELECT FROM lockext.shared_leases WHERE lock_id = $1)
RETURNING l.lock_id, l.owner, l.fence_token, l.acquired_at,
          lockext.lease_expiry(l.expires_at, l.keepalive) AS expires_at,
          true AS minted, NULL::bigint AS previous_token
