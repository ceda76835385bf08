-- Whether lockext's objects here are its own: its schema is still named lockext and owned
-- by the extension's owner. The reaper runs as a superuser and names lockext.* objects; in
-- a schema another role owns (made before CREATE EXTENSION by an older version, which did
-- not refuse it), that role could replace them with its own and run code as superuser.
-- No parameters.
SELECT n.nspname = 'lockext' AND n.nspowner = e.extowner AS own
  FROM pg_catalog.pg_extension AS e
  JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace
 WHERE e.extname = 'lockext'
