-- lockext 0.3.0 -> 0.4.0: ALTER EXTENSION lockext UPDATE TO '0.4.0'
-- Leases, resources and tokens are untouched. Each section below names what it changes.
\echo Use "ALTER EXTENSION lockext UPDATE TO '0.4.0'" to load this file. \quit

-- ---- fence_guard: an UPDATE that names the token column carries its token -------------
-- lockext.fence_guard becomes a trigger in Rust (src/fence.rs): it reads which columns the
-- UPDATE names (tg_updatedcols), which the PL/pgSQL trigger could not, and the token column
-- of the rows by its number, instead of converting each row to jsonb. Its checks and errors
-- are the PL/pgSQL trigger's, but for the token column's type, now checked on the column
-- (bigint, integer, smallint, or a domain over one of them) rather than on the row's value.
-- Replaced in place: the triggers that use it keep it.
CREATE OR REPLACE FUNCTION lockext.fence_guard() RETURNS trigger
LANGUAGE c SET search_path = pg_catalog, pg_temp AS 'MODULE_PATHNAME', 'lockext_fence_guard';


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


-- ---- Citus: each lock id's highest token ---------------------------------------------
-- The highest token each lock id's grants ever had, on a Citus cluster only (src/citus.rs):
-- each grant there records its token in its own transaction, and the row moves with the
-- lock id's shard, so a grant on the node a shard moved to starts above it. Empty on a
-- single server, whose one ledger already keeps every lock id's tokens rising.
CREATE TABLE lockext.lock_tokens (
    lock_id text   PRIMARY KEY,
    high    bigint NOT NULL
);
SELECT pg_catalog.pg_extension_config_dump('lockext.lock_tokens', '');
REVOKE ALL ON lockext.lock_tokens FROM PUBLIC;
GRANT SELECT ON lockext.lock_tokens TO PUBLIC;
-- On a Citus cluster (src/citus.rs): the highest token any node can have handed out when
-- lockext.citus_distribute() distributed the lease tables (before it, each node minted for
-- its own tables). Every grant there starts above it, and above its lock id's highest.
-- A reference table there (on every node, and on nodes added later); empty on one server.
CREATE TABLE lockext.token_floor (
    singleton boolean PRIMARY KEY CHECK (singleton),
    floor     bigint  NOT NULL
);
SELECT pg_catalog.pg_extension_config_dump('lockext.token_floor', '');
REVOKE ALL ON lockext.token_floor FROM PUBLIC;
GRANT SELECT ON lockext.token_floor TO PUBLIC;


-- ---- Citus: lockext.citus_distribute() (sql/citus.sql) ---------------------------------
CREATE FUNCTION lockext."highest_issued_token"() RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'highest_issued_token_wrapper';
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
