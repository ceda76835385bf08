-- fenced_update(resource_id, fence_token, data) stores data for the resource when the
-- token is at least the highest accepted there, and returns false, changing nothing,
-- for a lower one. The first write creates the resource.

-- The article's scenario. A takes the lock and writes.
SELECT fence_token AS a FROM lockext.lock_acquire('ledger', 'A', '20 milliseconds') \gset
SELECT lockext.fenced_update('account:42', :a, '{"balance": 100, "by": "A"}') AS a_writes;
-- A is paused (GC, VM stall) past its lease. B takes the lock, with a higher token.
SELECT pg_sleep(0.05);
SELECT fence_token AS b FROM lockext.lock_acquire('ledger', 'B', '30 seconds') \gset
SELECT :b > :a AS b_token_is_higher;
SELECT lockext.fenced_update('account:42', :b, '{"balance": 80, "by": "B"}') AS b_writes;
-- A wakes up and carries on as if it still held the lock. Everything it tries fails.
SELECT lockext.fenced_update('account:42', :a, '{"balance": 0, "by": "A"}') AS a_late_write;
SELECT lockext.lock_renew('ledger', 'A', '30 seconds') AS a_renews;
SELECT lockext.lock_release('ledger', 'A') AS a_releases;
SELECT resource_id, fence_token = :b AS holds_b_token, data FROM lockext.resources;

-- The same grant may write as often as it likes (equal tokens are accepted).
SELECT lockext.fenced_update('account:42', :b, '{"balance": 75, "by": "B"}') AS b_writes_again;
SELECT data FROM lockext.resources WHERE resource_id = 'account:42';

-- Resources are independent: an old token is fine where nothing newer has written.
SELECT lockext.fenced_update('account:43', :a, '{"by": "A"}') AS other_resource;

-- A token that was never issued is refused: it would lock every real holder out.
\set VERBOSITY default
SELECT lockext.fenced_update('account:42', :b + 1000, '{"by": "forger"}');
SELECT resource_id, data->>'by' AS by FROM lockext.resources ORDER BY 1;
