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
