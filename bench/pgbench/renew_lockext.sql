-- Heartbeat: renew a random one of the live leases hb:1..hb:<keys>, all held by "hb";
-- lease hb:<i> was granted token <base> + <i>, and the renewal names it.
\set id random(1, :keys)
\set tok :id + :base
SELECT lockext.lock_renew('hb:' || :id, 'hb', '1 hour', :tok);
