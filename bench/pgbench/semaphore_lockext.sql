-- Semaphore: every client on the one semaphore "sem:<permits>" (permits => :permits), each
-- attempt waiting in lockext's queue for a permit (wait => 5 s) instead of retrying. A
-- transaction is one attempt: its latency is from joining the queue to holding a permit,
-- plus the release. A granted attempt releases at once, with this client's grant counter
-- pipelined with the release, as in contended_lockext.sql.
SELECT coalesce(fence_token, 0) AS tok
  FROM lockext.lock_acquire('sem:' || :permits, 'bench:' || :client_id, '30 seconds',
                            wait => '5 seconds', permits => :permits) \gset
\if :tok > 0
\startpipeline
SELECT lockext.lock_release('sem:' || :permits, 'bench:' || :client_id, :tok);
SELECT nextval(('bench.handoffs_' || :client_id)::regclass);
\endpipeline
\endif
