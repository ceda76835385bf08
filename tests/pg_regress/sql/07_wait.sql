-- Waiting for a lock: lock_acquire(lock_id, owner, ttl, wait => interval,
-- lock_delay => interval). (Waking on release, FIFO order, cancel and notifications need
-- several sessions: tests/cluster/tests/wait.rs.)
\set VERBOSITY default
\set SHOW_CONTEXT never

-- A wait that times out returns NULL, takes nothing, and waited its time.
SELECT owner FROM lockext.lock_acquire('printer', 'A', '1 minute');
SELECT clock_timestamp() AS t0 \gset
SELECT lockext.lock_acquire('printer', 'B', '1 minute', wait => '200 milliseconds') IS NULL AS timed_out;
SELECT clock_timestamp() - :'t0' >= interval '200 milliseconds' AS waited_the_whole_time;
SELECT owner FROM lockext.locks WHERE lock_id = 'printer';

-- A wait ends as soon as the lease runs out (here nobody releases: the lease expires).
SELECT owner FROM lockext.lock_acquire('copier', 'A', '300 milliseconds');
SELECT owner FROM lockext.lock_acquire('copier', 'B', '1 minute', wait => '5 seconds');

-- Lock-delay: after a lease EXPIRES (its holder presumably died), the lock stays
-- unavailable for the delay the holder asked for...
SELECT owner FROM lockext.lock_acquire('scanner', 'A', '100 milliseconds', lock_delay => '400 milliseconds');
SELECT pg_sleep(0.2);
SELECT lockext.lock_acquire('scanner', 'B', '1 minute') IS NULL AS refused_during_delay;
SELECT owner FROM lockext.lock_acquire('scanner', 'B', '1 minute', wait => '5 seconds');
-- ...while a clean release frees it at once.
SELECT owner FROM lockext.lock_acquire('fax', 'A', '1 minute', lock_delay => '1 hour');
SELECT lockext.lock_release('fax', 'A');
SELECT owner FROM lockext.lock_acquire('fax', 'B', '1 minute');
-- The default delay is the lockext.lock_delay setting (0).
SHOW lockext.lock_delay;

-- wait => 0 (the default) or NULL never waits.
SELECT lockext.lock_acquire('printer', 'C', '1 minute', wait => '0') IS NULL AS refused;
SELECT lockext.lock_acquire('printer', 'C', '1 minute', wait => NULL) IS NULL AS refused;

-- Bad input.
SELECT lockext.lock_acquire('printer', 'C', '1 minute', wait => '-1 second');
SELECT lockext.lock_acquire('printer', 'C', '1 minute', wait => '2 days');
SELECT lockext.lock_acquire('printer', 'C', '1 minute', lock_delay => '-1 second');
-- Waiting needs READ COMMITTED: a snapshot from the transaction's start never sees the release.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT lockext.lock_acquire('printer', 'C', '1 minute', wait => '1 second');
ROLLBACK;
