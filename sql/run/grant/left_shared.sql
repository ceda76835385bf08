-- After clear_dead_shared.sql, under the newest snapshot (which shows this transaction's
-- deletions): whether a shared lease or permit of the lock id is still there. The look
-- found them all dead (a live one refuses an exclusive grant before this), so
-- clear_dead_shared.sql should have deleted them all; see left_exclusive.sql.
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 ttl, $5 now (the call's clock),
-- $6 token (the new grant's), $7 lock_delay, $8 session_start (NULL: not session-bound),
-- $9 permits, $10 slot, $11 keepalive (NULL: none) (grant::Params, ACQUIRE_PARAMS: every
-- acquire statement takes all eleven)
SELECT EXISTS (SELECT FROM lockext.shared_leases WHERE lock_id = $1) AS left_over
