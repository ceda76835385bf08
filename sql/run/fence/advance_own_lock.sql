-- A fenced write on a Citus cluster (docs/citus.md): the resource is bound to the lock of
-- its own id (checked before, citus::require_own_lock), whose rows are in the same shard, on
-- this node; the token must be that lock's live exclusive grant, taken by the calling role,
-- and not older than the mark. No row is inserted: an unbound resource is refused.
-- An UPDATE, not an upsert: a writer that waited for the row's lock checks the WHERE again
-- on the row the writer before it left (its mark, and its binding: an unbinding that
-- commits meanwhile refuses the write), and the grant under the newest snapshot
-- (lockext.exclusive_grant_live, as advance.sql).
-- $1 resource_id, $2 fence_token, $3 data,
-- $4 replace (true: the write replaces the stored document, fenced_update; false: only the
-- token), $5 role (the calling role)
UPDATE lockext.resources AS r
   SET fence_token = $2,
       data = CASE WHEN $4 THEN $3 ELSE r.data END,
       updated_at = clock_timestamp()
 WHERE r.resource_id = $1 AND r.lock_id = $1 AND r.fence_token <= $2
   AND lockext.exclusive_grant_live(r.lock_id, $2, $5)
RETURNING true
