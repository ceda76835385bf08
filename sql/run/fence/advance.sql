-- A fenced write: stores the token (and the document) when it is not older than the
-- resource's mark. Check and write are one statement: ON CONFLICT takes the resource's row
-- lock, so two writers of one resource run one after the other, and the second sees the
-- first's token. Equal tokens are accepted: that is the same grant writing again.
-- A resource bound to a lock also demands that the token be that lock's live exclusive
-- grant, by the server's clock: no other lock's token, however new, can move its mark, and
-- a holder whose lease has run out is refused at once, not only once its successor has
-- written. The grant must also be the writer's own (taken by the calling role): its token
-- is no secret (lockext.locks is readable by everyone), so a token alone proves nothing.
-- That check runs once the row is locked, under the newest snapshot
-- (lockext.exclusive_grant_live): the statement's own snapshot would still show a grant
-- released while the writer waited for the row, or since a REPEATABLE READ transaction
-- began. (CASE, not OR: an unbound resource must not pay for it.)
-- $1 resource_id, $2 fence_token, $3 data,
-- $4 replace (true: the write replaces the stored document, fenced_update; false: only the
-- token, fence), $5 role (the calling role)
INSERT INTO lockext.resources AS r (resource_id, fence_token, data, updated_at)
VALUES ($1, $2, $3, clock_timestamp())
    ON CONFLICT (resource_id) DO UPDATE
   SET fence_token = EXCLUDED.fence_token,
       data = CASE WHEN $4 THEN EXCLUDED.data ELSE r.data END,
       updated_at = EXCLUDED.updated_at
 WHERE r.fence_token <= EXCLUDED.fence_token
   AND CASE WHEN r.lock_id IS NULL THEN true
            ELSE lockext.exclusive_grant_live(r.lock_id, EXCLUDED.fence_token, $5) END
RETURNING true
