-- The first of two steps that end session-bound leases whose session has ended without
-- releasing them (the backend crashed, or its exit could not): locks those that look dead,
-- at most $1 of each table, and returns them as arrays of lock ids and owners.
-- Whether a session lives is read from the backend table, which a transaction reads once
-- and keeps: judged with that copy, a row that a new session of the same owner re-acquired
-- since (FOR UPDATE then sees its new version) would look dead, and be deleted while its
-- session lives. So this step only locks the rows that look dead, and the second
-- (end_locked_sessions.sql), with the copy read again after the locks are held, deletes
-- those of them that still look dead: no session can take over a locked row in between.
-- The backend table is read once per statement, as one anti-join (not one
-- pg_stat_get_activity call per lease).
-- $1 limit (leases at most, per table)
WITH x AS (SELECT lock_id, owner
             FROM lockext.locks AS s
            WHERE s.session_start IS NOT NULL
              AND NOT EXISTS (SELECT FROM pg_catalog.pg_stat_get_activity(NULL) AS a
                               WHERE a.pid = s.taker_pid
                                 AND a.backend_start = s.session_start)
            LIMIT $1 FOR UPDATE SKIP LOCKED),
     sh AS (SELECT lock_id, owner
              FROM lockext.shared_leases AS s
             WHERE s.session_start IS NOT NULL
               AND NOT EXISTS (SELECT FROM pg_catalog.pg_stat_get_activity(NULL) AS a
                                WHERE a.pid = s.taker_pid
                                  AND a.backend_start = s.session_start)
             LIMIT $1 FOR UPDATE SKIP LOCKED)
SELECT (SELECT array_agg(lock_id) FROM x) AS lock_ids, (SELECT array_agg(owner) FROM x) AS owners,
       (SELECT array_agg(lock_id) FROM sh) AS shared_lock_ids,
       (SELECT array_agg(owner) FROM sh) AS shared_owners
