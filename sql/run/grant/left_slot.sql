-- After clear_dead_slot.sql, under the newest snapshot (which shows this transaction's
-- deletions): whether a permit of someone else's is still in slot $10. The taker found the
-- slot free of live permits (shared/slot_taken.sql), so clear_dead_slot.sql should have
-- deleted every permit in it; see left_exclusive.sql.
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 ttl, $5 now (the call's clock),
-- $6 token (the new grant's), $7 lock_delay, $8 session_start (NULL: not session-bound),
-- $9 permits, $10 slot, $11 keepalive (NULL: none) (grant::Params, ACQUIRE_PARAMS: every
-- acquire statement takes all eleven)
SELECT EXISTS (SELECT FROM lockext.shared_leases
                WHERE lock_id = $1 AND slot = $10 AND NOT (owner = $2 AND holder_role = $3))
       AS left_over
