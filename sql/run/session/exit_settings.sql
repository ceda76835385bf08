-- The exit runs with the session's settings: no caller's search_path may bend lockext's
-- statements, and a lease's end needs no wait for a flush (a lost one is reaped).
-- No lock_timeout: it would not work. PostgreSQL times a lock wait out by a cancel signal,
-- which a backend ignores once it is exiting, so an exit that waited on a lease row's
-- lock would wait for as long as another transaction kept the row (found by
-- tests/cluster/tests/session_bound.rs). end_mine.sql skips locked rows instead, and the
-- exit hook (session.rs) bounds its own retries.
-- No parameters.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
       pg_catalog.set_config('synchronous_commit', 'off', true)
