-- ALTER EXTENSION lockext UPDATE, from the first released version (0.1.0) to the current
-- one: leases, resources and tokens survive, and the result is the same as a fresh install.
SELECT extversion AS current_version FROM pg_extension WHERE extname = 'lockext';
SELECT pg_catalog.array_agg(version ORDER BY version) AS installable
  FROM pg_available_extension_versions WHERE name = 'lockext';

-- What lockext's objects look like: members, columns, functions, views, privileges.
CREATE FUNCTION pg_temp.lockext_shape() RETURNS SETOF text LANGUAGE sql AS $$
    SELECT 'member: ' || pg_describe_object(classid, objid, objsubid)
      FROM pg_depend
     WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
       AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'lockext')
    UNION ALL
    SELECT format('column: %s.%s %s%s default %s', c.relname, a.attname,
                  format_type(a.atttypid, a.atttypmod),
                  CASE WHEN a.attnotnull THEN ' not null' ELSE '' END,
                  coalesce(pg_get_expr(d.adbin, d.adrelid), '-'))
      FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
      LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
     WHERE c.relnamespace = 'lockext'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'function: ' || pg_get_functiondef(p.oid) || ' acl ' || coalesce(p.proacl::text, 'default')
      FROM pg_proc p WHERE p.pronamespace = 'lockext'::regnamespace
    UNION ALL
    SELECT format('relation: %s %s acl %s options %s %s', c.relname, c.relkind, coalesce(c.relacl::text, 'default'),
                  coalesce(c.reloptions::text, '-'),
                  CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid) ELSE '' END)
      FROM pg_class c WHERE c.relnamespace = 'lockext'::regnamespace
    UNION ALL
    SELECT 'dumped: ' || cfg::regclass::text
      FROM pg_extension e, unnest(e.extconfig) cfg WHERE e.extname = 'lockext'
$$;
CREATE TEMP TABLE fresh_shape AS SELECT * FROM pg_temp.lockext_shape();

-- Start over at 0.1.0, with data in it (CASCADE: earlier tests' fence_guard triggers).
SET client_min_messages = warning;
DROP EXTENSION lockext CASCADE;
RESET client_min_messages;
CREATE EXTENSION lockext VERSION '0.1.0';
-- Data as 0.1.0 left it. (Written directly: the installed library is the current one, and
-- its functions expect the current schema. That is why ALTER EXTENSION UPDATE belongs
-- right after installing a new build.)
INSERT INTO lockext.token_epoch
SELECT true, 4096, system_identifier, timeline_id, (SELECT oid FROM pg_database WHERE datname = current_database()), 0, now()
  FROM pg_control_system(), pg_control_checkpoint();
SELECT setval('lockext.fence_token_seq', 41) AS counter;
SELECT (4096::bigint << 43) | 41 AS t \gset
INSERT INTO lockext.locks VALUES ('kept-lease', 'worker-1', :t, 'postgres'::regrole, now(), now() + interval '1 hour');
INSERT INTO lockext.resources VALUES ('kept-resource', :t, '{"v": 1}', now());

ALTER EXTENSION lockext UPDATE;
SELECT extversion AS updated_to FROM pg_extension WHERE extname = 'lockext';

-- The data survived, and the new version's objects work on it.
SELECT lock_id, owner, fence_token = :t AS same_token, renewals FROM lockext.locks;
SELECT resource_id, fence_token = :t AS same_mark, data FROM lockext.resources;
SELECT lock_id, owner, mode, role FROM lockext.holders;
SELECT lockext.lock_renew('kept-lease', 'worker-1', '1 hour', :t) IS NOT NULL AS renewed;
SELECT fence_token > :t AS next_token_is_higher FROM lockext.lock_acquire('new-lease', 'worker-2', '1 hour');
-- It had handed out tokens (above 2^53), so it keeps 0.2.0's layout: a token never goes
-- backwards. Its era starts above every epoch 0.2.0 could have used (the next era's).
SELECT p.layout, p.era > ((4096 >> 12) + 1) << 12 | 4095 AS above_the_next_era, e.layout AS recorded
  FROM lockext.locks l, lockext.token_parts(l.fence_token) p, lockext.token_epoch e
 WHERE l.lock_id = 'new-lease';

-- Updated and fresh are the same, object for object.
SELECT count(*) > 40 AS fresh_shape_is_described FROM fresh_shape;
SELECT * FROM pg_temp.lockext_shape() EXCEPT SELECT * FROM fresh_shape;
SELECT * FROM fresh_shape EXCEPT SELECT * FROM pg_temp.lockext_shape();

-- A reinstall keeps the layout the database used (the cluster's record remembers it), and
-- the tokens keep rising.
SELECT max(fence_token) AS before_reinstall FROM lockext.locks \gset
SET client_min_messages = warning;
DROP EXTENSION lockext CASCADE;
RESET client_min_messages;
CREATE EXTENSION lockext;
SELECT p.layout, g.fence_token > :before_reinstall AS higher
  FROM lockext.lock_acquire('after-reinstall', 'worker-3', '1 hour') g, lockext.token_parts(g.fence_token) p;
