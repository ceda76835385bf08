-- lockext 0.2.0 -> 0.3.0: ALTER EXTENSION lockext UPDATE TO '0.3.0'
-- Tokens that never repeat (src/token.rs): the era in force is decided by the cluster's own
-- record (pg_lockext/eras in the data directory), the counter is on disk before a token is
-- handed out, and a restart no longer spends an epoch. New installations get tokens below
-- 2^53; this one keeps 0.2.0's layout if it already handed out tokens, which are all above
-- 2^55: a token must never go backwards. Leases, resources and tokens are untouched.
\echo Use "ALTER EXTENSION lockext UPDATE TO '0.3.0'" to load this file. \quit

-- lockext's functions and its reaper run SQL as lockext's owner and name their objects by
-- this schema: a schema "lockext" that another role owns (made before CREATE EXTENSION,
-- which then used it) would let that role swap them for its own and run code with the
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


-- The row records the layout; a restart no longer changes the era, so the boot goes.
ALTER TABLE lockext.token_epoch
    DROP COLUMN boot,
    DROP CONSTRAINT token_epoch_epoch_check,
    ADD CONSTRAINT token_epoch_epoch_check CHECK (epoch >= 0),
    ADD COLUMN layout smallint NOT NULL DEFAULT 1 CHECK (layout IN (1, 2));
ALTER TABLE lockext.token_epoch ALTER COLUMN layout SET DEFAULT 2;

-- An installation that handed out tokens keeps 0.2.0's layout (1), and its next era
-- starts above every epoch 0.2.0 could have used, recorded or not: 0.2.0 could mint in
-- the epoch after the recorded one (a raise, or the next era, at least the timeline's)
-- before that epoch's record committed, or without it ever committing (issue 15). So the
-- row is moved to the last raise of that next era, and the first 0.3.0 grant takes the era
-- after it. Without a row but with a used counter, 0.2.0 may have minted in the era of the
-- timeline. An installation that never handed out a token gets the new layout.
DO $$
DECLARE
    current_timeline integer := (SELECT timeline_id FROM pg_catalog.pg_control_checkpoint());
    counter_used boolean := (SELECT is_called FROM lockext.fence_token_seq);
BEGIN
    UPDATE lockext.token_epoch
       SET epoch = (GREATEST((epoch >> 12) + 1, current_timeline) << 12) | 4095;
    IF NOT FOUND AND counter_used THEN
        INSERT INTO lockext.token_epoch
               (singleton, epoch, layout, system_identifier, timeline, database, raised_at)
        SELECT true, (GREATEST(current_timeline, 1) << 12) | 4095, 1, s.system_identifier,
               current_timeline, (SELECT oid FROM pg_catalog.pg_database
                           WHERE datname = pg_catalog.current_database()),
               pg_catalog.clock_timestamp()
          FROM pg_catalog.pg_control_system() s;
    ELSIF NOT FOUND THEN
        ALTER SEQUENCE lockext.fence_token_seq MAXVALUE 2199023255551;
    END IF;
END
$$;

-- The sequence no longer travels with dumps: a restore always starts a new era, and a
-- data-only restore must not rewind a running installation's counter. (Dropping a member
-- and adding it back takes it out of the dumped configuration.)
ALTER EXTENSION lockext DROP SEQUENCE lockext.fence_token_seq;
ALTER EXTENSION lockext ADD SEQUENCE lockext.fence_token_seq;

-- token_parts now says which layout a token is in; 0.2.0's raise is part of its era.
DROP FUNCTION lockext.token_parts(bigint);
CREATE FUNCTION lockext."token_parts"(
	"fence_token" bigint /* i64 */
) RETURNS TABLE (
	"layout" INT,  /* i32 */
	"era" INT,  /* i32 */
	"counter" bigint  /* i64 */
)
IMMUTABLE STRICT PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'token_parts_0_3_wrapper';

