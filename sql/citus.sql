-- lockext on a Citus cluster (src/citus.rs, docs/citus.md): CALL lockext.citus_distribute()
-- once, on the coordinator, outside a transaction block, as the owner of lockext's tables (a
-- superuser), after CREATE EXTENSION lockext there. Until it runs, lockext on a Citus cluster
-- is a single-node lock service on each node, as on any server. In two transactions:
-- 1. the lease tables distributed by lock id in one colocation group (shard_count shards),
--    lockext.resources by resource id in the same group (a resource bound to the lock of its
--    own id is in that lock's shard), and each per-lock function delegated by Citus to the
--    node that holds the shard of its first argument (the lock id, or the resource id);
--    committed: from then on no node grants from a table of its own, and a grant on the
--    cluster is refused (55000) until 2 is done;
-- 2. the highest token any node can have handed out until then (each node's ledger), recorded
--    in lockext.token_floor, a reference table (every node, nodes added later), which every
--    grant starts above.
-- Idempotent: a table or function already distributed is left as it is, and so is the floor
-- once recorded; run again after an interruption, it finishes the job.
CREATE PROCEDURE lockext.citus_distribute(shard_count integer DEFAULT 32)
LANGUAGE plpgsql AS $$
DECLARE
    t text;
    f text;
    failed text;
BEGIN
    -- A procedure with a SET clause may not COMMIT: search_path is pinned in each of its
    -- transactions instead.
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'lockext.citus_distribute() needs the citus extension in this database'
            USING ERRCODE = '55000';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'lockext.locks'::regclass) THEN
        PERFORM create_distributed_table('lockext.locks', 'lock_id', shard_count => shard_count);
    END IF;
    FOREACH t IN ARRAY ARRAY['lockext.shared_leases', 'lockext.lease_values', 'lockext.lock_tokens',
                             'lockext.resources'] LOOP
        IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = t::regclass) THEN
            PERFORM create_distributed_table(t, CASE t WHEN 'lockext.resources' THEN 'resource_id'
                                                       ELSE 'lock_id' END,
                                             colocate_with => 'lockext.locks');
        END IF;
    END LOOP;
    FOREACH f IN ARRAY ARRAY[
        'lockext.lock_acquire(text,text,interval,interval,interval,text,integer,boolean,bigint)',
        'lockext.lock_renew(text,text,interval,bigint)',
        'lockext.lock_release(text,text,bigint)',
        'lockext.lock_check(text,bigint)',
        'lockext.lock_campaign(text,text,interval,jsonb,interval,interval,text,integer,boolean)',
        'lockext.lock_set_value(text,text,bigint,jsonb)',
        'lockext.lock_holders(text)',
        'lockext.lock_observe(text,bigint,bigint,interval)',
        'lockext.fenced_update(text,bigint,jsonb)',
        'lockext.fence_read(text,bigint)',
        'lockext.fenced_read(text,bigint)',
        'lockext.bind_resource(text,text)'] LOOP
        PERFORM create_distributed_function(f::regprocedure, '$1', colocate_with => 'lockext.locks');
    END LOOP;
    COMMIT;
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'lockext.token_floor'::regclass) THEN
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
        SELECT string_agg(format('node %s: %s', nodeid, result), '; ') INTO failed
          FROM run_command_on_all_nodes('SELECT lockext.highest_issued_token()')
         WHERE NOT success;
        IF failed IS NOT NULL THEN
            RAISE EXCEPTION 'lockext.citus_distribute() could not read every node''s highest token: %', failed
                USING ERRCODE = '55000';
        END IF;
        INSERT INTO lockext.token_floor
        SELECT true, coalesce(max(result::bigint), 0)
          FROM run_command_on_all_nodes('SELECT lockext.highest_issued_token()')
        ON CONFLICT (singleton) DO NOTHING;
        PERFORM create_reference_table('lockext.token_floor');
    END IF;
END
$$;
REVOKE ALL ON PROCEDURE lockext.citus_distribute(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION lockext.highest_issued_token() FROM PUBLIC;
