-- Plain-SQL stand-in for lockext on Citus: a "ledger" per node (a local sequence, as lockext's
-- ledger is a per-server counter), a lease table distributed by lock id, and two acquire
-- functions delegated by lock id: naive (token = local counter) and fixed (per-lock high-water).
CREATE SCHEMA proto;
SET citus.shard_count = 8;
CREATE TABLE proto.leases (lock_id text PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL);
SELECT create_distributed_table('proto.leases', 'lock_id');
CREATE TABLE proto.lock_tokens (lock_id text PRIMARY KEY, high bigint NOT NULL);
SELECT create_distributed_table('proto.lock_tokens', 'lock_id', colocate_with := 'proto.leases');
-- every grant, for checking afterwards: moves with its lock id
CREATE TABLE proto.grants (lock_id text NOT NULL, token bigint NOT NULL, node int NOT NULL,
                           at timestamptz NOT NULL, variant text NOT NULL);
SELECT create_distributed_table('proto.grants', 'lock_id', colocate_with := 'proto.leases');

-- The node-local ledger: not distributed (DDL propagation off), one per node.
SET citus.enable_ddl_propagation = off;
CREATE SEQUENCE proto.ledger;
RESET citus.enable_ddl_propagation;

CREATE FUNCTION proto.acquire_naive(p_lock text, p_owner text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE t bigint;
BEGIN
  -- serialise grants of one lock id (lockext's gate does this)
  INSERT INTO proto.lock_tokens VALUES (p_lock, 0) ON CONFLICT DO NOTHING;
  PERFORM 1 FROM proto.lock_tokens WHERE lock_id = p_lock FOR UPDATE;
  t := nextval('proto.ledger');
  INSERT INTO proto.leases VALUES (p_lock, p_owner, t)
    ON CONFLICT (lock_id) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token;
  INSERT INTO proto.grants VALUES (p_lock, t, current_setting('port')::int, clock_timestamp(), 'naive');
  RETURN t;
END $$;

CREATE FUNCTION proto.acquire_fixed(p_lock text, p_owner text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE t bigint; h bigint;
BEGIN
  INSERT INTO proto.lock_tokens VALUES (p_lock, 0) ON CONFLICT DO NOTHING;
  SELECT high INTO h FROM proto.lock_tokens WHERE lock_id = p_lock FOR UPDATE;
  t := nextval('proto.ledger');
  IF t <= h THEN
    -- raise the node's counter to the lock's high-water (lockext: a ledger raise, WAL-logged,
    -- max-merged; here a raise-only setval under a node-wide advisory lock)
    PERFORM pg_advisory_xact_lock(424242);
    t := GREATEST(h + 1, nextval('proto.ledger'));
    PERFORM setval('proto.ledger', t);
  END IF;
  UPDATE proto.lock_tokens SET high = t WHERE lock_id = p_lock;
  INSERT INTO proto.leases VALUES (p_lock, p_owner, t)
    ON CONFLICT (lock_id) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token;
  INSERT INTO proto.grants VALUES (p_lock, t, current_setting('port')::int, clock_timestamp(), 'fixed');
  RETURN t;
END $$;

SELECT create_distributed_function('proto.acquire_naive(text,text)', '$1', colocate_with := 'proto.leases');
SELECT create_distributed_function('proto.acquire_fixed(text,text)', '$1', colocate_with := 'proto.leases');
