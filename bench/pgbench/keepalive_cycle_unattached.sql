-- Keep-alives (bench/keepalive.sh): the same cycle as keepalive_cycle_attached.sql with a ttl
-- of the lease's own instead of a keep-alive, for context.
\set id random(1, 1000000000)
SELECT coalesce(fence_token, 0) AS tok FROM lockext.lock_acquire('kc:' || :id, 'bench:' || :client_id, '1 hour') \gset
\if :tok > 0
SELECT lockext.lock_release('kc:' || :id, 'bench:' || :client_id, :tok);
\endif
