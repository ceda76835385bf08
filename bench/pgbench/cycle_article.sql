-- The article's acquire (BEGIN; DELETE expired; INSERT ... ON CONFLICT DO NOTHING; COMMIT)
-- and release (DELETE), statement for statement; :ttl is its ttlMs. Run with
-- search_path = article. Like its withLock(), it releases only what it acquired.
\set id random(1, :keys)
\set fence_token 0
BEGIN;
DELETE FROM distributed_locks
           WHERE lock_id = 'lock:' || :id AND expires_at < NOW();
INSERT INTO distributed_locks
             (lock_id, fence_token, owner, expires_at)
           VALUES
             ('lock:' || :id, nextval('distributed_locks_fence_seq'), 'bench:' || :client_id, NOW() + (:ttl || ' milliseconds')::interval)
           ON CONFLICT (lock_id) DO NOTHING
           RETURNING lock_id, fence_token, owner, expires_at \aset
COMMIT;
\if :fence_token > 0
DELETE FROM distributed_locks
         WHERE lock_id = 'lock:' || :id AND owner = 'bench:' || :client_id;
\endif
