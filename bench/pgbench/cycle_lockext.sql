-- lockext cycle: acquire a random free lock, release it, with default settings: the grant
-- commits durably (lockext forces it); whether the release waits for its flush is
-- lockext's own choice (the report's fsyncs column shows it).
\set id random(1, :keys)
SELECT coalesce(fence_token, 0) AS tok FROM lockext.lock_acquire('lock:' || :id, 'bench:' || :client_id, '30 seconds') \gset
\if :tok > 0
SELECT lockext.lock_release('lock:' || :id, 'bench:' || :client_id, :tok);
\endif
