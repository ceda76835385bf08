-- Records $2, the token of a grant of lock id $1 just made, as its lock id's highest, in the
-- grant's own transaction (citus.rs): the next grant of the lock id, on this node or on the
-- one its shard moves to, starts above it.
-- $1 lock_id, $2 fence_token
INSERT INTO lockext.lock_tokens AS t (lock_id, high) VALUES ($1, $2)
    ON CONFLICT (lock_id) DO UPDATE SET high = greatest(t.high, excluded.high)
