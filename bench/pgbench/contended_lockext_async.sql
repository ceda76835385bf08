-- Contended, release committed asynchronously (see contended_lockext.sql).
SELECT coalesce(fence_token, 0) AS tok FROM lockext.lock_acquire('hot', 'bench:' || :client_id, '30 seconds') \gset
\if :tok > 0
\startpipeline
SELECT set_config('synchronous_commit', 'off', true), lockext.lock_release('hot', 'bench:' || :client_id, :tok);
SELECT nextval(('bench.handoffs_' || :client_id)::regclass);
\endpipeline
\endif
