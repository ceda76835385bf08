-- lockext 0.1.0 -> 0.2.0: ALTER EXTENSION lockext UPDATE TO '0.2.0'
-- Adds waiting (lock_acquire's wait and lock_delay arguments, lockext.waiters); more kinds
-- of lease (shared leases and semaphore permits in lockext.shared_leases, sets of locks
-- with lock_acquire_all and lock_release_all, session-bound leases, the readers' fence);
-- and what operators see: who took each lease (lockext.holders), counters (lockext.stats,
-- lockext.stats_reset). Leases, resources and tokens are untouched.
\echo Use "ALTER EXTENSION lockext UPDATE TO '0.2.0'" to load this file. \quit

ALTER TABLE lockext.locks
    ADD COLUMN renewals         integer NOT NULL DEFAULT 0,
    ADD COLUMN taker_pid        integer,
    ADD COLUMN application_name text,
    ADD COLUMN client_addr      inet,
    ADD COLUMN lock_delay       interval NOT NULL DEFAULT '0',
    ADD COLUMN session_start    timestamptz;
CREATE INDEX locks_session_idx ON lockext.locks (taker_pid) WHERE session_start IS NOT NULL;

CREATE TABLE lockext.shared_leases (
    lock_id          text        NOT NULL,
    owner            text        NOT NULL,
    permits          integer     CHECK (permits > 0),
    slot             integer     CHECK (slot BETWEEN 1 AND permits),
    fence_token      bigint      NOT NULL,
    holder_role      oid         NOT NULL,
    acquired_at      timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    renewals         integer     NOT NULL DEFAULT 0,
    taker_pid        integer,
    application_name text,
    client_addr      inet,
    lock_delay       interval    NOT NULL DEFAULT '0',
    session_start    timestamptz,
    PRIMARY KEY (lock_id, owner)
);
ALTER TABLE lockext.shared_leases SET (vacuum_truncate = false);
CREATE INDEX shared_leases_expires_at_idx ON lockext.shared_leases (expires_at);
CREATE INDEX shared_leases_session_idx ON lockext.shared_leases (taker_pid) WHERE session_start IS NOT NULL;
SELECT pg_catalog.pg_extension_config_dump('lockext.shared_leases', '');
REVOKE ALL ON lockext.shared_leases FROM PUBLIC;
GRANT SELECT ON lockext.shared_leases TO PUBLIC;

-- Never truncated by (auto)vacuum: that takes an ACCESS EXCLUSIVE lock lock calls would wait on.
ALTER TABLE lockext.locks SET (vacuum_truncate = false);

-- lock_acquire gains arguments with defaults: calls with three still work.
DROP FUNCTION lockext.lock_acquire(text, text, interval);
CREATE FUNCTION lockext."lock_acquire"(
    "lock_id" TEXT,
    "owner" TEXT,
    "ttl" interval,
    "wait" interval DEFAULT '0 seconds',
    "lock_delay" interval DEFAULT NULL,
    "mode" TEXT DEFAULT 'exclusive',
    "permits" INT DEFAULT NULL,
    "session_bound" bool DEFAULT false
) RETURNS lockext.lock_grant
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_acquire_wrapper';

CREATE FUNCTION lockext."lock_acquire_all"(
    "lock_ids" TEXT[],
    "owner" TEXT,
    "ttl" interval,
    "wait" interval DEFAULT '0 seconds',
    "mode" TEXT DEFAULT 'exclusive',
    "session_bound" bool DEFAULT false
) RETURNS TABLE (
    "lock_id" TEXT,
    "owner" TEXT,
    "fence_token" bigint,
    "acquired_at" timestamp with time zone,
    "expires_at" timestamp with time zone
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_acquire_all_wrapper';

CREATE FUNCTION lockext."lock_release_all"(
    "lock_ids" TEXT[],
    "owner" TEXT
) RETURNS INT
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_release_all_wrapper';

-- The readers' fence: as in sql/fence.sql.
CREATE FUNCTION lockext.fence_read(resource_id text, fence_token bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    mark bigint;
BEGIN
    IF resource_id IS NULL THEN
        RAISE EXCEPTION 'resource_id must not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM lockext.check_token(fence_token);
    SELECT r.fence_token INTO mark FROM lockext.resources AS r
     WHERE r.resource_id = fence_read.resource_id FOR SHARE;
    IF mark > fence_token THEN
        RAISE EXCEPTION 'fence token % is stale for resource "%"', fence_token, resource_id
            USING ERRCODE = '55L01',
                  DETAIL = format('A writer with fence token %s has written since.', mark),
                  HINT = 'This client''s lease was lost: stop, and acquire the lock again.';
    END IF;
END $$;

CREATE FUNCTION lockext.fenced_read(resource_id text, fence_token bigint) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lockext.fence_read(resource_id, fence_token);
    RETURN (SELECT r.data FROM lockext.resources AS r WHERE r.resource_id = fenced_read.resource_id);
END $$;

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'lockext.lock_acquire(text, text, interval, interval, interval, text, integer, boolean)',
        'lockext.lock_acquire_all(text[], text, interval, interval, text, boolean)',
        'lockext.lock_release_all(text[], text)',
        'lockext.fence_read(text, bigint)',
        'lockext.fenced_read(text, bigint)'
    ]::regprocedure[] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO lockext_user', f);
    END LOOP;
END $$;

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

CREATE VIEW lockext.stats AS
SELECT name, value, since FROM lockext.stats();

CREATE VIEW lockext.waiters AS
SELECT lock_id, database, pid, waiting_since, pg_catalog.clock_timestamp() - waiting_since AS waited,
       position
  FROM lockext.waiters();

GRANT SELECT ON lockext.holders, lockext.stats, lockext.waiters TO PUBLIC;
REVOKE ALL ON FUNCTION lockext.stats_reset() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.stats_reset() TO lockext_admin;
