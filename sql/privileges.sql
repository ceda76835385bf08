-- Who may do what; runs after the functions exist (pgrx "finalize").
--
-- lockext_user may take, renew and release leases and write fenced resources.
-- lockext_admin (a member of lockext_user) may also renew and release leases that other
-- roles took, for an operator clearing a stuck lock. Superusers are both.
-- Roles belong to the whole cluster: they outlive DROP EXTENSION, and CREATE EXTENSION in
-- another database finds them already there.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'lockext_user') THEN
        CREATE ROLE lockext_user NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'lockext_admin') THEN
        CREATE ROLE lockext_admin NOLOGIN IN ROLE lockext_user;
    END IF;
END $$;

-- Writers of a table guarded by lockext.fence_guard need lockext_user too: the trigger
-- runs with their rights and calls declared_token, fence_row and fence.
--
-- EXECUTE goes to PUBLIC as well: each of these functions checks its caller's privileges
-- itself, first, and refuses a caller without them with the GRANT to make (src/caller.rs;
-- fence_guard names the table). PostgreSQL's own check would refuse first, naming the
-- function, often an internal one, and not the role. A function added to this list must
-- make that check (05_security calls every one as a non-member). The grant to the role
-- stays: with PUBLIC's revoked again, members are still served.
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
        'lockext.lock_campaign(text, text, interval, jsonb, interval, interval, text, integer, boolean)',
        'lockext.lock_set_value(text, text, bigint, jsonb)',
        'lockext.set_lease_value(text, text, bigint, jsonb)',
        'lockext.lock_holders(text)',
        'lockext.lock_observe(text, bigint, bigint, interval)',
        'lockext.lock_keepalive_grant(interval)',
        'lockext.lock_keepalive_renew(bigint, interval)',
        'lockext.lock_keepalive_revoke(bigint)'
    ]::regprocedure[] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO lockext_user', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);
    END LOOP;
END $$;

-- lockext's own check, run by fenced writes as the extension's owner.
REVOKE ALL ON FUNCTION lockext.exclusive_grant_live(text, bigint, oid) FROM PUBLIC;

-- lockext's own: the token of a grant, minted inside the statement that makes it.
REVOKE ALL ON FUNCTION lockext.grant_token() FROM PUBLIC;

-- lockext's own, called by its grants' statements as the extension's owner: the end of an
-- expired keep-alive. (lockext.lease_expiry, which only reads, stays PUBLIC's: lock_check
-- and the fence reads run as their caller.)
REVOKE ALL ON FUNCTION lockext.end_keepalive(bigint, timestamptz) FROM PUBLIC;

-- Binding a resource to its lock is an operator's decision.
REVOKE ALL ON FUNCTION lockext.bind_resource(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.bind_resource(text, text) TO lockext_admin;
GRANT EXECUTE ON FUNCTION lockext.bind_resource(text, text) TO PUBLIC; -- checks lockext_admin

-- Ending expired leases now, before the reaper's next round, is an operator's decision.
REVOKE ALL ON FUNCTION lockext.reap() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.reap() TO lockext_admin;
GRANT EXECUTE ON FUNCTION lockext.reap() TO PUBLIC; -- checks lockext_admin

-- Resetting the counters is an operator's decision.
REVOKE ALL ON FUNCTION lockext.stats_reset() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lockext.stats_reset() TO lockext_admin;
GRANT EXECUTE ON FUNCTION lockext.stats_reset() TO PUBLIC; -- checks lockext_admin

