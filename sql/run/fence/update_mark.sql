-- A fenced write to a resource that has its row (every write but its first): the check and
-- the write of advance.sql as a plain UPDATE, which writes one WAL record fewer (an upsert
-- locks the row it conflicts with, a record of its own, before updating it). What
-- advance.sql promises holds the same way: a writer that waited for the row's lock checks
-- this WHERE again on the row the writer before it left (its mark, and its binding), and
-- the grant under the newest snapshot (lockext.exclusive_grant_live), as
-- advance_own_lock.sql does on a Citus cluster. Nothing changed (no row yet, or the check
-- says no): advance.sql runs next, which stores the first write or refuses this one.
-- $1 resource_id, $2 fence_token, $3 data,
-- $4 replace (true: the write replaces the stored document, fenced_update; false: only the
-- token, fence), $5 role (the calling role)
UPDATE lockext.resources AS r
   SET fence_token = $2,
       data = CASE WHEN $4 THEN $3 ELSE r.data END,
       updated_at = clock_timestamp()
 WHERE r.resource_id = $1 AND r.fence_token <= $2
   AND CASE WHEN r.lock_id IS NULL THEN true
            ELSE lockext.exclusive_grant_live(r.lock_id, $2, $5) END
RETURNING true
