-- lockext cycle, release committed asynchronously: the release statement sets
-- synchronous_commit = off for its own (implicit) transaction only.
\set id random(1, :keys)
SELECT coalesce(fence_token, 0) AS tok FROM lockext.lock_acquire('lock:' || :id, 'bench:' || :client_id, '30 seconds') \gset
\if :tok > 0
SELECT set_config('synchronous_commit', 'off', true), lockext.lock_release('lock:' || :id, 'bench:' || :client_id, :tok);
\endif
