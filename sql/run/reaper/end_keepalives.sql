-- One batch of the reaper, first step for keep-alives: ends those that have expired, at
-- most $1 of them (never renewed again: src/keepalive.rs), so that the next steps may
-- delete their leases. It reads the table whole (a row per worker: no index on expiry,
-- so that renewals update in place). SKIP LOCKED, and FOR NO KEY UPDATE re-checks the
-- newest version: a keep-alive being renewed right now is left alone.
-- Bounded whatever the statistics say: the victims are chosen once (a MATERIALIZED CTE,
-- which no plan runs again for each row of another input: a nested loop that re-ran a
-- LIMIT ... FOR UPDATE subquery for every lease kept a round busy for minutes on a table
-- whose statistics said it was empty), and the UPDATE finds its rows by their key in the
-- victims' array, an index condition: no plan reads the whole table for one batch.
-- $1 limit (keep-alives at most), $2 now (the batch's clock)
WITH c AS MATERIALIZED (
        SELECT keepalive
          FROM lockext.keepalives
         WHERE NOT ended AND expires_at <= $2
         ORDER BY expires_at
         LIMIT $1
           FOR NO KEY UPDATE SKIP LOCKED)
UPDATE lockext.keepalives AS k
   SET ended = true
  FROM c
 WHERE k.keepalive = ANY (ARRAY(SELECT keepalive FROM c))
   AND k.keepalive = c.keepalive
RETURNING k.keepalive
