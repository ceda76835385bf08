-- lockext 0.1.0 -> 0.2.0: ALTER EXTENSION lockext UPDATE TO '0.2.0'
-- Adds waiting (lock_acquire's wait and lock_delay arguments, lockext.waiters) and what
-- operators see: who took each lease (lockext.holders), counters (lockext.stats,
-- lockext.stats_reset). Leases, resources and tokens are untouched.
\echo Use "ALTER EXTENSION lockext UPDATE TO '0.2.0'" to load this file. \quit

ALTER TABLE lockext.locks
    ADD COLUMN renewals         integer NOT NULL DEFAULT 0,
    ADD COLUMN taker_pid        integer,
    ADD COLUMN application_name text,
    ADD COLUMN client_addr      inet,
    ADD COLUMN lock_delay       interval NOT NULL DEFAULT '0';

-- Never truncated by (auto)vacuum: that takes an ACCESS EXCLUSIVE lock lock calls would wait on.
ALTER TABLE lockext.locks SET (vacuum_truncate = false);

-- lock_acquire gains two arguments with defaults: calls with three still work.
DROP FUNCTION lockext.lock_acquire(text, text, interval);
CREATE FUNCTION lockext."lock_acquire"(
    "lock_id" TEXT,
    "owner" TEXT,
    "ttl" interval,
    "wait" interval DEFAULT '0 seconds',
    "lock_delay" interval DEFAULT NULL
) RETURNS lockext.lock_grant
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_acquire_wrapper';
REVOKE ALL ON FUNCTION lockext.lock_acquire(text, text, interval, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.lock_acquire(text, text, interval, interval, interval) TO lockext_user;

CREATE FUNCTION lockext."waiters"() RETURNS TABLE (
    "lock_id" TEXT,
    "database" oid,
    "pid" INT,
    "waiting_since" timestamp with time zone,
    "position" bigint
)
STRICT VOLATILE PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'waiters_wrapper';

CREATE FUNCTION lockext."stats"() RETURNS TABLE (
    "name" TEXT,
    "value" bigint,
    "since" timestamp with time zone
)
STRICT VOLATILE PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'stats_wrapper';

CREATE FUNCTION lockext."stats_reset"() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'stats_reset_wrapper';

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

CREATE VIEW lockext.stats AS
SELECT name, value, since FROM lockext.stats();

CREATE VIEW lockext.waiters AS
SELECT lock_id, database, pid, waiting_since, pg_catalog.clock_timestamp() - waiting_since AS waited,
       position
  FROM lockext.waiters();

GRANT SELECT ON lockext.holders, lockext.stats, lockext.waiters TO PUBLIC;
REVOKE ALL ON FUNCTION lockext.stats_reset() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.stats_reset() TO lockext_admin;
