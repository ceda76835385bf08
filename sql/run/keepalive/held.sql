-- Is the keep-alive live and the caller's (or is the caller a lockext_admin member)? Run
-- under the newest snapshot, when a renewal found its row locked.
-- $1 keepalive, $2 role (the calling role), $3 now (the call's clock)
SELECT EXISTS (SELECT FROM lockext.keepalives
                WHERE keepalive = $1 AND NOT ended AND expires_at > $3
                  AND (holder_role = $2 OR pg_has_role($2, 'lockext_admin', 'USAGE'))) AS held
