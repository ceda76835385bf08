-- An older SQL version's fence: the high-water mark alone (older SQL's resources have no
-- lock to be bound to). Equal tokens are accepted: the same grant writing again.
-- $1 resource_id, $2 fence_token, $3 data, $4 replace (true: replace the stored document)
INSERT INTO lockext.resources AS r (resource_id, fence_token, data, updated_at)
VALUES ($1, $2, $3, clock_timestamp())
    ON CONFLICT (resource_id) DO UPDATE
   SET fence_token = EXCLUDED.fence_token,
       data = CASE WHEN $4 THEN EXCLUDED.data ELSE r.data END,
       updated_at = EXCLUDED.updated_at
 WHERE r.fence_token <= EXCLUDED.fence_token
RETURNING true
