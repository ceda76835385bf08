-- An event for LISTENers, sent at commit:
-- NOTIFY lockext '{"event": ..., "lock_id": ..., "fence_token": ..., ...}'.
-- $1 event, $2 lock_id, $3 fence_token, $4 previous_fence_token
SELECT pg_notify('lockext', json_build_object('event', $1, 'lock_id', $2, 'fence_token', $3,
                                              'previous_fence_token', $4)::text)
