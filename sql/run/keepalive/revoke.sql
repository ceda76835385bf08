-- lock_keepalive_revoke, first statement: ends the keep-alive (never renewed again, its
-- expiry moved back to now if it was later). One row, whether it was live; no row when the
-- caller holds no such keep-alive. A lockext_admin member may revoke another role's.
-- FOR UPDATE, waited for: a grant attaching a lease holds the row FOR KEY SHARE to the end
-- of its transaction (attach.sql), which only FOR UPDATE conflicts with. So the revocation
-- waits for every grant that attached a lease before it, and each such lease is committed
-- before the keep-alive ends (revoke_leases.sql, a statement of its own with a newer
-- snapshot, then deletes it); a grant that comes later finds the row locked or ended and
-- is refused. Without the wait, a grant could attach a lease to a keep-alive revoked in
-- the meantime, and answer "granted" for a lease that was dead when it committed. A
-- renewal's FOR NO KEY UPDATE is waited for too, for as long as its short transaction.
-- $1 keepalive, $2 role (the calling role), $3 now (the call's clock)
UPDATE lockext.keepalives AS k
   SET ended = true, expires_at = least(k.expires_at, $3)
  FROM (SELECT keepalive, expires_at > $3 AS live
          FROM lockext.keepalives
         WHERE keepalive = $1
           AND (holder_role = $2 OR pg_has_role($2, 'lockext_admin', 'USAGE'))
           FOR UPDATE) AS c
 WHERE k.keepalive = c.keepalive
RETURNING k.keepalive, c.live
