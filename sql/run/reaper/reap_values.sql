-- One batch of a sweep round of the reaper (src/reaper.rs): deletes values whose grant is
-- gone and that the statement that ended the grant left behind (a value row its setter
-- held locked at that moment, one stored by a setter whose lease ended before it
-- committed, or an older version's, which deleted values only here), at most $1 of them,
-- and returns each (lock_id). Not run by every round: it reads every stored value, so a
-- round's cost would grow with the values kept, not with what it deletes (every statement
-- that deletes or replaces a lease deletes its value too). A grant is there while a lease
-- row has its lock id and token, live or not: a lease in its lock-delay keeps its value,
-- since a renewal that read the clock before the expiry may still renew it (its holder,
-- still the leader, must not find its value gone), and so does a lease that a renewal has
-- locked right now.
-- SKIP LOCKED: a setter storing a value at this moment is left alone.
-- Bounded whatever the statistics say: the values are chosen once (a MATERIALIZED CTE,
-- which no plan runs again for each row of another input), and the DELETE finds them by
-- their lock ids, an index condition.
-- $1 limit (values at most)
WITH orphan AS MATERIALIZED (
        SELECT lock_id, fence_token
          FROM lockext.lease_values AS o
         WHERE NOT EXISTS (SELECT FROM lockext.locks AS l
                            WHERE l.lock_id = o.lock_id AND l.fence_token = o.fence_token)
           AND NOT EXISTS (SELECT FROM lockext.shared_leases AS s
                            WHERE s.lock_id = o.lock_id AND s.fence_token = o.fence_token)
         LIMIT $1
           FOR UPDATE SKIP LOCKED)
DELETE FROM lockext.lease_values AS v
 USING orphan
 WHERE v.lock_id = ANY (ARRAY(SELECT lock_id FROM orphan))
   AND v.lock_id = orphan.lock_id AND v.fence_token = orphan.fence_token
RETURNING v.lock_id
