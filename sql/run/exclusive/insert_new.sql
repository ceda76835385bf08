-- A new exclusive lease, where the lock id has none: nothing when another was inserted
-- first. Returns what take_over.sql returns.
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 ttl, $5 now (the call's clock),
-- $6 token (the new grant's), $7 lock_delay, $8 session_start (NULL: not session-bound),
-- $9 permits, $10 slot, $11 keepalive (NULL: none) (grant::Params, ACQUIRE_PARAMS: every
-- acquire statement takes all eleven)
INSERT INTO lockext.locks AS l
       (lock_id, owner, holder_role, fence_token, acquired_at, expires_at, renewals,
        lock_delay, session_start, taker_pid, application_name, client_addr, keepalive)
VALUES ($1, $2, $3, $6, $5, CASE WHEN $11 IS NULL THEN $5 + $4 ELSE 'infinity' END, 0, $7, $8, pg_backend_pid(),
        current_setting('application_name'), inet_client_addr(), $11)
    ON CONFLICT (lock_id) DO NOTHING
RETURNING l.lock_id, l.owner, l.fence_token, l.acquired_at,
          lockext.lease_expiry(l.expires_at, l.keepalive) AS expires_at,
          true AS minted, NULL::bigint AS previous_token
