-- The article's scenario, against a live lockext: a holder pauses past its lease, and
-- the fencing token keeps its late write out.
\set QUIET on
\pset footer off
\echo '1. A takes the lock "ledger" for 1 second and gets a fencing token.'
SELECT fence_token AS a_token FROM lockext.lock_acquire('ledger', 'worker-A', '1 second') \gset
SELECT :a_token AS "A's token";
SELECT lockext.fenced_update('account:42', :a_token, '{"balance": 100, "by": "A"}') AS "A writes";

\echo '2. A pauses (a GC pause, a VM stall) for 2 seconds; its lease runs out.'
SELECT pg_sleep(2);

\echo '3. B takes the lock: the expired lease is taken over, with a higher token.'
SELECT fence_token AS b_token FROM lockext.lock_acquire('ledger', 'worker-B', '30 seconds') \gset
SELECT :b_token AS "B's token";
SELECT lockext.fenced_update('account:42', :b_token, '{"balance": 80, "by": "B"}') AS "B writes";

\echo '4. A wakes up, still believing it holds the lock, and writes with its old token.'
SELECT lockext.fenced_update('account:42', :a_token, '{"balance": 0, "by": "A"}') AS "A's late write accepted?";
SELECT lockext.lock_renew('ledger', 'worker-A', '30 seconds') AS "A's renew (NULL = lost)";
SELECT lockext.lock_release('ledger', 'worker-A') AS "A's release";

\echo '5. The resource holds B''s write; B releases.'
SELECT resource_id, fence_token, data FROM lockext.resources WHERE resource_id = 'account:42';
SELECT lockext.lock_release('ledger', 'worker-B', :b_token) AS "B's release";
