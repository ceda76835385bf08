-- A reader's look at the resource, keeping its row share-locked to the end of the
-- reader's transaction (a writer's fence then waits for it).
-- $1 resource_id
SELECT fence_token, lock_id FROM lockext.resources WHERE resource_id = $1 FOR SHARE
