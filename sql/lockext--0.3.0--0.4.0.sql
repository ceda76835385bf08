-- lockext 0.3.0 -> 0.4.0: ALTER EXTENSION lockext UPDATE TO '0.4.0'
-- Leases, resources and tokens are untouched. Each section below names what it changes.
\echo Use "ALTER EXTENSION lockext UPDATE TO '0.4.0'" to load this file. \quit

-- ---- fence_guard: an UPDATE that names the token column carries its token -------------
-- lockext.fence_guard becomes a C trigger that reads which columns the UPDATE names
-- (tg_updatedcols) and runs its body, lockext.fence_guard_row (PL/pgSQL, as the trigger
-- was), as the same trigger call. Replaced in place: the triggers that use it keep it.
CREATE FUNCTION lockext."token_column_named"() RETURNS bool /* Option < bool > */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'token_column_named_wrapper';

-- fence_guard's body; a trigger only lockext.fence_guard runs (alone it would take every
-- UPDATE as one that leaves the token column out).
-- Runs with the writer's rights (a trigger running as the extension's owner would run the
-- table's own type output functions with those rights).
CREATE FUNCTION lockext.fence_guard_row() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- Asked first: the answer is for this trigger call only.
    named     boolean := lockext.token_column_named();
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
    IF TG_OP = 'UPDATE' AND named IS NULL THEN
        RAISE EXCEPTION 'lockext.fence_guard_row runs only as the body of lockext.fence_guard'
            USING ERRCODE = '39P01',
                  HINT = format('CREATE TRIGGER ... BEFORE INSERT OR UPDATE OR DELETE ON %I.%I FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard(%L)',
                                TG_TABLE_SCHEMA, TG_TABLE_NAME, col);
    END IF;
    IF TG_OP <> 'INSERT' THEN
        old_token := (to_jsonb(OLD) ->> col)::bigint;
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND (coalesce(named, false)
                                                  OR (row_now ->> col)::bigint IS DISTINCT FROM old_token)) THEN
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
            RAISE EXCEPTION '% must declare the writer''s fence token',
                            CASE TG_OP WHEN 'DELETE' THEN format('a DELETE on %s.%s', TG_TABLE_SCHEMA, TG_TABLE_NAME)
                                       ELSE format('an UPDATE on %s.%s that leaves "%s" out of its SET list',
                                                   TG_TABLE_SCHEMA, TG_TABLE_NAME, col) END
                USING ERRCODE = '22004',
                      DETAIL = 'The row carries no token of its writer: without one, a holder whose lease was lost could write over a newer holder''s row.',
                      HINT = CASE TG_OP
                             WHEN 'DELETE' THEN 'SELECT lockext.declare_token(<token>) first, in the same transaction and as the same role.'
                             ELSE format('SELECT lockext.declare_token(<token>) first, in the same transaction and as the same role, or SET "%s" = <token> in the UPDATE.', col)
                             END;
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

CREATE OR REPLACE FUNCTION lockext.fence_guard() RETURNS trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'lockext_fence_guard';


-- ---- token history: the ledger -------------------------------------------------------
-- Tokens come from the cluster's token ledger (src/ledger.rs), carried by the WAL, instead
-- of each database's sequence under an era from a file beside the data directory. The
-- library adopts this database's history on its own (token.rs): nothing to move here.

-- 0.1.0 and 0.2.0 dumps carry a `boot` column in the epoch row: the row then restores,
-- and is evidence of the tokens they handed out.
ALTER TABLE lockext.token_epoch ADD COLUMN boot bigint;


-- ---- values: bounded per role --------------------------------------------------------
-- A value records the role that set it (its grant's), so that what one role stores can be
-- summed (lockext.role_values_size). Values whose grant is gone are deleted here (nobody
-- shows them; the reaper would have); the others take their lease's role (0 if that lease
-- ended in the meantime: a value counted for no role, deleted by the reaper).
DELETE FROM lockext.lease_values AS v
 WHERE NOT EXISTS (SELECT FROM lockext.locks AS l
                    WHERE l.lock_id = v.lock_id AND l.fence_token = v.fence_token)
   AND NOT EXISTS (SELECT FROM lockext.shared_leases AS s
                    WHERE s.lock_id = v.lock_id AND s.fence_token = v.fence_token);
ALTER TABLE lockext.lease_values ADD COLUMN holder_role oid;
UPDATE lockext.lease_values AS v
   SET holder_role = coalesce(
       (SELECT l.holder_role FROM lockext.locks AS l
         WHERE l.lock_id = v.lock_id AND l.fence_token = v.fence_token),
       (SELECT s.holder_role FROM lockext.shared_leases AS s
         WHERE s.lock_id = v.lock_id AND s.fence_token = v.fence_token),
       0);
ALTER TABLE lockext.lease_values ALTER COLUMN holder_role SET NOT NULL;
CREATE INDEX lease_values_role_idx ON lockext.lease_values (holder_role);


-- ---- lockext.reap: the reaper's batch, now ---------------------------------------------
-- One batch of the reaper's, run in the caller's transaction (src/reaper.rs): for an
-- operator, and for the schedule explorer, which stops it at each of its pause points.
CREATE FUNCTION lockext."reap"() RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'reap_wrapper';
REVOKE ALL ON FUNCTION lockext.reap() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.reap() TO lockext_admin;
GRANT EXECUTE ON FUNCTION lockext.reap() TO PUBLIC; -- checks lockext_admin
