-- One batch of the reaper, first step for keep-alives: ends those that have expired, at
-- most $1 of them (never renewed again: src/keepalive.rs), so that the next steps may
-- delete their leases. It reads the table whole (a row per worker: no index on expiry,
-- so that renewals update in place). SKIP LOCKED, and FOR NO KEY UPDATE re-checks the
-- newest version: a keep-alive being renewed right now is left alone.
-- $1 limit (keep-alives at most), $2 now (the batch's clock)
UPDATE lockext.keepalives AS k
   SET ended = true
  FROM (SELECT keepalive
          FROM lockext.keepalives
         WHERE NOT ended AND expires_at <= $2
         ORDER BY expires_at
         LIMIT $1
           FOR NO KEY UPDATE SKIP LOCKED) AS c
 WHERE k.keepalive = c.keepalive
RETURNING k.keepalive
