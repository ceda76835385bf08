-- One batch of the reaper, last step for keep-alives, in two statements: this one locks
-- ended keep-alives, at most $1 (returned as an array); purge_keepalives.sql then deletes
-- those of them that no lease is attached to any more, under a snapshot taken once the
-- locks are held. A lease being attached holds its keep-alive FOR KEY SHARE to its
-- transaction's end (keepalive/attach.sql): SKIP LOCKED passes over that keep-alive, and
-- one attached and committed before the lock is seen by the second statement's snapshot,
-- which one statement's own snapshot, taken before its lock, might not.
-- $1 limit (keep-alives at most)
SELECT array_agg(keepalive) AS keepalives
  FROM (SELECT keepalive
          FROM lockext.keepalives
         WHERE ended
         LIMIT $1
           FOR UPDATE SKIP LOCKED) AS c
