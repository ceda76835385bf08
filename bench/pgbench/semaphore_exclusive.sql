-- The semaphore workload's yardstick of a grant that no one waits for: an exclusive lock on
-- a random one of :keys ids (as cycle_lockext.sql), released at once with this client's
-- grant counter pipelined with the release, as in semaphore_lockext.sql.
\set id random(1, :keys)
SELECT coalesce(fence_token, 0) AS tok FROM lockext.lock_acquire('lock:' || :id, 'bench:' || :client_id, '30 seconds') \gset
\if :tok > 0
\startpipeline
SELECT lockext.lock_release('lock:' || :id, 'bench:' || :client_id, :tok);
SELECT nextval(('bench.handoffs_' || :client_id)::regclass);
\endpipeline
\endif
