-- Who may do what. lockext_user may call the lock functions; lockext_admin may also renew
-- and release other roles' leases. Everyone may read the tables; nobody writes them but
-- the functions, which run as their owner with a pinned search_path.
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_outsider, regress_app, regress_other_app, regress_ops;
RESET client_min_messages;
CREATE ROLE regress_outsider;
CREATE ROLE regress_app IN ROLE lockext_user;
CREATE ROLE regress_other_app IN ROLE lockext_user;
CREATE ROLE regress_ops IN ROLE lockext_admin;
\set VERBOSITY default

-- A role without lockext_user is refused by every lockext function it calls, before its
-- arguments are looked at, with the GRANT that lets it in; it changes nothing.
SET ROLE regress_outsider;
SELECT lockext.lock_acquire('vault', 'app-1', '1 minute');
SELECT lockext.lock_acquire(NULL, NULL, NULL);
SELECT lockext.fence('vault', 1);
RESET ROLE;
SELECT count(*) AS outsiders_leases FROM lockext.locks WHERE holder_role = 'regress_outsider'::regrole;
-- Every function a grant to lockext_user or lockext_admin lets members call refuses the
-- outsider itself (PUBLIC may execute them: sql/privileges.sql), with any arguments.
CREATE FUNCTION pg_temp.refusal(f regprocedure) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    args  text;
    state text;
    hint  text;
BEGIN
    SELECT coalesce(string_agg(format('NULL::%s', format_type(a.t, NULL)), ', ' ORDER BY a.n), '')
      INTO args
      FROM pg_proc p, unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, n)
     WHERE p.oid = f;
    EXECUTE format('SELECT * FROM %s(%s)', f::oid::regproc, args);
    RETURN 'not refused';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, hint = PG_EXCEPTION_HINT;
    RETURN state || ': ' || hint;
END $$;
SET ROLE regress_outsider;
SELECT p.proname, pg_temp.refusal(p.oid) AS refused_with
  FROM pg_proc p
 WHERE p.pronamespace = 'lockext'::regnamespace
   AND pg_catalog.array_to_string(p.proacl, ' ') ~ 'lockext_(user|admin)='
 ORDER BY 1;
RESET ROLE;
-- Writing a table guarded by fence_guard needs lockext_user too: the error names the table.
CREATE TABLE regress_guarded (id int PRIMARY KEY, fence_token bigint);
CREATE TRIGGER regress_guarded_fence BEFORE INSERT OR UPDATE OR DELETE ON regress_guarded
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
INSERT INTO regress_guarded VALUES (1, 1);
GRANT SELECT, INSERT, UPDATE, DELETE ON regress_guarded TO regress_outsider;
SET ROLE regress_outsider;
INSERT INTO regress_guarded VALUES (2, 1);
DELETE FROM regress_guarded;
RESET ROLE;
SELECT count(*) AS guarded_rows FROM regress_guarded;
DROP TABLE regress_guarded;
-- An operator's function refuses a member that is not lockext_admin's.
SET ROLE regress_app;
SELECT lockext.stats_reset();
SELECT lockext.reap();
RESET ROLE;

