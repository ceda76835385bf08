-- Fencing in the caller's own transaction. fence and the readers are in SQL because a
-- stale token is reported with lockext's own SQLSTATE, 55L01, which a pgrx function cannot
-- raise; the fence_guard trigger, in Rust, raises it from an entry point of its own.
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
-- lockext.fence_guard is in Rust (src/fence.rs, lockext_fence_guard), all of it: it reads
-- which columns the UPDATE names (which PL/pgSQL cannot see) and the token column of the
-- rows as PostgreSQL hands them over, by the column's number. The token column is bigint,
-- integer or smallint, or a domain over one of them (42804 otherwise). It runs with the
-- writer's rights; lockext's own table writes inside it run as the tables' owner, as
-- fence_row's and fence's do. search_path is pinned for the statements they run.
CREATE FUNCTION lockext.fence_guard() RETURNS trigger
LANGUAGE c SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', 'lockext_fence_guard';
