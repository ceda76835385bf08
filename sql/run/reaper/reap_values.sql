-- One batch of the reaper: deletes values whose grant is no longer live (released,
-- expired, taken over; nobody shows them), at most $1 of them, and returns each (lock_id).
-- Reads every stored value: there is one per grant that set one (leaders, mostly), few
-- next to the leases. SKIP LOCKED: a setter storing a value at this moment is left alone.
-- Bounded whatever the statistics say: the victims are chosen once (a MATERIALIZED CTE,
-- which no plan runs again for each row of another input: a nested loop that re-ran a
-- LIMIT ... FOR UPDATE subquery for every lease kept a round busy for minutes on a table
-- whose statistics said it was empty), and the DELETE finds its rows by their key in the
-- victims' array, an index condition: no plan reads the whole table for one batch.
-- $1 limit (values at most), $2 now (the batch's clock)
WITH orphan AS MATERIALIZED (
        SELECT lock_id, fence_token
          FROM lockext.lease_values AS o
         WHERE NOT EXISTS (SELECT FROM lockext.locks AS l
                            WHERE l.lock_id = o.lock_id AND l.fence_token = o.fence_token
                              AND lockext.lease_expiry(l.expires_at, l.keepalive) > $2)
           AND NOT EXISTS (SELECT FROM lockext.shared_leases AS s
                            WHERE s.lock_id = o.lock_id AND s.fence_token = o.fence_token
                              AND lockext.lease_expiry(s.expires_at, s.keepalive) > $2)
         LIMIT $1
           FOR UPDATE SKIP LOCKED)
DELETE FROM lockext.lease_values AS v
 USING orphan
 WHERE v.lock_id = ANY (ARRAY(SELECT lock_id FROM orphan))
   AND v.lock_id = orphan.lock_id AND v.fence_token = orphan.fence_token
RETURNING v.lock_id
