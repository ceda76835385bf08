-- lock_acquire(lock_id, owner, ttl) returns a lockext.lock_grant, or NULL when a live
-- lease holds the lock. Tokens come from the cluster's ledger: a fresh cluster starts at 1.

-- A free lock is granted. Owners should say who holds the lock: host, pid, trace id.
SELECT lock_id, owner, fence_token, expires_at - acquired_at AS lease
  FROM lockext.lock_acquire('orders', 'worker-1@host-a:4242', '30 seconds');

-- A token is an era over a counter (see docs/tokens.md): layout 2 (every token below
-- 2^53), era 0 (a fresh cluster on its first timeline), and the counter's first value.
SELECT layout, era, counter
  FROM lockext.locks, lockext.token_parts(fence_token) WHERE lock_id = 'orders';

-- Anyone else is refused while the lease is live. A refusal writes nothing: it does not
-- even take a transaction id (no commit record, no wraparound pressure under contention).
BEGIN;
SELECT lockext.lock_acquire('orders', 'worker-2@host-b:77', '30 seconds') IS NULL AS refused;
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_transaction_id;
COMMIT;

-- The same owner again (say, a retry after a lost reply) gets the same grant back:
-- same token, expiry moved to now + the new ttl.
SELECT fence_token, expires_at - acquired_at > interval '59 seconds' AS extended
  FROM lockext.lock_acquire('orders', 'worker-1@host-a:4242', '1 minute');

-- Every grant gets the next token, whatever the lock.
SELECT fence_token FROM lockext.lock_acquire('invoices', 'worker-2@host-b:77', '30 seconds');

-- An expired lease is free: it is taken over in place, with a new, higher token.
SELECT fence_token FROM lockext.lock_acquire('reports', 'worker-1', '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT owner, fence_token FROM lockext.lock_acquire('reports', 'worker-3', '30 seconds');

-- Its old holder coming back after expiry is a new grant too: a new token.
SELECT fence_token FROM lockext.lock_acquire('audit', 'worker-1', '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT fence_token FROM lockext.lock_acquire('audit', 'worker-1', '30 seconds');

SELECT lock_id, owner, fence_token FROM lockext.locks ORDER BY lock_id;

-- Expiry is judged by the server's clock as it runs (clock_timestamp()), not by the
-- transaction's start (now()): inside one long transaction a lease still ends on time.
BEGIN;
SELECT fence_token FROM lockext.lock_acquire('batch', 'worker-1', '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT owner, fence_token FROM lockext.lock_acquire('batch', 'worker-2', '30 seconds');
COMMIT;

-- A grant made in a transaction that rolls back never existed (its token is not reused).
BEGIN;
SELECT fence_token FROM lockext.lock_acquire('ghost', 'worker-1', '30 seconds');
ROLLBACK;
SELECT count(*) AS ghost_leases FROM lockext.locks WHERE lock_id = 'ghost';
SELECT fence_token FROM lockext.lock_acquire('ghost', 'worker-2', '30 seconds');

-- With lockext.durability = grant (the default) an acknowledged grant survives a crash,
-- so the granting transaction commits synchronously even when the session asks for
-- asynchronous commits. lockext decides at pre-commit, so the setting shows what the
-- session asked for until then (tests/cluster/tests/tokens.rs crashes the server to
-- check that the grant is on disk).
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT fence_token FROM lockext.lock_acquire('durable', 'worker-1', '30 seconds');
SHOW synchronous_commit;
COMMIT;
