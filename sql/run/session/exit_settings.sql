-- The exit runs with the session's settings: no caller's search_path may bend lockext's
-- statements, and a lease's end needs no wait for a flush (a lost one is reaped). It waits
-- for a lease row that a renewal or release in flight holds (end_mine.sql) one second at
-- most: a transaction left open on the row must not hold the backend's exit (and a
-- shutdown) for long; past it the reaper ends the lease once the row is free.
-- No parameters.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
       pg_catalog.set_config('synchronous_commit', 'off', true),
       pg_catalog.set_config('lock_timeout', '1s', true)
