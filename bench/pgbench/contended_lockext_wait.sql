-- Contended, waiting: every client on the one lock "hot", each attempt waiting in lockext's
-- FIFO queue (wait => 10 s) instead of retrying. A transaction is one attempt: its latency
-- is the hand-off latency, from joining the queue to holding the lock. A granted attempt
-- releases at once, with its hand-off counter pipelined as in contended_lockext.sql.
SELECT coalesce(fence_token, 0) AS tok
  FROM lockext.lock_acquire('hot', 'bench:' || :client_id, '30 seconds', wait => '10 seconds') \gset
\if :tok > 0
\startpipeline
SELECT lockext.lock_release('hot', 'bench:' || :client_id, :tok);
SELECT nextval(('bench.handoffs_' || :client_id)::regclass);
\endpipeline
\endif
