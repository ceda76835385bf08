-- Fenced writes, the article's writeWithFenceCheck() UPDATE, with one change: ">=" for
-- its ">", or the holder of a grant could write only once (search_path = article).
\set id random(1, :keys)
UPDATE protected_resources
     SET data = '{"n": 1}', last_fence_token = :tok
     WHERE resource_id = 'res:' || :id
       AND (:tok >= last_fence_token OR last_fence_token IS NULL)
     RETURNING resource_id;
