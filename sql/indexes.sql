-- The reaper's index: leases by when their lock is free (expiry plus lock-delay), over a
-- Rust function (lockext.free_at), so created once that exists. A batch then reads only
-- the leases it may delete, not those live or in their lock-delay.
CREATE INDEX locks_free_at_idx ON lockext.locks (lockext.free_at(expires_at, lock_delay));
CREATE INDEX shared_leases_free_at_idx ON lockext.shared_leases (lockext.free_at(expires_at, lock_delay));
