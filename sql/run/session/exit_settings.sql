-- The exit runs with the session's settings: no caller's search_path may bend lockext's
-- statements, and a lease's end needs no wait for a flush (a lost one is reaped).
-- No parameters.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
       pg_catalog.set_config('synchronous_commit', 'off', true)
