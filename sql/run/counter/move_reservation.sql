-- Moves the counter's reservation on disk: the sequence to that value.
-- $1 the sequence's oid (lockext.fence_token_seq), $2 the value
SELECT pg_catalog.setval($1::pg_catalog.regclass, $2)
