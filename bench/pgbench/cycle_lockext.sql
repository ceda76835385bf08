-- lockext cycle: acquire a random free lock, release it. Both commit as they come:
-- the grant durably (lockext forces it), the release under the session's default (on).
\set id random(1, :keys)
SELECT coalesce(fence_token, 0) AS tok FROM lockext.lock_acquire('lock:' || :id, 'bench:' || :client_id, '30 seconds') \gset
\if :tok > 0
SELECT lockext.lock_release('lock:' || :id, 'bench:' || :client_id, :tok);
\endif
