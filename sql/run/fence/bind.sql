-- Binds (or, lock_id NULL, unbinds) a resource. A resource bound to another lock than
-- before starts again from mark 0: a mark left by any other lock's token (any member may
-- have raised it before the binding) would refuse the lock's holder.
-- $1 resource_id, $2 lock_id (NULL: unbind)
INSERT INTO lockext.resources AS r (resource_id, fence_token, data, updated_at, lock_id)
VALUES ($1, 0, NULL, clock_timestamp(), $2)
    ON CONFLICT (resource_id) DO UPDATE
   SET lock_id = EXCLUDED.lock_id,
       fence_token = CASE WHEN EXCLUDED.lock_id IS NOT NULL
                           AND r.lock_id IS DISTINCT FROM EXCLUDED.lock_id
                          THEN 0 ELSE r.fence_token END
