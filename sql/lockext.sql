-- lockext's own objects. CREATE EXTENSION runs this first (pgrx "bootstrap"), before the
-- functions that pgrx generates from src/, so the functions can name these objects.

-- lockext's functions and its reaper run SQL as lockext's owner and name their objects by
-- this schema: a schema "lockext" that another role owns (made before CREATE EXTENSION,
-- which then uses it) would let that role swap them for its own and run code with the
-- owner's rights. So the schema must be the owner's: the one CREATE EXTENSION makes.
DO $$
DECLARE
    schema_owner oid := (SELECT nspowner FROM pg_catalog.pg_namespace WHERE nspname = 'lockext');
    lockext_owner oid := (SELECT extowner FROM pg_catalog.pg_extension WHERE extname = 'lockext');
BEGIN
    IF schema_owner IS DISTINCT FROM lockext_owner THEN
        RAISE EXCEPTION 'schema "lockext" is owned by role %, not by lockext''s owner %',
                        schema_owner::regrole, lockext_owner::regrole
            USING ERRCODE = '42501',
                  DETAIL = 'lockext runs its SQL as its owner and names its objects by this schema: the schema''s owner could replace them and run code with the owner''s rights.',
                  HINT = 'Let CREATE EXTENSION make the schema: drop or rename the existing schema "lockext" (or make it owned by the role that installs lockext), then try again.';
    END IF;
END $$;

-- What lock_acquire hands back. A type of its own, not a table's row type, so that the
-- table can gain columns without changing what callers receive.
CREATE TYPE lockext.lock_grant AS (
    lock_id     text,
    owner       text,
    fence_token bigint,
    acquired_at timestamptz,
    expires_at  timestamptz
);

-- The counter in the low 41 bits of every fencing token (the era is in the bits above it,
-- and a token is at most 2^53 - 1: see src/token.rs). NO CYCLE and MAXVALUE: a counter
-- that wrapped, or spilled into the era bits, would go backwards. CACHE 1: a per-backend
-- cache would hand tokens out of order between sessions.
CREATE SEQUENCE lockext.fence_token_seq
    AS bigint MINVALUE 1 MAXVALUE 2199023255551 NO CYCLE CACHE 1;

-- Keep-alives (src/keepalive.rs): one renewal for many leases. A lease attached to one
-- (its keepalive column) expires when the keep-alive does. ended: it will never be
-- renewed again (revoked, or found expired by a grant or the reaper that acted on it).
-- keepalive is its id, a fencing token: never handed out twice.
CREATE TABLE lockext.keepalives (
    keepalive        bigint      PRIMARY KEY,
    holder_role      oid         NOT NULL,   -- the database role that granted it
    ttl              interval    NOT NULL,   -- what a renewal extends it by, unless told
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    renewals         bigint      NOT NULL DEFAULT 0,
    ended            boolean     NOT NULL DEFAULT false,
    taker_pid        integer,
    application_name text,
    client_addr      inet
);
-- Room on each page for a renewal's new version of its row (a HOT update).
ALTER TABLE lockext.keepalives SET (vacuum_truncate = false, fillfactor = 50);
-- No index on expires_at: a renewal then updates the row in place (HOT), writing no index
-- entry, and the table has a row per worker, not per lease; the reaper reads it whole.

