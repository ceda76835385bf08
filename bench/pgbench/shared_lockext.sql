-- Shared (read) lock cycle: every client takes the one id "shared-hot" with mode => 'shared'
-- (each reader a lease and a fence token of its own), then releases it with the token. No
-- one ever takes that id exclusively, so every attempt must be granted: a refusal stops
-- pgbench (bench.refused) instead of counting as a cycle. (No colon inside the id: pgbench
-- would take ':hot' in 'shared:hot' for a variable, even within quotes.)
SELECT coalesce(fence_token, 0) AS tok
  FROM lockext.lock_acquire('shared-hot', 'bench:' || :client_id, '30 seconds', mode => 'shared') \gset
\if :tok = 0
SELECT bench.refused('lockext shared grant on shared-hot');
\endif
SELECT lockext.lock_release('shared-hot', 'bench:' || :client_id, :tok);
