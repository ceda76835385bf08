-- Views for operators.

-- Who holds what: one row per live lease, joinable with pg_stat_activity on pid.
CREATE VIEW lockext.holders AS
SELECT l.lock_id,
       'exclusive'::text                                      AS mode,
       l.owner,
       l.fence_token,
       l.holder_role::regrole                                 AS role,
       l.application_name,
       l.client_addr,
       l.taker_pid                                            AS pid,
       l.acquired_at,
       l.expires_at,
       l.expires_at - pg_catalog.clock_timestamp()            AS time_left,
       l.renewals
  FROM lockext.locks l
 WHERE l.expires_at > pg_catalog.clock_timestamp();

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