-- Every function whose meaning changes calls a C symbol that no older library has
-- (*_0_3_wrapper): the symbols the older SQL calls stay in the library and serve that
-- SQL until this update (src/compat.rs), and a backend that still has an older library
-- loaded (a session older than the package, without preload) fails to find the new ones
-- rather than run old code on these tables. So these are replaced, not altered.
--
-- The lease functions act for the role whose code calls them (src/caller.rs): SECURITY
-- INVOKER, becoming the tables' owner inside, instead of SECURITY DEFINER, where the
-- caller inside another role's maintenance or SECURITY DEFINER function was misread.
-- lock_acquire and lock_acquire_all gain keepalive (src/keepalive.rs): a new argument is a
-- new function, so the old ones go.
DROP FUNCTION lockext.lock_acquire(text, text, interval, interval, interval, text, integer, boolean);
CREATE FUNCTION lockext."lock_acquire"(
	"lock_id" TEXT,
	"owner" TEXT,
	"ttl" interval,
	"wait" interval DEFAULT '0 seconds',
	"lock_delay" interval DEFAULT NULL,
	"mode" TEXT DEFAULT 'exclusive',
	"permits" INT DEFAULT NULL,
	"session_bound" bool DEFAULT false,
	"keepalive" bigint DEFAULT NULL
) RETURNS lockext.lock_grant
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_acquire_0_3_wrapper';
CREATE OR REPLACE FUNCTION lockext."lock_renew"(
	"lock_id" TEXT,
	"owner" TEXT,
	"ttl" interval,
	"fence_token" bigint DEFAULT NULL
) RETURNS timestamp with time zone
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_renew_0_3_wrapper';
CREATE OR REPLACE FUNCTION lockext."lock_release"(
	"lock_id" TEXT,
	"owner" TEXT,
	"fence_token" bigint DEFAULT NULL
) RETURNS bool
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_release_0_3_wrapper';
DROP FUNCTION lockext.lock_acquire_all(text[], text, interval, interval, text, boolean);
CREATE FUNCTION lockext."lock_acquire_all"(
	"lock_ids" TEXT[],
	"owner" TEXT,
	"ttl" interval,
	"wait" interval DEFAULT '0 seconds',
	"mode" TEXT DEFAULT 'exclusive',
	"session_bound" bool DEFAULT false,
	"keepalive" bigint DEFAULT NULL
) RETURNS TABLE (
	"lock_id" TEXT,
	"owner" TEXT,
	"fence_token" bigint,
	"acquired_at" timestamp with time zone,
	"expires_at" timestamp with time zone
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_acquire_all_0_3_wrapper';
CREATE OR REPLACE FUNCTION lockext."lock_release_all"(
	"lock_ids" TEXT[],
	"owner" TEXT
) RETURNS INT
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_release_all_0_3_wrapper';
-- The check of a token against what this installation handed out, now by token eras.
CREATE OR REPLACE FUNCTION lockext."check_token"(
	"fence_token" bigint
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'check_token_0_3_wrapper';

-- Resources bound to the lock that guards them (lockext.bind_resource): they accept only
-- that lock's live grant. Unbound resources keep the high-water mark alone.
ALTER TABLE lockext.resources ADD COLUMN lock_id text;
-- A bound resource's write checks its grant once it holds the resource's row, under the
-- newest snapshot; lock_check reads under the newest snapshot too, which cannot be taken
-- during a parallel operation.
CREATE FUNCTION lockext."exclusive_grant_live"(
	"lock_id" TEXT, /* &str */
	"fence_token" bigint, /* i64 */
	"holder_role" oid /* pgrx_pg_sys::submodules::oids::Oid */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'exclusive_grant_live_wrapper';
REVOKE ALL ON FUNCTION lockext.exclusive_grant_live(text, bigint, oid) FROM PUBLIC;

-- lockext's own: the token of a grant, minted inside the statement that makes it.
CREATE FUNCTION lockext."grant_token"() RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'grant_token_wrapper';
REVOKE ALL ON FUNCTION lockext.grant_token() FROM PUBLIC;
CREATE OR REPLACE FUNCTION lockext."lock_check"(
	"lock_id" TEXT,
	"fence_token" bigint
) RETURNS bool
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_check_0_3_wrapper';
CREATE OR REPLACE FUNCTION lockext.fence(resource_id text, fence_token bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    newer bigint := lockext.fence_advance(resource_id, fence_token);
    guard text;
BEGIN
    IF newer IS NOT NULL THEN
        SELECT r.lock_id INTO guard FROM lockext.resources AS r WHERE r.resource_id = fence.resource_id;
        RAISE EXCEPTION 'fence token % is stale for resource "%"', fence_token, resource_id
            USING ERRCODE = '55L01',
                  DETAIL = CASE WHEN newer > fence_token
                                THEN format('A holder with fence token %s has written since.', newer)
                                ELSE format('The resource is bound to lock "%s", and fence token %s is not its live grant held by this role.',
                                            guard, fence_token) END,
                  HINT = 'This client''s lease was lost: stop, and acquire the lock again.';
    END IF;
END $$;

CREATE FUNCTION lockext."bind_resource"(
	"resource_id" TEXT, /* Option < Text < '_ > > */
	"lock_id" TEXT /* Option < Text < '_ > > */
) RETURNS void
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'bind_resource_wrapper';

-- Fenced writes and reads of a bound resource must know the calling role (its token is
-- no secret): SECURITY INVOKER, becoming the tables' owner inside (src/caller.rs).
CREATE OR REPLACE FUNCTION lockext."fenced_update"(
	"resource_id" TEXT,
	"fence_token" bigint,
	"data" jsonb
) RETURNS bool
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'fenced_update_0_3_wrapper';
CREATE OR REPLACE FUNCTION lockext."fence_advance"(
	"resource_id" TEXT,
	"fence_token" bigint
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'fence_advance_0_3_wrapper';
CREATE FUNCTION lockext."fence_read_check"(
	"resource_id" TEXT, /* core::option::Option<&str> */
	"fence_token" bigint /* core::option::Option<i64> */
) RETURNS TEXT /* core::option::Option<alloc::string::String> */
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'fence_read_check_wrapper';
REVOKE ALL ON FUNCTION lockext.fence_read_check(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.fence_read_check(text, bigint) TO lockext_user;
-- The reader's side, for holders of shared leases. Readers do not move the high-water mark
-- (two readers' tokens must not fence each other out); a reader is refused once a writer
-- with a newer token has written, and, on a bound resource, unless the token is a live
-- lease of the resource's lock taken by the reading role. The resource's row stays locked
-- in share mode to the end of the reader's transaction, so the reads that follow see no
-- writer's half-done work: a writer's fence waits for those transactions. SECURITY
-- INVOKER: the check must know the reading role (fence_read_check becomes the tables'
-- owner inside, as the lease functions do).
--   BEGIN; SELECT lockext.fence_read('acct:42', $token); SELECT ... FROM accounts ...; COMMIT;
CREATE OR REPLACE FUNCTION lockext.fence_read(resource_id text, fence_token bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    why text := lockext.fence_read_check(resource_id, fence_token);
BEGIN
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'fence token % is stale for resource "%"', fence_token, resource_id
            USING ERRCODE = '55L01', DETAIL = why,
                  HINT = 'This client''s lease was lost: stop, and acquire the lock again.';
    END IF;
END $$;

-- fence_read, then the document fenced_update stored (NULL when there is none).
CREATE OR REPLACE FUNCTION lockext.fenced_read(resource_id text, fence_token bigint) RETURNS jsonb
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lockext.fence_read(resource_id, fence_token);
    RETURN (SELECT r.data FROM lockext.resources AS r WHERE r.resource_id = fenced_read.resource_id);
END $$;

REVOKE ALL ON FUNCTION lockext.bind_resource(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.bind_resource(text, text) TO lockext_admin;

-- The era tokens carry now, started at once for an installation that handed out tokens:
-- the cluster's record (pg_lockext/eras) then knows 0.2.0's layout was used here before
-- any grant, so a reinstall, or the database dropped and created again, right after the
-- upgrade still goes on above 0.2.0's tokens.
CREATE FUNCTION lockext."token_era"() RETURNS TABLE (
	"layout" INT,  /* i32 */
	"era" INT  /* i32 */
)
STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'token_era_wrapper';
REVOKE ALL ON FUNCTION lockext.token_era() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.token_era() TO lockext_user;
DO $$
BEGIN
    IF EXISTS (SELECT FROM lockext.token_epoch) THEN
        PERFORM lockext.token_era();
    END IF;
END
$$;

-- fence_guard also fences DELETE and UPDATEs that leave the token column as it is: they
-- use the token their role declared in the transaction (lockext.declare_token), or are
-- refused.
CREATE FUNCTION lockext."declare_token"(
	"fence_token" bigint /* core::option::Option<i64> */
) RETURNS void
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'declare_token_wrapper';
CREATE FUNCTION lockext."declared_token"() RETURNS bigint /* core::option::Option<i64> */
STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'declared_token_wrapper';
REVOKE ALL ON FUNCTION lockext.declare_token(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.declare_token(bigint) TO lockext_user;
REVOKE ALL ON FUNCTION lockext.declared_token() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.declared_token() TO lockext_user;
-- fence_guard's check of a row, which counts a refusal in lockext.stats.
CREATE FUNCTION lockext."fence_row"(
	"fence_token" bigint, /* Option < i64 > */
	"row_token" bigint /* Option < i64 > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'fence_row_wrapper';
REVOKE ALL ON FUNCTION lockext.fence_row(bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.fence_row(bigint, bigint) TO lockext_user;
CREATE OR REPLACE FUNCTION lockext.fence_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    col       text;
    row_now   jsonb;
    writer    bigint;
    old_token bigint;
BEGIN
    -- The writer needs lockext_user, which lockext's functions below would check too; said
    -- here, the error names the table instead of one of them.
    IF NOT pg_has_role('lockext_user', 'USAGE') THEN
        RAISE EXCEPTION 'permission denied to write %.%, which lockext.fence_guard guards', TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = '42501',
                  DETAIL = format('Role "%s" does not have the privileges of role lockext_user.', current_user),
                  HINT = format('An administrator grants them with: GRANT lockext_user TO %s;', quote_ident(current_user));
    END IF;
    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' THEN
        RAISE EXCEPTION 'lockext.fence_guard must be a BEFORE INSERT OR UPDATE OR DELETE ... FOR EACH ROW trigger'
            USING ERRCODE = '39P01',
                  HINT = format('CREATE TRIGGER ... BEFORE INSERT OR UPDATE OR DELETE ON %I.%I FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard(''fence_token'')',
                                TG_TABLE_SCHEMA, TG_TABLE_NAME);
    END IF;
    IF TG_NARGS NOT IN (1, 2) THEN
        RAISE EXCEPTION 'lockext.fence_guard takes the name of the token column, and optionally a resource id'
            USING ERRCODE = '22023',
                  HINT = 'EXECUTE FUNCTION lockext.fence_guard(''fence_token'') or lockext.fence_guard(''fence_token'', ''resource id'')';
    END IF;
    col := TG_ARGV[0];
    row_now := to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END);
    IF NOT row_now ? col THEN
        RAISE EXCEPTION 'table %.% has no column "%" for lockext.fence_guard', TG_TABLE_SCHEMA, TG_TABLE_NAME, col
            USING ERRCODE = '42703',
                  HINT = format('Add it (ALTER TABLE %I.%I ADD COLUMN %I bigint), or name the table''s token column in the trigger''s first argument.',
                                TG_TABLE_SCHEMA, TG_TABLE_NAME, col);
    END IF;
    IF jsonb_typeof(row_now -> col) NOT IN ('number', 'null') THEN
        RAISE EXCEPTION 'column "%" of %.% must hold fence tokens (bigint)', col, TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = '42804',
                  HINT = 'Name a bigint column in the trigger''s first argument: it holds the fence token of the row''s writer.';
    END IF;
    IF TG_OP <> 'INSERT' THEN
        old_token := (to_jsonb(OLD) ->> col)::bigint;
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND (row_now ->> col)::bigint IS DISTINCT FROM old_token) THEN
        writer := (row_now ->> col)::bigint;
        IF writer IS NULL THEN
            RAISE EXCEPTION 'a row of %.% must carry a fence token in "%"', TG_TABLE_SCHEMA, TG_TABLE_NAME, col
                USING ERRCODE = '22004',
                      HINT = CASE TG_OP
                             WHEN 'INSERT' THEN format('Set "%s" to the lock holder''s fence token (the one lock_acquire returned).', col)
                             ELSE format('Set "%s" to the lock holder''s fence token (the one lock_acquire returned), or leave it out of the UPDATE and declare the token first: SELECT lockext.declare_token(<token>).', col)
                             END;
        END IF;
    ELSE
        writer := lockext.declared_token();
        IF writer IS NULL THEN
            RAISE EXCEPTION '% on %.% that does not set "%" must declare the writer''s fence token',
                            CASE TG_OP WHEN 'DELETE' THEN 'a DELETE' ELSE 'an UPDATE' END,
                            TG_TABLE_SCHEMA, TG_TABLE_NAME, col
                USING ERRCODE = '22004',
                      DETAIL = 'The row carries no token of its writer: without one, a holder whose lease was lost could write over a newer holder''s row.',
                      HINT = format('SELECT lockext.declare_token(<token>) first, in the same transaction and as the same role, or set "%s" in the UPDATE.', col);
        END IF;
    END IF;
    -- Declares the writer's token (refusing one never issued): this transaction's later
    -- writes by this role that carry none of their own (a DELETE, a row moved to another
    -- partition) use it. A refusal is counted in lockext.stats.
    IF NOT lockext.fence_row(writer, old_token) THEN
        RAISE EXCEPTION 'fence token % is stale for this row of %.%', writer, TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = '55L01',
                  DETAIL = format('The row was written with fence token %s.', old_token),
                  HINT = 'This client''s lease was lost: stop, and acquire the lock again.';
    END IF;
    IF TG_NARGS = 2 THEN
        PERFORM lockext.fence(TG_ARGV[1], writer);
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    IF writer IS DISTINCT FROM (row_now ->> col)::bigint THEN
        NEW := jsonb_populate_record(NEW, jsonb_build_object(col, writer));
    END IF;
    RETURN NEW;
END $$;

-- The reaper finds leases by when their lock is free (expiry plus lock-delay), so that a
-- batch reads only what it may delete (leases in their lock-delay were read every batch).
CREATE FUNCTION lockext."free_at"(
	"expires_at" timestamp with time zone, /* pgrx::datum::time_stamp_with_timezone::TimestampWithTimeZone */
	"lock_delay" interval /* pgrx::datum::interval::Interval */
) RETURNS timestamp with time zone /* pgrx::datum::time_stamp_with_timezone::TimestampWithTimeZone */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'free_at_wrapper';
DROP INDEX lockext.locks_expires_at_idx;
DROP INDEX lockext.shared_leases_expires_at_idx;
CREATE INDEX locks_free_at_idx ON lockext.locks (lockext.free_at(expires_at, lock_delay));
CREATE INDEX shared_leases_free_at_idx ON lockext.shared_leases (lockext.free_at(expires_at, lock_delay));
CREATE INDEX shared_leases_permits_idx ON lockext.shared_leases (lock_id) WHERE permits IS NOT NULL;

-- Functions that need lockext_user or lockext_admin check their caller themselves (and say
-- which role to grant), so PUBLIC may execute them (sql/privileges.sql); check_token and
-- token_era are SECURITY INVOKER for it, becoming the tables' owner inside.
ALTER FUNCTION lockext.check_token(bigint) SECURITY INVOKER;
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'lockext.lock_acquire(text, text, interval, interval, interval, text, integer, boolean, bigint)',
        'lockext.lock_acquire_all(text[], text, interval, interval, text, boolean, bigint)',
        'lockext.lock_release_all(text[], text)',
        'lockext.lock_renew(text, text, interval, bigint)',
        'lockext.lock_release(text, text, bigint)',
        'lockext.lock_check(text, bigint)',
        'lockext.fenced_update(text, bigint, jsonb)',
        'lockext.fence(text, bigint)',
        'lockext.fence_read(text, bigint)',
        'lockext.fenced_read(text, bigint)',
        'lockext.fence_advance(text, bigint)',
        'lockext.fence_read_check(text, bigint)',
        'lockext.declare_token(bigint)',
        'lockext.declared_token()',
        'lockext.fence_row(bigint, bigint)',
        'lockext.check_token(bigint)',
        'lockext.token_era()',
        'lockext.bind_resource(text, text)',
        'lockext.stats_reset()'
    ]::regprocedure[] LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);
    END LOOP;
END $$;

-- Leader election (src/election.rs): the value a grant carries, in a table of its own so
-- that a grant without one costs nothing more; who holds a lock now; waiting for a change.
CREATE TABLE lockext.lease_values (
    lock_id     text        NOT NULL,
    fence_token bigint      NOT NULL,
    owner       text        NOT NULL,
    value       jsonb       NOT NULL,
    version     bigint      NOT NULL CHECK (version > 0),
    set_at      timestamptz NOT NULL,
    PRIMARY KEY (lock_id, fence_token)
);
ALTER TABLE lockext.lease_values SET (vacuum_truncate = false);
SELECT pg_catalog.pg_extension_config_dump('lockext.lease_values', '');
REVOKE ALL ON lockext.lease_values FROM PUBLIC;

CREATE FUNCTION lockext."lock_campaign"(
	"lock_id" TEXT,
	"owner" TEXT,
	"ttl" interval,
	"value" jsonb,
	"wait" interval DEFAULT '0 seconds',
	"lock_delay" interval DEFAULT NULL,
	"mode" TEXT DEFAULT 'exclusive',
	"permits" INT DEFAULT NULL,
	"session_bound" bool DEFAULT false
) RETURNS lockext.lock_grant
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_campaign_wrapper';

CREATE FUNCTION lockext."set_lease_value"(
	"lock_id" TEXT,
	"owner" TEXT,
	"fence_token" bigint,
	"value" jsonb
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_lease_value_wrapper';

CREATE FUNCTION lockext."lock_holders"(
	"lock_id" TEXT
) RETURNS TABLE (
	"owner" TEXT,
	"kind" TEXT,
	"fence_token" bigint,
	"value" jsonb,
	"version" bigint,
	"acquired_at" timestamp with time zone,
	"expires_at" timestamp with time zone
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_holders_wrapper';

CREATE FUNCTION lockext."lock_observe"(
	"lock_id" TEXT,
	"known_token" bigint DEFAULT NULL,
	"known_version" bigint DEFAULT NULL,
	"timeout" interval DEFAULT '30 seconds'
) RETURNS TABLE (
	"changed" bool,
	"owner" TEXT,
	"kind" TEXT,
	"fence_token" bigint,
	"value" jsonb,
	"version" bigint,
	"acquired_at" timestamp with time zone,
	"expires_at" timestamp with time zone
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_observe_wrapper';

-- Stores value as the value of the caller's live grant fence_token of lock_id (taken by
-- owner and the calling role), and returns its version (1 for a grant's first value).
-- SECURITY INVOKER: set_lease_value checks the calling role.
CREATE FUNCTION lockext.lock_set_value(lock_id text, owner text, fence_token bigint, value jsonb)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    version bigint := lockext.set_lease_value(lock_id, owner, fence_token, value);
BEGIN
    IF version IS NULL THEN
        RAISE EXCEPTION 'fence token % is not a live grant of lock "%" held by "%"',
                        fence_token, lock_id, owner
            USING ERRCODE = '55L01',
                  DETAIL = 'The lease has expired, was released or taken over, or was taken by another owner or role.',
                  HINT = 'This client''s lease was lost: stop, and campaign again.';
    END IF;
    RETURN version;
END $$;

-- Each checks its caller itself (src/caller.rs), as the functions above.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'lockext.lock_campaign(text, text, interval, jsonb, interval, interval, text, integer, boolean)',
        'lockext.lock_set_value(text, text, bigint, jsonb)',
        'lockext.set_lease_value(text, text, bigint, jsonb)',
        'lockext.lock_holders(text)',
        'lockext.lock_observe(text, bigint, bigint, interval)'
    ]::regprocedure[] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO lockext_user', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);
    END LOOP;
END $$;

-- Keep-alives (src/keepalive.rs): one renewal for many leases.
CREATE TABLE lockext.keepalives (
    keepalive        bigint      PRIMARY KEY,
    holder_role      oid         NOT NULL,
    ttl              interval    NOT NULL,
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    renewals         bigint      NOT NULL DEFAULT 0,
    ended            boolean     NOT NULL DEFAULT false,
    taker_pid        integer,
    application_name text,
    client_addr      inet
);
ALTER TABLE lockext.keepalives SET (vacuum_truncate = false, fillfactor = 50);
SELECT pg_catalog.pg_extension_config_dump('lockext.keepalives', '');
REVOKE ALL ON lockext.keepalives FROM PUBLIC;
GRANT SELECT ON lockext.keepalives TO PUBLIC;
ALTER TABLE lockext.locks ADD COLUMN keepalive bigint;
ALTER TABLE lockext.shared_leases ADD COLUMN keepalive bigint;
CREATE INDEX locks_keepalive_idx ON lockext.locks (keepalive) WHERE keepalive IS NOT NULL;
CREATE INDEX shared_leases_keepalive_idx ON lockext.shared_leases (keepalive) WHERE keepalive IS NOT NULL;

CREATE FUNCTION lockext."end_keepalive"(
	"keepalive" bigint,
	"now" timestamp with time zone
) RETURNS bool
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'end_keepalive_wrapper';
CREATE FUNCTION lockext."lease_expiry"(
	"expires_at" timestamp with time zone,
	"keepalive" bigint
) RETURNS timestamp with time zone
STABLE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_expiry_wrapper';
REVOKE ALL ON FUNCTION lockext.end_keepalive(bigint, timestamptz) FROM PUBLIC;
CREATE FUNCTION lockext."lock_keepalive_grant"(
	"ttl" interval DEFAULT '30 seconds'
) RETURNS TABLE (
	"keepalive" bigint,
	"expires_at" timestamp with time zone
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_keepalive_grant_wrapper';
CREATE FUNCTION lockext."lock_keepalive_renew"(
	"keepalive" bigint,
	"ttl" interval DEFAULT NULL
) RETURNS timestamp with time zone
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_keepalive_renew_wrapper';
CREATE FUNCTION lockext."lock_keepalive_revoke"(
	"keepalive" bigint
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lock_keepalive_revoke_wrapper';
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'lockext.lock_acquire(text, text, interval, interval, interval, text, integer, boolean, bigint)',
        'lockext.lock_acquire_all(text[], text, interval, interval, text, boolean, bigint)',
        'lockext.lock_keepalive_grant(interval)',
        'lockext.lock_keepalive_renew(bigint, interval)',
        'lockext.lock_keepalive_revoke(bigint)'
    ]::regprocedure[] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO lockext_user', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);
    END LOOP;
END $$;

-- Who holds what: one row per live lease of any kind (exclusive, shared, or one permit of
-- a semaphore), joinable with pg_stat_activity on pid. A lease attached to a keep-alive
-- shows the keep-alive's expiry, which is its own (src/keepalive.rs).
CREATE OR REPLACE VIEW lockext.holders AS
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

GRANT SELECT ON lockext.keepalive_holders TO PUBLIC;

-- Without shared_preload_libraries, lockext still works, and much that operators count on
-- is silently missing: say so when the extension is created or updated. lockext.stats()
-- has rows exactly when the library was preloaded (its counters live in shared memory).
-- A WARNING, because PostgreSQL runs an extension's script with client_min_messages at
-- least WARNING: a NOTICE would never be seen.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM lockext.stats()) THEN
        RAISE WARNING 'lockext is not loaded through shared_preload_libraries'
            USING DETAIL = 'Without it, no reaper runs (expired leases stay in lockext''s tables until an acquire takes them over, and the session-bound leases of a backend that crashed last until their ttl), waiting acquires poll instead of queueing in order, and lockext.stats, lockext.waiters and lockext.reaper_status() stay empty. Leases, fence tokens, their durability and fencing work the same.',
                  HINT = 'Add lockext to shared_preload_libraries in postgresql.conf (shared_preload_libraries = ''lockext'', after any libraries already listed), then restart the server.';
    END IF;
END $$;
