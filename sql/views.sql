-- Views for operators.

-- Who holds what: one row per live lease of any kind (exclusive, shared, or one permit of
-- a semaphore), joinable with pg_stat_activity on pid. A lease attached to a keep-alive
-- shows the keep-alive's expiry, which is its own (src/keepalive.rs).
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
       h.session_start IS NOT NULL                            AS session_bound,
       h.keepalive
  FROM (SELECT l.mode, l.permits, l.lock_id, l.owner, l.fence_token, l.holder_role,
               l.application_name, l.client_addr, l.taker_pid, l.acquired_at,
               CASE WHEN l.keepalive IS NULL THEN l.expires_at
                    ELSE coalesce(k.expires_at, '-infinity') END AS expires_at,
               l.renewals, l.session_start, l.keepalive
          FROM (SELECT 'exclusive'::text AS mode, NULL::integer AS permits, lock_id, owner,
                       fence_token, holder_role, application_name, client_addr, taker_pid,
                       acquired_at, expires_at, renewals, session_start, keepalive
                  FROM lockext.locks
                UNION ALL
                SELECT CASE WHEN permits IS NULL THEN 'shared' ELSE 'permit' END, permits,
                       lock_id, owner, fence_token, holder_role, application_name, client_addr,
                       taker_pid, acquired_at, expires_at, renewals, session_start, keepalive
                  FROM lockext.shared_leases) AS l
          LEFT JOIN lockext.keepalives AS k ON k.keepalive = l.keepalive) AS h
 WHERE h.expires_at > pg_catalog.clock_timestamp();

-- Keep-alives, live or not yet cleared by the reaper, with how many leases each renews.
CREATE VIEW lockext.keepalive_holders AS
SELECT k.keepalive,
       k.holder_role::regrole                                 AS role,
       k.application_name,
       k.client_addr,
       k.taker_pid                                            AS pid,
       k.created_at,
       k.expires_at,
       k.expires_at - pg_catalog.clock_timestamp()            AS time_left,
       k.ttl,
       k.renewals,
       k.ended,
       (SELECT pg_catalog.count(*) FROM lockext.locks AS l WHERE l.keepalive = k.keepalive)
     + (SELECT pg_catalog.count(*) FROM lockext.shared_leases AS s WHERE s.keepalive = k.keepalive)
                                                              AS leases
  FROM lockext.keepalives AS k;

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

GRANT SELECT ON lockext.holders, lockext.keepalive_holders, lockext.stats, lockext.waiters TO PUBLIC;
