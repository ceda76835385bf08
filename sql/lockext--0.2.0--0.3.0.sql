-- lockext 0.2.0 -> 0.3.0: ALTER EXTENSION lockext UPDATE TO '0.3.0'
-- Tokens that never repeat (src/token.rs): the era in force is decided by the cluster's own
-- record (pg_lockext/eras in the data directory), the counter is on disk before a token is
-- handed out, and a restart no longer spends an epoch. New installations get tokens below
-- 2^53; this one keeps 0.2.0's layout if it already handed out tokens, which are all above
-- 2^55: a token must never go backwards. Leases, resources and tokens are untouched.
\echo Use "ALTER EXTENSION lockext UPDATE TO '0.3.0'" to load this file. \quit

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
AS 'MODULE_PATHNAME', 'token_parts_wrapper';

-- The lease functions act for the role whose code calls them (src/caller.rs): SECURITY
-- INVOKER, becoming the tables' owner inside, instead of SECURITY DEFINER, where the
-- caller inside another role's maintenance or SECURITY DEFINER function was misread.
ALTER FUNCTION lockext.lock_acquire(text, text, interval, interval, interval, text, integer, boolean) SECURITY INVOKER;
ALTER FUNCTION lockext.lock_renew(text, text, interval, bigint) SECURITY INVOKER;
ALTER FUNCTION lockext.lock_release(text, text, bigint) SECURITY INVOKER;
ALTER FUNCTION lockext.lock_acquire_all(text[], text, interval, interval, text, boolean) SECURITY INVOKER;
ALTER FUNCTION lockext.lock_release_all(text[], text) SECURITY INVOKER;

-- Resources bound to the lock that guards them (lockext.bind_resource): they accept only
-- that lock's live grant. Unbound resources keep the high-water mark alone.
ALTER TABLE lockext.resources ADD COLUMN lock_id text;
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
                                ELSE format('The resource is bound to lock "%s", and fence token %s is not its live grant.',
                                            guard, fence_token) END,
                  HINT = 'This client''s lease was lost: stop, and acquire the lock again.';
    END IF;
END $$;

CREATE FUNCTION lockext.bind_resource(resource_id text, lock_id text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF resource_id IS NULL THEN
        RAISE EXCEPTION 'resource_id must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF resource_id = '' OR lock_id = '' THEN
        RAISE EXCEPTION 'resource_id and lock_id must not be empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(resource_id) > 256 OR octet_length(lock_id) > 256 THEN
        RAISE EXCEPTION 'resource_id and lock_id are at most 256 bytes long' USING ERRCODE = '22001';
    END IF;
    INSERT INTO lockext.resources AS r (resource_id, fence_token, data, updated_at, lock_id)
    VALUES (bind_resource.resource_id, 0, NULL, clock_timestamp(), bind_resource.lock_id)
    ON CONFLICT ON CONSTRAINT resources_pkey DO UPDATE SET lock_id = EXCLUDED.lock_id;
END $$;

CREATE OR REPLACE FUNCTION lockext.fence_read(resource_id text, fence_token bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    mark bigint;
    guard text;
BEGIN
    IF resource_id IS NULL THEN
        RAISE EXCEPTION 'resource_id must not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM lockext.check_token(fence_token);
    SELECT r.fence_token, r.lock_id INTO mark, guard FROM lockext.resources AS r
     WHERE r.resource_id = fence_read.resource_id FOR SHARE;
    IF guard IS NOT NULL AND NOT lockext.lock_check(guard, fence_token) THEN
        RAISE EXCEPTION 'fence token % is stale for resource "%"', fence_token, resource_id
            USING ERRCODE = '55L01',
                  DETAIL = format('The resource is bound to lock "%s", and fence token %s is not a live lease of it.',
                                  guard, fence_token),
                  HINT = 'This client''s lease was lost: stop, and acquire the lock again.';
    END IF;
    IF mark > fence_token THEN
        RAISE EXCEPTION 'fence token % is stale for resource "%"', fence_token, resource_id
            USING ERRCODE = '55L01',
                  DETAIL = format('A writer with fence token %s has written since.', mark),
                  HINT = 'This client''s lease was lost: stop, and acquire the lock again.';
    END IF;
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
STRICT VOLATILE SECURITY DEFINER PARALLEL UNSAFE
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
