-- Whether the keep-alive is ended for good (committed: under the statement's snapshot) and
-- had expired by the grant's clock: then end.sql has nothing left to do.
-- $1 keepalive, $2 now (the grant's clock)
SELECT EXISTS (SELECT FROM lockext.keepalives
                WHERE keepalive = $1 AND ended AND expires_at <= $2) AS ended