SET ROLE regress_app;
SELECT owner FROM lockext.lock_acquire('vault', 'app-1', '1 minute');
-- Reading is allowed, and shows who took the lease.
SELECT lock_id, owner, holder_role::regrole FROM lockext.locks WHERE lock_id = 'vault';
-- Writing the tables or moving the sequence directly is not.
UPDATE lockext.locks SET expires_at = 'infinity' WHERE lock_id = 'vault';
INSERT INTO lockext.resources VALUES ('vault', 9, '{}', now());
SELECT nextval('lockext.fence_token_seq');
SELECT setval('lockext.fence_token_seq', 1);
-- Nor minting a token of one's own (lockext's own, called inside a grant's statement).
SELECT lockext.grant_token();
-- Nor making or ending a keep-alive (lockext's own end_keepalive is called inside a
-- grant's statement). Reading an attached lease's expiry is anyone's, whatever their
-- search_path: lease_expiry's one statement names even its operator.
INSERT INTO lockext.keepalives VALUES (1, 10, '1 minute', now(), 'infinity');
SELECT lockext.end_keepalive(1, now());
SELECT lockext.lease_expiry('2026-01-01', NULL), lockext.lease_expiry('2026-01-01', 1);
RESET ROLE;
-- Not even a superuser mints one outside a grant.
SELECT lockext.grant_token();

-- A hijack attempt: look-alike functions and operators in a schema the caller puts first.
-- lockext's functions run with search_path = pg_catalog, pg_temp and never call them.
CREATE SCHEMA regress_evil AUTHORIZATION regress_app;
SET ROLE regress_app;
CREATE FUNCTION regress_evil.nextval(regclass) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint';
CREATE FUNCTION regress_evil.clock_timestamp() RETURNS timestamptz
    LANGUAGE sql AS $$SELECT '2000-01-01'::timestamptz$$;
CREATE FUNCTION regress_evil.always(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR regress_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = regress_evil.always);
CREATE OPERATOR regress_evil.> (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = pg_catalog.timestamptz_lt);
SET search_path = regress_evil, public;
SELECT lockext.lock_acquire('vault', 'app-2', '1 minute') IS NULL AS still_refused;
SELECT layout = 2 AND counter > 1 AS real_token
  FROM lockext.lock_acquire('vault-2', 'app-1', '1 minute') g, lockext.token_parts(g.fence_token);
RESET search_path;
RESET ROLE;
DROP SCHEMA regress_evil CASCADE;

-- Another role cannot renew or release app-1's grant, even knowing its owner string.
SET ROLE regress_other_app;
SELECT lockext.lock_renew('vault', 'app-1', '1 minute') AS renewed;
SELECT lockext.lock_release('vault', 'app-1') AS released;
-- Code of another role that runs inside an administrator's maintenance acts for the role
-- whose code it is, not for the administrator. Here regress_other_app hides a release of
-- app-1's lease (and a renewal) in an index expression over its own table; a superuser's
-- ANALYZE evaluates the expression as the table's owner (a security-restricted operation),
-- and the lease must survive it.
RESET ROLE;
CREATE SCHEMA regress_trap AUTHORIZATION regress_other_app;
SET ROLE regress_other_app;
CREATE TABLE regress_trap.t (lock_id text);
CREATE FUNCTION regress_trap.fn(text) RETURNS boolean LANGUAGE sql IMMUTABLE
    AS $$ SELECT lockext.lock_release($1, 'app-1') OR lockext.lock_renew($1, 'app-1', '1 day') IS NOT NULL $$;
INSERT INTO regress_trap.t VALUES ('vault');
CREATE INDEX regress_trap_idx ON regress_trap.t ((regress_trap.fn(lock_id)));
RESET ROLE;
ANALYZE regress_trap.t;
SELECT lock_id, owner, holder_role::regrole, expires_at - acquired_at < interval '1 hour' AS not_renewed
  FROM lockext.locks WHERE lock_id = 'vault';
-- The same through another role's SECURITY DEFINER function called by an administrator:
-- it acts for its definer.
SET ROLE regress_other_app;
GRANT USAGE ON SCHEMA regress_trap TO PUBLIC;
CREATE FUNCTION regress_trap.definer_fn() RETURNS boolean LANGUAGE sql SECURITY DEFINER
    AS $$ SELECT lockext.lock_release('vault', 'app-1') $$;
RESET ROLE;
SET ROLE regress_ops;
SELECT regress_trap.definer_fn() AS released_through_definer;
RESET ROLE;
SET client_min_messages = warning;
DROP SCHEMA regress_trap CASCADE;
RESET client_min_messages;
-- lockext_admin's power is its privileges, as PostgreSQL grants them: a member through a
-- membership that is not inherited (a NOINHERIT role in between; from 16 on also a grant
-- WITH INHERIT FALSE) does not have them, and is refused as any member is.
CREATE ROLE regress_admins NOINHERIT IN ROLE lockext_admin;
CREATE ROLE regress_half IN ROLE lockext_user, regress_admins;
SET ROLE regress_half;
SELECT lockext.lock_release('vault', 'app-1') AS released_by_a_member_without_its_privileges;
SELECT lockext.lock_renew('vault', 'app-1', '1 hour') AS renewed_by_a_member_without_its_privileges;
RESET ROLE;
SELECT count(*) AS still_held FROM lockext.locks WHERE lock_id = 'vault';
DROP ROLE regress_half, regress_admins;
-- An operator can clear a stuck lock.
SET ROLE regress_ops;
SELECT lockext.lock_release('vault', 'app-1') AS released_by_admin;
RESET ROLE;

-- Functions and their EXECUTE rights.
SELECT p.proname, pg_catalog.array_to_string(p.proacl, ' ') AS acl
  FROM pg_proc p WHERE p.pronamespace = 'lockext'::regnamespace ORDER BY 1;

-- A schema "lockext" made by another role before CREATE EXTENSION: lockext refuses it
-- (that role could swap lockext's objects for its own, which lockext's functions and the
-- reaper would then run as lockext's owner).
CREATE DATABASE regress_squat OWNER regress_app;
\c regress_squat
SET ROLE regress_app;
CREATE SCHEMA lockext;
RESET ROLE;
-- (Without its context, which names the script's lines from 18 on.)
\set SHOW_CONTEXT never
CREATE EXTENSION lockext;
\set SHOW_CONTEXT errors
SELECT count(*) AS installed FROM pg_extension WHERE extname = 'lockext';
\c lockext_regress
DROP DATABASE regress_squat;

DROP ROLE regress_outsider, regress_app, regress_other_app, regress_ops;