-- One row per lease. A row whose expires_at has passed is a dead lease: acquire takes it
-- over in place, and the reaper deletes it. A lease attached to a keep-alive has
-- expires_at 'infinity' and expires with its keep-alive (lockext.lease_expiry).
CREATE TABLE lockext.locks (
    lock_id     text        PRIMARY KEY,
    owner       text        NOT NULL,
    fence_token bigint      NOT NULL,
    holder_role oid         NOT NULL,   -- the database role that took the grant
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    renewals    integer     NOT NULL DEFAULT 0,  -- lock_renew calls and same-owner retries
    -- Who took it, for operators (see lockext.holders): the backend and its client.
    taker_pid        integer,
    application_name text,
    client_addr      inet,
    -- After an expiry without a release, the lock stays unavailable this much longer.
    lock_delay  interval    NOT NULL DEFAULT '0',
    -- Set for a session-bound lease: when the backend taker_pid started. Pids are reused;
    -- pid and start time together name one backend, and the lease ends with it.
    session_start timestamptz,
    -- The keep-alive that renews it (lockext.keepalives), or NULL: its own expires_at.
    keepalive   bigint
);
-- Autovacuum would otherwise truncate the emptied end of the table after mass expiries,
-- taking an ACCESS EXCLUSIVE lock that every lock call would wait behind for a moment.
ALTER TABLE lockext.locks SET (vacuum_truncate = false);
-- The reaper's access path: expired leases, oldest first.
-- The reaper's access path to session-bound leases, to find those whose backend is gone.
CREATE INDEX locks_session_idx ON lockext.locks (taker_pid) WHERE session_start IS NOT NULL;
-- A keep-alive's leases, for its revocation and for the reaper once it expired.
CREATE INDEX locks_keepalive_idx ON lockext.locks (keepalive) WHERE keepalive IS NOT NULL;

-- Leases that share a lock id: shared (read) leases, and the permits of counting
-- semaphores. One row per holder, each with a fence token of its own; the columns mean what
-- they mean in lockext.locks. A shared lease has permits NULL; a permit records how many
-- permits its semaphore has, which every live permit of one semaphore agrees on, and its
-- slot: which of the n permits it is (no two live permits share one).
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
    keepalive        bigint,
    PRIMARY KEY (lock_id, owner)
);
ALTER TABLE lockext.shared_leases SET (vacuum_truncate = false);
CREATE INDEX shared_leases_session_idx ON lockext.shared_leases (taker_pid) WHERE session_start IS NOT NULL;
CREATE INDEX shared_leases_keepalive_idx ON lockext.shared_leases (keepalive) WHERE keepalive IS NOT NULL;
-- A semaphore's permits of a lock id: a shared acquire looks for one (a lock id is a lock or a
-- semaphore) without reading every shared lease of the id.
CREATE INDEX shared_leases_permits_idx ON lockext.shared_leases (lock_id) WHERE permits IS NOT NULL;

-- The token era (high bits of every token, see src/token.rs) and the history it was
-- started for. One row at most; none until the first grant. It travels with dumps, so that
-- a restore elsewhere starts above it; the era in force is decided by the cluster's own
-- record (pg_lockext/eras in the data directory), never by this row alone.
CREATE TABLE lockext.token_epoch (
    singleton         boolean     PRIMARY KEY CHECK (singleton),
    epoch             integer     NOT NULL CHECK (epoch >= 0),
    -- 2: era over a 41-bit counter (every token < 2^53); 1: 0.2.0's 20-bit epoch over a
    -- 43-bit counter, kept by installations upgraded from 0.2.0.
    layout            smallint    NOT NULL DEFAULT 2 CHECK (layout IN (1, 2)),
    system_identifier bigint      NOT NULL,
    timeline          integer     NOT NULL,
    database          oid         NOT NULL,
    raised_at         timestamptz NOT NULL,
    -- 0.1.0 and 0.2.0 had this column: kept, always NULL from 0.4.0 on, so that their
    -- dumps restore the row (it is evidence of the tokens they handed out, token.rs).
    boot              bigint
);

-- The high-water mark of each fenced resource, and the document fenced_update last stored
-- for it (NULL for a resource fenced only with lockext.fence). A resource bound to a lock
-- (lockext.bind_resource) accepts only the live grant of that lock; fence_token is 0 for a
-- bound resource nobody has written yet.
CREATE TABLE lockext.resources (
    resource_id text        PRIMARY KEY,
    fence_token bigint      NOT NULL,
    data        jsonb,
    updated_at  timestamptz NOT NULL,
    lock_id     text
);

