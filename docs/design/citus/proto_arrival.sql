-- The design's variant: no per-grant high-water check. The first grant under a new placement of
-- its shard on this node raises the node's counter above every token in the shard's rows
-- (lease rows here are never deleted; lockext keeps lock_tokens for deleted ones); then mint
-- from the node's counter. Guard + flushed commit as in gflushed.
CREATE OR REPLACE FUNCTION proto.acquire_arrival(p_lock text, p_owner text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE t bigint; s bigint; pid bigint; m bigint;
BEGIN
  PERFORM set_config('synchronous_commit', 'local', true);
  s := get_shard_id_for_distribution_column('proto.leases', p_lock);
  PERFORM lock_shard_metadata(5, ARRAY[s]);
  SELECT placementid INTO pid FROM pg_dist_placement
   WHERE shardid = s AND groupid = (SELECT groupid FROM pg_dist_local_group);
  IF pid IS NULL THEN
    RAISE EXCEPTION 'lock id % is not on this node (shard %)', p_lock, s USING ERRCODE = '40001';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM proto.raised WHERE placementid = pid) THEN
    PERFORM pg_advisory_xact_lock(424242);
    EXECUTE format('SELECT max(token) FROM proto.%I', 'leases_' || s) INTO m;
    IF m IS NOT NULL THEN
      PERFORM setval('proto.ledger', GREATEST(m, (SELECT last_value FROM proto.ledger)));
    END IF;
    INSERT INTO proto.raised VALUES (pid) ON CONFLICT DO NOTHING;
  END IF;
  -- the node's counter: shared for minting, exclusive for a raise (lockext's ledger raises by
  -- max-merge under its own lock; setval alone could lower it under a concurrent nextval)
  PERFORM pg_advisory_xact_lock_shared(424242);
  t := nextval('proto.ledger');
  INSERT INTO proto.leases VALUES (p_lock, p_owner, t)
    ON CONFLICT (lock_id) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token;
  INSERT INTO proto.grants VALUES (p_lock, t, current_setting('port')::int, clock_timestamp(), 'arrival');
  RETURN t;
END $$;
SELECT create_distributed_function('proto.acquire_arrival(text,text)', '$1', colocate_with := 'proto.leases');
