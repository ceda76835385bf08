-- Without shared_preload_libraries, lockext still works, and much that operators count on
-- is silently missing: say so when the extension is created or updated. lockext.stats()
-- has rows exactly when the library was preloaded (its counters live in shared memory).
-- A WARNING, because PostgreSQL runs an extension's script with client_min_messages at
-- least WARNING: a NOTICE would never be seen.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM lockext.stats()) THEN
        RAISE WARNING 'lockext is not loaded through shared_preload_libraries'
            USING DETAIL = 'Without it, no reaper runs (expired leases stay in lockext''s tables until an acquire takes them over, and the session-bound leases of a backend that crashed last until their ttl), waiting acquires poll instead of queueing in order, and lockext.stats, lockext.waiters and lockext.reaper_status() stay empty. Leases, fence tokens, their durability and fencing work the same.',
                  HINT = 'Add lockext to shared_preload_libraries in postgresql.conf (shared_preload_libraries = ''lockext'', after any libraries already listed), then restart the server.';
    END IF;
END $$;
