-- lockext installs into its own schema, with a grant type, two tables and a sequence.
CREATE EXTENSION lockext;
SELECT extname, extversion, nspname AS schema, extrelocatable
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
 WHERE extname = 'lockext';
-- The SQL interface: names, arguments and results are a contract.
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result, p.prosecdef AS security_definer,
       p.proconfig AS settings
  FROM pg_proc p WHERE p.pronamespace = 'lockext'::regnamespace
 ORDER BY p.proname;
SELECT attname, format_type(atttypid, atttypmod)
  FROM pg_attribute WHERE attrelid = 'lockext.lock_grant'::regclass AND attnum > 0
 ORDER BY attnum;
-- Tables and sequence are dumped by pg_dump even though the extension owns them.
SELECT c.relname FROM pg_extension e, unnest(e.extconfig) AS cfg(oid)
  JOIN pg_class c ON c.oid = cfg.oid
 WHERE e.extname = 'lockext' ORDER BY 1;
