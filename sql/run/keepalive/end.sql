-- lockext.end_keepalive: ends the keep-alive if it has expired by the grant's clock, so
-- that it is never renewed again: a grant that treats a lease as dead because its
-- keep-alive expired must first make that final, as a grant over a dead lease of its own
-- deletes or rewrites the lease's row. Whichever locks the keep-alive's row first wins:
-- a renewal in flight (this skips it, and the grant treats the lease as live), or this
-- (the renewal then finds it ended). One already ended is not locked again (ended.sql):
-- grants of two of its lock ids would otherwise refuse each other.
-- $1 keepalive, $2 now (the grant's clock)
UPDATE lockext.keepalives AS k
   SET ended = true
  FROM (SELECT keepalive
          FROM lockext.keepalives
         WHERE keepalive = $1 AND NOT ended AND expires_at <= $2
           FOR NO KEY UPDATE SKIP LOCKED) AS c
 WHERE k.keepalive = c.keepalive
RETURNING true AS ended
