-- fixed + the placement guard: take the shard's metadata lock (ShareLock, to the end of the
-- transaction: a move's final phase takes ExclusiveLock on every node), then check that the
-- placement is on this node; else refuse (retryable), so that the caller's retry is routed anew.
CREATE OR REPLACE FUNCTION proto.acquire_flushed(p_lock text, p_owner text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE t bigint; h bigint; s bigint;
BEGIN
  s := 0;
  PERFORM set_config('synchronous_commit', 'local', true);
  INSERT INTO proto.lock_tokens VALUES (p_lock, 0) ON CONFLICT DO NOTHING;
  SELECT high INTO h FROM proto.lock_tokens WHERE lock_id = p_lock FOR UPDATE;
  t := nextval('proto.ledger');
  IF t <= h THEN
    PERFORM pg_advisory_xact_lock(424242);
    t := GREATEST(h + 1, nextval('proto.ledger'));
    PERFORM setval('proto.ledger', t);
  END IF;
  UPDATE proto.lock_tokens SET high = t WHERE lock_id = p_lock;
  INSERT INTO proto.leases VALUES (p_lock, p_owner, t)
    ON CONFLICT (lock_id) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token;
  INSERT INTO proto.grants VALUES (p_lock, t, current_setting('port')::int, clock_timestamp(), 'flushed');
  RAISE NOTICE 'node % shard %', current_setting('port'), s;
  RETURN t;
END $$;
SELECT create_distributed_function('proto.acquire_flushed(text,text)', '$1', colocate_with := 'proto.leases');

-- fixed + the placement guard: take the shard's metadata lock (ShareLock, to the end of the
-- transaction: a move's final phase takes ExclusiveLock on every node), then check that the
-- placement is on this node; else refuse (retryable), so that the caller's retry is routed anew.
CREATE OR REPLACE FUNCTION proto.acquire_gflushed(p_lock text, p_owner text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE t bigint; h bigint; s bigint;
BEGIN
  PERFORM set_config('synchronous_commit', 'local', true);
  s := get_shard_id_for_distribution_column('proto.leases', p_lock);
  PERFORM lock_shard_metadata(5, ARRAY[s]);
  IF NOT EXISTS (SELECT 1 FROM pg_dist_placement WHERE shardid = s
                 AND groupid = (SELECT groupid FROM pg_dist_local_group)) THEN
    RAISE EXCEPTION 'lock id % is not on this node (shard %)', p_lock, s USING ERRCODE = '40001';
  END IF;
  INSERT INTO proto.lock_tokens VALUES (p_lock, 0) ON CONFLICT DO NOTHING;
  SELECT high INTO h FROM proto.lock_tokens WHERE lock_id = p_lock FOR UPDATE;
  t := nextval('proto.ledger');
  IF t <= h THEN
    PERFORM pg_advisory_xact_lock(424242);
    t := GREATEST(h + 1, nextval('proto.ledger'));
    PERFORM setval('proto.ledger', t);
  END IF;
  UPDATE proto.lock_tokens SET high = t WHERE lock_id = p_lock;
  INSERT INTO proto.leases VALUES (p_lock, p_owner, t)
    ON CONFLICT (lock_id) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token;
  INSERT INTO proto.grants VALUES (p_lock, t, current_setting('port')::int, clock_timestamp(), 'gflushed');
  RAISE NOTICE 'node % shard %', current_setting('port'), s;
  RETURN t;
END $$;
SELECT create_distributed_function('proto.acquire_gflushed(text,text)', '$1', colocate_with := 'proto.leases');
