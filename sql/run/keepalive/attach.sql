-- Before a grant attached to a keep-alive: the keep-alive, if it is the calling role's,
-- live by the call's clock and not ended, and its expiry. FOR KEY SHARE, kept to the end
-- of the acquiring transaction: the keep-alive's row cannot be deleted (the reaper
-- deletes ended keep-alives once no lease is attached) while a lease is being attached
-- to it, and a renewal or the ending of an expired one (FOR NO KEY UPDATE) does not wait
-- for it. A revocation (FOR UPDATE, revoke.sql) does: it ends the keep-alive only once this
-- transaction has committed its lease, and then deletes that lease with the others.
-- $1 keepalive, $2 role (the calling role), $3 now (the call's clock)
SELECT expires_at
  FROM lockext.keepalives
 WHERE keepalive = $1 AND holder_role = $2 AND NOT ended AND expires_at > $3
   FOR KEY SHARE SKIP LOCKED
