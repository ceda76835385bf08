-- lockext 0.1.0 -> 0.2.0: ALTER EXTENSION lockext UPDATE TO '0.2.0'
-- Adds what operators see: who took each lease (lockext.holders), counters
-- (lockext.stats, lockext.stats_reset). Leases, resources and tokens are untouched.
\echo Use "ALTER EXTENSION lockext UPDATE TO '0.2.0'" to load this file. \quit

ALTER TABLE lockext.locks
    ADD COLUMN renewals         integer NOT NULL DEFAULT 0,
    ADD COLUMN taker_pid        integer,
    ADD COLUMN application_name text,
    ADD COLUMN client_addr      inet;

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

GRANT SELECT ON lockext.holders, lockext.stats TO PUBLIC;
REVOKE ALL ON FUNCTION lockext.stats_reset() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.stats_reset() TO lockext_admin;
