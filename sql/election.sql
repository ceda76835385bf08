-- Setting the value of a grant (src/election.rs), in SQL because a holder that no longer
-- holds the grant is refused with lockext's own SQLSTATE, 55L01, which only a SQL-level
-- RAISE can set: the same error as a stale token at a fence, for the same reason (the
-- holder lost its lease and must stop; class 55, which drivers do not retry).

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
