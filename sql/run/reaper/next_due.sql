-- When this database next needs a round (run by a round once it has reaped): the earliest
-- time anything here becomes reapable by the round's statements, or infinity for never.
-- Each part reads an index's first entry or a small table: exclusive and shared leases
-- and permits by the index on when their lock is free (an attached lease's row says
-- infinity there), live keep-alives by their expiry (a row per worker), the leases of
-- ended keep-alives by their keep-alive's expiry plus their lock-delay; ended keep-alives
-- without leases are due now. Values are not read: a value goes with its lease, in the
-- statement that deletes or replaces the lease, and the few left behind (a setter's row
-- locked at that moment, an older version's) wait for the sweep. Session-bound leases
-- whose session ended are not here: the session's exit publishes them when it could not
-- end them, and a crash restarts the server (and the reaper, whose first rounds run
-- anyway).
-- $1 now (the round's clock)
SELECT least(
         (SELECT min(lockext.free_at(expires_at, lock_delay)) FROM lockext.locks),
         (SELECT min(lockext.free_at(expires_at, lock_delay)) FROM lockext.shared_leases),
         (SELECT min(expires_at) FROM lockext.keepalives WHERE NOT ended),
         (SELECT min(lockext.free_at(k.expires_at, l.lock_delay))
            FROM lockext.keepalives AS k
            JOIN lockext.locks AS l ON l.keepalive = k.keepalive
           WHERE k.ended),
         (SELECT min(lockext.free_at(k.expires_at, l.lock_delay))
            FROM lockext.keepalives AS k
            JOIN lockext.shared_leases AS l ON l.keepalive = k.keepalive
           WHERE k.ended),
         (SELECT $1 FROM lockext.keepalives AS k
           WHERE k.ended
             AND NOT EXISTS (SELECT FROM lockext.locks AS l WHERE l.keepalive = k.keepalive)
             AND NOT EXISTS (SELECT FROM lockext.shared_leases AS s
                              WHERE s.keepalive = k.keepalive)
           LIMIT 1),
         'infinity'::timestamptz) AS due
