-- Heartbeat, the renewal committed asynchronously (see renew_lockext.sql).
\set id random(1, :keys)
\set tok :id + :base
SELECT set_config('synchronous_commit', 'off', true), lockext.lock_renew('hb:' || :id, 'hb', '1 hour', :tok);
