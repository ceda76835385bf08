-- How many of the exiting backend's session-bound lease rows are left after end_mine.sql
-- in the same transaction: rows it skipped because another transaction holds them (a
-- renewal or release in flight). The exit hook runs end_mine.sql again while any is left.
-- $1 pid (the exiting backend's), $2 started (its start)
SELECT (SELECT count(*) FROM lockext.locks
         WHERE session_start IS NOT NULL AND taker_pid = $1 AND session_start = $2)
     + (SELECT count(*) FROM lockext.shared_leases
         WHERE session_start IS NOT NULL AND taker_pid = $1 AND session_start = $2) AS rows_left
