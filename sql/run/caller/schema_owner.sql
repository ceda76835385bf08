-- The owner of a schema (lockext's), looked up once per backend and schema.
-- $1 schema (its oid)
SELECT nspowner FROM pg_catalog.pg_namespace WHERE oid = $1