-- The value a grant carries (lock_campaign, lock_set_value): a leader's address, a shard
-- map. Keyed by the grant (lock id and token; tokens never repeat), so a value outlives
-- its grant only as a row nobody shows: lock_holders joins on the live lease's token, and
-- the setter and the reaper delete such rows. A table of its own, so that a grant without
-- a value costs nothing more. version counts the values set during the grant (from 1).
-- holder_role is the role that set it (its grant's): what one role stores is bounded
-- (lockext.role_values_size), summed over its rows, found by their own index.
CREATE TABLE lockext.lease_values (
    lock_id     text        NOT NULL,
    fence_token bigint      NOT NULL,
    owner       text        NOT NULL,
    value       jsonb       NOT NULL,
    version     bigint      NOT NULL CHECK (version > 0),
    set_at      timestamptz NOT NULL,
    holder_role oid         NOT NULL,
    PRIMARY KEY (lock_id, fence_token)
);
ALTER TABLE lockext.lease_values SET (vacuum_truncate = false);
CREATE INDEX lease_values_role_idx ON lockext.lease_values (holder_role);

-- The highest token each lock id's grants ever had, on a Citus cluster only (src/citus.rs):
-- each grant there records its token in its own transaction, and the row moves with the
-- lock id's shard, so a grant on the node a shard moved to starts above it. Empty on a
-- single server, whose one ledger already keeps every lock id's tokens rising.
CREATE TABLE lockext.lock_tokens (
    lock_id text   PRIMARY KEY,
    high    bigint NOT NULL
);

-- On a Citus cluster (src/citus.rs): the highest token any node can have handed out when
-- lockext.citus_distribute() distributed the lease tables (before it, each node minted for
-- its own tables). Every grant there starts above it, and above its lock id's highest.
-- A reference table there (on every node, and on nodes added later); empty on one server.
CREATE TABLE lockext.token_floor (
    singleton boolean PRIMARY KEY CHECK (singleton),
    floor     bigint  NOT NULL
);

-- pg_dump skips extension members unless they are marked: without this a restore would
-- bring back no leases, no high-water marks and no era. The token sequence is not marked:
-- a restore always starts a new era (src/token.rs), so its counter may start again, and a
-- data-only restore must never rewind the counter of a running installation.
SELECT pg_catalog.pg_extension_config_dump('lockext.locks', '');
SELECT pg_catalog.pg_extension_config_dump('lockext.shared_leases', '');
SELECT pg_catalog.pg_extension_config_dump('lockext.resources', '');
SELECT pg_catalog.pg_extension_config_dump('lockext.token_epoch', '');
SELECT pg_catalog.pg_extension_config_dump('lockext.lease_values', '');
SELECT pg_catalog.pg_extension_config_dump('lockext.keepalives', '');
SELECT pg_catalog.pg_extension_config_dump('lockext.lock_tokens', '');
SELECT pg_catalog.pg_extension_config_dump('lockext.token_floor', '');

-- Least privilege: nobody writes these tables but lockext's functions (which run as their
-- owner: SECURITY DEFINER, or src/caller.rs for the lease functions).
-- Reading them is harmless and useful to operators, so it is granted.
REVOKE ALL ON lockext.locks, lockext.shared_leases, lockext.resources, lockext.token_epoch,
    lockext.keepalives, lockext.lock_tokens, lockext.token_floor, lockext.fence_token_seq FROM PUBLIC;
GRANT SELECT ON lockext.locks, lockext.shared_leases, lockext.resources, lockext.token_epoch,
    lockext.keepalives, lockext.lock_tokens, lockext.token_floor TO PUBLIC;
-- Values are what leaders publish to their followers: read by members of lockext_user
-- through lock_holders and lock_observe, not by every role.
REVOKE ALL ON lockext.lease_values FROM PUBLIC;
GRANT USAGE ON SCHEMA lockext TO PUBLIC;
