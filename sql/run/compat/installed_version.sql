-- The version of lockext's SQL objects in this database, if it has any.
-- No parameters.
SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'lockext'
