-- Heartbeat, the article's renew() as written (search_path = article).
\set id random(1, :keys)
UPDATE distributed_locks
         SET expires_at = NOW() + (:ttl || ' milliseconds')::interval
         WHERE lock_id = 'hb:' || :id AND owner = 'hb' AND expires_at > NOW();
