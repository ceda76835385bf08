-- lock_keepalive_renew: extends the keep-alive, and with it every lease attached to it, in
-- one row (an attached lease's expiry is its keep-alive's: lockext.lease_expiry). Only a
-- live keep-alive that no grant has ended (ended: a grant or the reaper found it expired
-- and acted on it) is renewed. FOR NO KEY UPDATE SKIP LOCKED: a grant that is ending it
-- right now holds the row, and whichever locks the row first wins; attaching a lease
-- holds it FOR KEY SHARE, which this does not wait for. A lockext_admin member may renew
-- another role's keep-alive.
-- $1 keepalive, $2 role (the calling role), $3 now (the call's clock), $4 ttl (NULL: the
-- keep-alive's own)
UPDATE lockext.keepalives AS k
   SET expires_at = $3 + coalesce($4, k.ttl),
       renewals = k.renewals + 1
  FROM (SELECT keepalive
          FROM lockext.keepalives
         WHERE keepalive = $1 AND NOT ended AND expires_at > $3
           AND (holder_role = $2 OR pg_has_role($2, 'lockext_admin', 'USAGE'))
           FOR NO KEY UPDATE SKIP LOCKED) AS c
 WHERE k.keepalive = c.keepalive
RETURNING k.expires_at
