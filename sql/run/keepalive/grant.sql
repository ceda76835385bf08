-- lock_keepalive_grant: a new keep-alive, held by the calling role. Its id is a token
-- (token::mint), so no keep-alive id is ever handed out twice, after a crash, a restore
-- or a reinstall: a client holding a stale id can never renew or attach to another's.
-- $1 keepalive (its id), $2 role (the calling role), $3 ttl, $4 now (the call's clock)
INSERT INTO lockext.keepalives
       (keepalive, holder_role, ttl, created_at, expires_at, renewals, taker_pid,
        application_name, client_addr)
VALUES ($1, $2, $3, $4, $4 + $3, 0, pg_backend_pid(), current_setting('application_name'),
        inet_client_addr())
RETURNING keepalive, expires_at
