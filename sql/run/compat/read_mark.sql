-- A resource's high-water mark (older SQL versions).
-- $1 resource_id
SELECT fence_token FROM lockext.resources WHERE resource_id = $1
