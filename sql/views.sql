-- Views for operators.

-- Who holds what: one row per live lease of any kind (exclusive, shared, or one permit of
-- a semaphore), joinable with pg_stat_activity on pid.
CREATE VIEW lockext.holders AS
SELECT h.lock_id,
       h.mode,
       h.owner,
       h.fence_token,
       h.holder_role::regrole                                 AS role,
       h.application_name,
       h.client_addr,
       h.taker_pid                                            AS pid,
       h.acquired_at,
       h.expires_at,
       h.expires_at - pg_catalog.clock_timestamp()            AS time_left,
       h.renewals,
       h.permits,
       h.session_start IS NOT NULL                            AS session_bound
  FROM (SELECT 'exclusive'::text AS mode, NULL::integer AS permits, lock_id, owner, fence_token,
               holder_role, application_name, client_addr, taker_pid, acquired_at, expires_at,
               renewals, session_start
          FROM lockext.locks
        UNION ALL
        SELECT CASE WHEN permits IS NULL THEN 'shared' ELSE 'permit' END, permits, lock_id,
               owner, fence_token, holder_role, application_name, client_addr, taker_pid,
               acquired_at, expires_at, renewals, session_start
          FROM lockext.shared_leases) AS h
 WHERE h.expires_at > pg_catalog.clock_timestamp();

-- What lockext did since the server started or lockext.stats_reset(), cluster-wide
-- (empty unless lockext is preloaded).
CREATE VIEW lockext.stats AS
SELECT name, value, since FROM lockext.stats();

-- Who waits for which lock, oldest first; position 1 is next in line (empty unless
-- lockext is preloaded).
CREATE VIEW lockext.waiters AS
SELECT lock_id, database, pid, waiting_since, pg_catalog.clock_timestamp() - waiting_since AS waited,
       position
  FROM lockext.waiters();

GRANT SELECT ON lockext.holders, lockext.stats, lockext.waiters TO PUBLIC;
