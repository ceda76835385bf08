-- The lock a resource is bound to, for the detail of the error that refuses a token that
-- is not that lock's live grant (fence_guard with a resource id; lockext.fence, in SQL,
-- reads it itself).
-- $1 resource_id
SELECT lock_id FROM lockext.resources WHERE resource_id = $1
