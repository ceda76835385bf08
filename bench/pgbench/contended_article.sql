-- Contended, the article's design (see cycle_article.sql). Search_path = article.
\set fence_token 0
BEGIN;
DELETE FROM distributed_locks
           WHERE lock_id = 'hot' AND expires_at < NOW();
INSERT INTO distributed_locks
             (lock_id, fence_token, owner, expires_at)
           VALUES
             ('hot', nextval('distributed_locks_fence_seq'), 'bench:' || :client_id, NOW() + (:ttl || ' milliseconds')::interval)
           ON CONFLICT (lock_id) DO NOTHING
           RETURNING lock_id, fence_token, owner, expires_at \aset
COMMIT;
\if :fence_token > 0
\startpipeline
DELETE FROM distributed_locks
         WHERE lock_id = 'hot' AND owner = 'bench:' || :client_id;
SELECT nextval(('bench.handoffs_' || :client_id)::regclass);
\endpipeline
\endif
