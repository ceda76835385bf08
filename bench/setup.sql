-- The systems that bench/ compares with lockext, each in a schema of its own, in the
-- database that has lockext. Run by bench.py on a fresh scratch cluster.

-- The article's design, as written there. Its text creates the table before the sequence
-- that the table's DEFAULT names, which PostgreSQL refuses; here the sequence comes first.
-- Nothing else differs. Its statements are unqualified: pgbench runs them with
-- search_path = article (PGOPTIONS), as the article's application would.
CREATE SCHEMA article;
SET search_path = article;
CREATE SEQUENCE distributed_locks_fence_seq START 1 INCREMENT 1;
CREATE TABLE distributed_locks (
  lock_id    TEXT PRIMARY KEY,
  fence_token BIGINT NOT NULL DEFAULT nextval('distributed_locks_fence_seq'),
  owner      TEXT NOT NULL,
  expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX idx_distributed_locks_expires
  ON distributed_locks (expires_at);
-- The article shows only the UPDATE of its fenced resource, not its table: this is the
-- least that UPDATE needs.
CREATE TABLE protected_resources (
  resource_id      TEXT PRIMARY KEY,
  last_fence_token BIGINT,
  data             JSONB
);
RESET search_path;

-- The floor: the least any durable grant costs. One row per held lock, nothing else.
CREATE SCHEMA floor;
CREATE TABLE floor.leases (
  lock_id text PRIMARY KEY,
  owner   text NOT NULL
);
-- The floor as functions: the same INSERT and DELETE, each the body of a function called
-- the way lockext's are (SECURITY DEFINER, search_path pinned by a SET clause), with nothing
-- of lockext in them: what the call itself adds to a grant and a release. PL/pgSQL, which
-- keeps each statement's plan for the session as lockext does (a LANGUAGE sql function with
-- a SET clause is not inlined, and plans its body again at every call). The release turns
-- its commit asynchronous as the floor's does (synchronous_commit is not the SET clause's
-- variable, so the setting outlives the call, to the end of the transaction).
CREATE FUNCTION floor.acquire(lock text, who text) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  INSERT INTO floor.leases (lock_id, owner) VALUES (lock, who) ON CONFLICT DO NOTHING;
  RETURN CASE WHEN FOUND THEN 1 ELSE 0 END;
END $$;
CREATE FUNCTION floor.acquire_async(lock text, who text) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  INSERT INTO floor.leases (lock_id, owner) VALUES (lock, who) ON CONFLICT DO NOTHING;
  RETURN CASE WHEN FOUND THEN 1 ELSE 0 END;
END $$;
CREATE FUNCTION floor.release(lock text, who text) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  DELETE FROM floor.leases WHERE lock_id = lock AND owner = who;
  RETURN CASE WHEN FOUND THEN 1 ELSE 0 END;
END $$;
-- The floor of a read lock: one row per reader, keyed (lock_id, owner) as
-- lockext.shared_leases is, so that many readers hold one id at once. Nothing else.
CREATE TABLE floor.shared_leases (
  lock_id text NOT NULL,
  owner   text NOT NULL,
  PRIMARY KEY (lock_id, owner)
);

-- Bare single-row UPDATEs, the yardstick for renewals: the same row shape as a lease,
-- without and with an index on the column a renewal changes (with it, no HOT update).
CREATE SCHEMA bare;
CREATE TABLE bare.leases (
  lock_id    text PRIMARY KEY,
  owner      text NOT NULL,
  expires_at timestamptz NOT NULL
);
CREATE TABLE bare.leases_indexed (
  lock_id    text PRIMARY KEY,
  owner      text NOT NULL,
  expires_at timestamptz NOT NULL
);
CREATE INDEX ON bare.leases_indexed (expires_at);

-- Per-client hand-off counters for the contended and semaphore workloads: one UNLOGGED
-- sequence per pgbench client. nextval on it writes no WAL and takes no transaction id, so
-- counting costs no fsync and changes nothing about how the counted transaction commits.
CREATE SCHEMA bench;
DO $$
BEGIN
  FOR i IN 0..63 LOOP
    EXECUTE format('CREATE UNLOGGED SEQUENCE bench.handoffs_%s', i);
  END LOOP;
END $$;

-- A grant that a workload cannot be refused (a read lock that no writer ever takes): the
-- script calls this, which stops pgbench, rather than count the refusal as a cycle.
CREATE FUNCTION bench.refused(what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'bench: % was refused', what;
END $$;

-- The fenced workload's guarded rows: the same table twice, one guarded by lockext's
-- fence_guard trigger, one not, so that the trigger's cost is the difference.
CREATE SCHEMA guarded;
CREATE TABLE guarded.rows (
  id          int PRIMARY KEY,
  n           bigint NOT NULL,
  fence_token bigint NOT NULL
);
CREATE TRIGGER rows_fence BEFORE INSERT OR UPDATE OR DELETE ON guarded.rows
  FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
CREATE TABLE guarded.plain (LIKE guarded.rows INCLUDING ALL);
