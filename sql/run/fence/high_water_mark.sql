-- What made a refused fence stale: the mark, or for a bound resource whose mark is not
-- higher, the token itself (it is not the lock's live grant: lockext.fence says so).
-- $1 resource_id, $2 fence_token
SELECT greatest(fence_token, $2) AS mark FROM lockext.resources WHERE resource_id = $1
