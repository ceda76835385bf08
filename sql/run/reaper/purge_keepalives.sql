-- The second step (see lock_ended_keepalives.sql): deletes the locked ended keep-alives
-- that no lease is attached to, and returns each.
-- $1 keepalives (the first step's array)
DELETE FROM lockext.keepalives AS k
 WHERE k.keepalive = ANY ($1) AND k.ended
   AND NOT EXISTS (SELECT FROM lockext.locks AS l WHERE l.keepalive = k.keepalive)
   AND NOT EXISTS (SELECT FROM lockext.shared_leases AS s WHERE s.keepalive = k.keepalive)
RETURNING k.keepalive
