-- Contended: every client on the one lock "hot". A transaction is one attempt; a granted
-- attempt releases at once. The hand-off counter of this client (an UNLOGGED sequence:
-- no WAL, no transaction id) is pipelined with the release: same round trip, same commit.
SELECT coalesce(fence_token, 0) AS tok FROM lockext.lock_acquire('hot', 'bench:' || :client_id, '30 seconds') \gset
\if :tok > 0
\startpipeline
SELECT lockext.lock_release('hot', 'bench:' || :client_id, :tok);
SELECT nextval(('bench.handoffs_' || :client_id)::regclass);
\endpipeline
\endif
