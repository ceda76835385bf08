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
-- Each value's lease is looked for by its key, one index probe a value (OFFSET 0 keeps
-- each NOT EXISTS a subquery run for each value: as an anti-join, on statistics that say
-- the lease table is empty, the plan read the whole lease index for every value, 2 s for
-- 6 000 values and the square of them beyond).
-- Bounded whatever the statistics say: the values are chosen once (a MATERIALIZED CTE,
-- which no plan runs again for each row of another input), and the DELETE finds them by
-- their row addresses (a TID scan; a join on their keys compared each value with every
-- other, a million comparisons for a batch of 1 000). A value changed after the
-- statement's snapshot (its newest version, locked here, is not the one the DELETE sees)
-- is left to the next sweep.
-- $1 limit (values at most)
WITH orphan AS MATERIALIZED (
        SELECT ctid
          FROM lockext.lease_values AS o
         WHERE NOT EXISTS (SELECT FROM lockext.locks AS l
                            WHERE l.lock_id = o.lock_id AND l.fence_token = o.fence_token OFFSET 0)
           AND NOT EXISTS (SELECT FROM lockext.shared_leases AS s
                            WHERE s.lock_id = o.lock_id AND s.fence_token = o.fence_token OFFSET 0)
         LIMIT $1
           FOR UPDATE SKIP LOCKED)
DELETE FROM lockext.lease_values AS v
 WHERE v.ctid = ANY (ARRAY(SELECT ctid FROM orphan))
RETURNING v.lock_id
