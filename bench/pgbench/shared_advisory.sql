-- Shared session advisory lock on one key: in memory, no lease, no token. The read-lock
-- ceiling. No one takes the key exclusively, so a refusal stops pgbench (bench.refused).
SELECT pg_try_advisory_lock_shared(1)::int AS got \gset
\if :got = 0
SELECT bench.refused('pg_try_advisory_lock_shared(1)');
\endif
SELECT pg_advisory_unlock_shared(1);
