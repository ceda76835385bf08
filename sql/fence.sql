-- Fencing in the caller's own transaction, in SQL because a stale token is reported with
-- lockext's own SQLSTATE, 55L01, which only a SQL-level RAISE can set.
--
-- Why class 55 (object not in prerequisite state) and not class 40 (transaction rollback):
-- drivers and ORMs retry class 40 errors automatically, and a retry with the same stale
-- token can never succeed. The holder has lost its lease and must stop.

-- Checks and records the token in the caller's transaction, under the resource's row lock;
-- a stale token aborts the whole transaction, the caller's other writes with it:
--   BEGIN; SELECT lockext.fence('acct:42', $token); UPDATE accounts ...; COMMIT;
CREATE FUNCTION lockext.fence(resource_id text, fence_token bigint) RETURNS void
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

-- The reader's side, for holders of shared leases. Readers do not move the high-water mark
-- (two readers' tokens must not fence each other out); a reader is refused once a writer
-- with a newer token has written, and, on a bound resource, unless the token is a live
-- lease of the resource's lock taken by the reading role. The resource's row stays locked
-- in share mode to the end of the reader's transaction, so the reads that follow see no
-- writer's half-done work: a writer's fence waits for those transactions. SECURITY
-- INVOKER: the check must know the reading role (fence_read_check becomes the tables'
-- owner inside, as the lease functions do).
--   BEGIN; SELECT lockext.fence_read('acct:42', $token); SELECT ... FROM accounts ...; COMMIT;
CREATE FUNCTION lockext.fence_read(resource_id text, fence_token bigint) RETURNS void
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
CREATE FUNCTION lockext.fenced_read(resource_id text, fence_token bigint) RETURNS jsonb
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lockext.fence_read(resource_id, fence_token);
    RETURN (SELECT r.data FROM lockext.resources AS r WHERE r.resource_id = fenced_read.resource_id);
END $$;

-- A trigger that keeps a fence per row of a user table:
--   CREATE TRIGGER t_fence BEFORE INSERT OR UPDATE OR DELETE ON t
--       FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token' [, 'resource id']);
-- Every write must say which grant's holder writes, and a holder older than the row's
-- token is refused. The writer's token is the token column's new value when the write
-- sets one: an INSERT, and an UPDATE that names the column in its SET list, even to the
-- row's own value (the holder that wrote the row writing it again). An UPDATE that leaves
-- the column out, and a DELETE, carry none of their own, so they use the token the same
-- role declared in the same transaction (lockext.declare_token, which an accepted write
-- with a token also does). Refused otherwise, not accepted as the row's own holder: that
-- is how a stale holder would inherit the newer token. A declared token newer than the
-- row's is written into the row.
-- With a resource id, the writer's token also fences that resource (lockext.fence).
-- lockext.fence_guard is in C (src/fence.rs): PostgreSQL tells a trigger written in C
-- which columns the UPDATE names, and PL/pgSQL cannot see that; it then runs
-- lockext.fence_guard_row, the trigger's body, as the same trigger call.
CREATE FUNCTION lockext.fence_guard() RETURNS trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'lockext_fence_guard';

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
