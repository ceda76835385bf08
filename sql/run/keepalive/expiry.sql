-- lockext.lease_expiry's read: a keep-alive's expiry (no row: it is gone). The one
-- statement here that also runs outside lockext's pinned search_path (lease_expiry is
-- PUBLIC's: lock_check and the fence reads run as their caller), so even its operator is
-- qualified: its kept plan must mean the same whoever prepared it first.
-- $1 keepalive
SELECT expires_at FROM lockext.keepalives WHERE keepalive OPERATOR(pg_catalog.=) $1
