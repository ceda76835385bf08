-- Contended, session advisory lock on one key.
SELECT pg_try_advisory_lock(1)::int AS got \gset
\if :got
\startpipeline
SELECT pg_advisory_unlock(1);
SELECT nextval(('bench.handoffs_' || :client_id)::regclass);
\endpipeline
\endif
