-- Session advisory locks: in memory, no lease, no token. The ceiling.
\set id random(1, :keys)
SELECT pg_try_advisory_lock(:id)::int AS got \gset
\if :got
SELECT pg_advisory_unlock(:id);
\endif
