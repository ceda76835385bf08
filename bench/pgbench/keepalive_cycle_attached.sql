-- Keep-alives (bench/keepalive.sh): acquire a random free lock attached to keep-alive :ka
-- (no ttl of its own), then release it. The acquire's own latency is pgbench -r's line.
\set id random(1, 1000000000)
SELECT coalesce(fence_token, 0) AS tok FROM lockext.lock_acquire('kc:' || :id, 'bench:' || :client_id, NULL, keepalive => :ka) \gset
\if :tok > 0
SELECT lockext.lock_release('kc:' || :id, 'bench:' || :client_id, :tok);
\endif
