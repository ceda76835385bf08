-- More kinds of lock: shared (read) and exclusive (write) leases on one lock id, counting
-- semaphores, sets of locks taken all or nothing, session-bound leases. (Concurrency,
-- waiting and session ends need several sessions: tests/cluster/tests/modes.rs.)
\set VERBOSITY default
\set SHOW_CONTEXT never

-- Shared leases: many readers at once, each with a fence token of its own.
SELECT lock_id, owner FROM lockext.lock_acquire('report', 'reader-1', '1 minute', mode => 'shared');
SELECT lock_id, owner FROM lockext.lock_acquire('report', 'reader-2', '1 minute', mode => 'shared');
SELECT count(DISTINCT fence_token) AS tokens, count(*) AS readers
  FROM lockext.shared_leases WHERE lock_id = 'report';
-- A writer is refused while readers hold it, and the readers are listed as holders.
SELECT lockext.lock_acquire('report', 'writer', '1 minute') IS NULL AS writer_refused;
SELECT lock_id, mode, owner, permits, session_bound FROM lockext.holders
 WHERE lock_id = 'report' ORDER BY owner;
-- Renew and release work on shared leases as on any other.
SELECT lockext.lock_renew('report', 'reader-1', '2 minutes') IS NOT NULL AS renewed;
SELECT lockext.lock_release('report', 'reader-1') AS released;
SELECT lockext.lock_release('report', 'reader-2') AS released;
-- With the readers gone the writer gets it; its token is newer than every reader's.
SELECT lockext.lock_acquire('report', 'writer', '1 minute') IS NOT NULL AS writer_granted;
SELECT lockext.lock_acquire('report', 'reader-3', '1 minute', mode => 'shared') IS NULL AS reader_refused;
-- No upgrade in place: an owner's own exclusive lease also keeps its shared acquire out.
SELECT lockext.lock_acquire('report', 'writer', '1 minute', mode => 'shared') IS NULL AS refused;
SELECT lockext.lock_release('report', 'writer');

-- The resource's side: a writer's token fences out every earlier reader and writer; readers
-- never fence each other out (fence_read and fenced_read do not move the mark).
SELECT fence_token AS r1 FROM lockext.lock_acquire('journal', 'r1', '1 minute', mode => 'shared') \gset
SELECT fence_token AS r2 FROM lockext.lock_acquire('journal', 'r2', '1 minute', mode => 'shared') \gset
SELECT lockext.fenced_read('journal', :r2) IS NULL AS nothing_written_yet;
SELECT lockext.fenced_read('journal', :r1) IS NULL AS older_reader_still_reads;
SELECT lockext.lock_release_all(ARRAY['journal'], 'r2') AS released;
-- r1 pauses; its lease runs out on the server's clock (here: an operator, a superuser,
-- ends it), and a writer comes.
SELECT lockext.lock_release('journal', 'r1');
SELECT fence_token AS w FROM lockext.lock_acquire('journal', 'w', '1 minute') \gset
SELECT lockext.fenced_update('journal', :w, '{"balance": 10}');
SELECT lockext.lock_release('journal', 'w');
-- The paused reader wakes up: refused with 55L01 (the message names tokens, which vary).
\set VERBOSITY sqlstate
SELECT lockext.fenced_read('journal', :r1);
SELECT lockext.fence_read('journal', :r1);
\set VERBOSITY default
-- A reader that came after the writer reads.
SELECT fence_token AS r3 FROM lockext.lock_acquire('journal', 'r3', '1 minute', mode => 'shared') \gset
SELECT lockext.fenced_read('journal', :r3) AS data;
SELECT lockext.fence_read('journal', :r3);
SELECT fence_token = :w AS mark_unmoved_by_readers FROM lockext.resources WHERE resource_id = 'journal';
SELECT lockext.fence_read(NULL, :r3);
SELECT lockext.fence_read('journal', 0);

-- Counting semaphores: permits => n; each grant is one permit with its own token.
SELECT owner FROM lockext.lock_acquire('pool', 'c1', '1 minute', permits => 2);
SELECT owner FROM lockext.lock_acquire('pool', 'c2', '1 minute', permits => 2);
SELECT lockext.lock_acquire('pool', 'c3', '1 minute', permits => 2) IS NULL AS no_third_permit;
-- The same owner gets its same permit back (one permit per owner), extended.
SELECT a.fence_token = b.fence_token AS same_grant
  FROM lockext.shared_leases AS a,
       lockext.lock_acquire('pool', 'c1', '2 minutes', permits => 2) AS b
 WHERE a.lock_id = 'pool' AND a.owner = 'c1';
SELECT mode, owner, permits FROM lockext.holders WHERE lock_id = 'pool' ORDER BY owner;
-- The first acquire fixed n while the semaphore has live permits: another n is an error.
SELECT lockext.lock_acquire('pool', 'c3', '1 minute', permits => 3);
-- A lock id is a lock or a semaphore, not both at once.
SELECT lockext.lock_acquire('pool', 'c3', '1 minute');
SELECT lockext.lock_acquire('pool', 'c3', '1 minute', mode => 'shared');
SELECT lockext.lock_acquire('report', 'c3', '1 minute', permits => 2) IS NOT NULL AS report_is_free_so_it_may_become_one;
SELECT lockext.lock_release('report', 'c3');
SELECT owner FROM lockext.lock_acquire('printer-x', 'A', '1 minute');
SELECT lockext.lock_acquire('printer-x', 'c3', '1 minute', permits => 2);
SELECT lockext.lock_release('printer-x', 'A');
-- A released permit is free for the next taker.
SELECT lockext.lock_release('pool', 'c2');
SELECT owner FROM lockext.lock_acquire('pool', 'c3', '1 minute', permits => 2);
-- Once no permit is held, the next acquire fixes n anew.
SELECT lockext.lock_release_all(ARRAY['pool'], 'c1') + lockext.lock_release_all(ARRAY['pool'], 'c3') AS released;
SELECT owner FROM lockext.lock_acquire('pool', 'c1', '1 minute', permits => 5);
SELECT lockext.lock_release('pool', 'c1');

-- Bad mode and permits change nothing.
SELECT lockext.lock_acquire('pool', 'c1', '1 minute', mode => 'read');
SELECT lockext.lock_acquire('pool', 'c1', '1 minute', permits => 0);
SELECT lockext.lock_acquire('pool', 'c1', '1 minute', permits => 1000001);
SELECT lockext.lock_acquire('pool', 'c1', '1 minute', mode => 'shared', permits => 2);
SELECT count(*) AS leases FROM lockext.shared_leases WHERE lock_id = 'pool';

-- Sets: all or nothing, one grant per distinct id, in sorted order.
SELECT lock_id, owner FROM lockext.lock_acquire_all(ARRAY['s-c', 's-a', 's-b', 's-a'], 'batch', '1 minute');
-- A rival set that overlaps gets nothing, and takes nothing: s-d stays free.
SELECT count(*) AS grants FROM lockext.lock_acquire_all(ARRAY['s-d', 's-c'], 'rival', '1 minute');
SELECT count(*) AS rival_holds FROM lockext.holders WHERE owner = 'rival';
SELECT lockext.lock_release_all(ARRAY['s-a', 's-b', 's-c', 's-d'], 'batch') AS released;
SELECT lock_id FROM lockext.lock_acquire_all(ARRAY['s-d', 's-c'], 'rival', '1 minute');
SELECT lockext.lock_release_all(ARRAY['s-c', 's-d'], 'rival') AS released;
-- Shared sets, too.
SELECT lock_id, owner FROM lockext.lock_acquire_all(ARRAY['t-2', 't-1'], 'reader', '1 minute', mode => 'shared');
SELECT lockext.lock_release_all(ARRAY['t-1', 't-2'], 'reader') AS released;
-- A waiting set that is cancelled (statement_timeout) leaves nothing behind: its
-- subtransaction is rolled back with it, and the session goes on as after any error.
SELECT owner FROM lockext.lock_acquire('s-held', 'other', '1 minute');
SET statement_timeout = '300ms';
\set VERBOSITY terse
SELECT * FROM lockext.lock_acquire_all(ARRAY['s-free', 's-held'], 'waiter', '1 minute', wait => '10 seconds');
\set VERBOSITY default
RESET statement_timeout;
SELECT 1 AS next_statement_runs;
BEGIN;
SELECT lock_id FROM lockext.lock_acquire('s-after', 'waiter', '1 minute');
ROLLBACK;
-- The same inside an exception block: what follows it commits as usual.
SET statement_timeout = '300ms';
DO $$
BEGIN
    PERFORM * FROM lockext.lock_acquire_all(ARRAY['s-held'], 'waiter', '1 minute', wait => '10 seconds');
EXCEPTION WHEN query_canceled THEN
    RAISE NOTICE 'cancelled';
END $$;
RESET statement_timeout;
SELECT lock_id FROM lockext.lock_acquire('s-after', 'waiter', '1 minute');
\c
SELECT lock_id, owner FROM lockext.locks WHERE lock_id IN ('s-free', 's-held', 's-after') ORDER BY 1;
SELECT lockext.lock_release('s-after', 'waiter') AND lockext.lock_release('s-held', 'other') AS released;
-- Claims of a refused set are given back with its subtransaction, and stop counting
-- against the transaction's budget (max_locks_per_transaction / 2): a loop of refused sets
-- in one transaction leaves the next shared acquire as free as the first.
SELECT owner FROM lockext.lock_acquire('s-held', 'other', '1 minute');
DO $$
BEGIN
    FOR i IN 1..100 LOOP
        PERFORM * FROM lockext.lock_acquire_all(ARRAY['s-a' || i, 's-held'], 'looper', '1 minute');
    END LOOP;
    PERFORM lockext.lock_acquire('s-shared', 'looper', '1 minute', mode => 'shared');
    RAISE NOTICE 'shared lease taken after 100 refused sets';
END $$;
SELECT lockext.lock_release('s-shared', 'looper') AND lockext.lock_release('s-held', 'other') AS released;
-- Past the budget, only an operator's bulk load of exclusive leases goes on (with one claim
-- for the whole database, which refuses every shared acquire in it till it commits): a
-- plain member is refused (53200), or it could refuse everyone's shared leases for as long
-- as it kept its transaction open.
CREATE ROLE regress_bulk IN ROLE lockext_user;
BEGIN;
SET LOCAL ROLE regress_bulk;
SELECT count(*) FROM generate_series(1, 40) AS g, lockext.lock_acquire('bulk-' || g, 'b', '1 minute') AS x;
ROLLBACK;
BEGIN;
SELECT count(*) FROM generate_series(1, 40) AS g, lockext.lock_acquire('bulk-' || g, 'b', '1 minute') AS x;
ROLLBACK;
-- Shared leases of one lock id, each for another owner, are past the budget too: each new
-- row needs its claim kept (another transaction creating the same owner's row would wait
-- for this one's uncommitted row), so a member is refused (53200), not let through.
BEGIN;
SET LOCAL ROLE regress_bulk;
SELECT count(*) FROM generate_series(1, 60) AS g,
       LATERAL lockext.lock_acquire('sx', 'm-' || g, '10 minutes', mode => 'shared') AS a
 WHERE a.fence_token IS NOT NULL;
ROLLBACK;
DROP ROLE regress_bulk;
-- Bad sets.
SELECT * FROM lockext.lock_acquire_all(ARRAY[]::text[], 'batch', '1 minute');
SELECT * FROM lockext.lock_acquire_all(ARRAY['s-a', NULL], 'batch', '1 minute');
SELECT * FROM lockext.lock_acquire_all(NULL, 'batch', '1 minute');
SELECT * FROM lockext.lock_acquire_all(ARRAY['s-a', ''], 'batch', '1 minute');
SELECT lockext.lock_release_all(ARRAY[]::text[], 'batch');
SELECT count(*) AS leases FROM lockext.locks WHERE lock_id LIKE 's-%';

-- Session-bound leases: recorded with the backend that took them (the lease ends when this
-- session does; see the cluster tests), and the TTL still bounds them.
SELECT owner FROM lockext.lock_acquire('console', 'me', '1 minute', session_bound => true);
SELECT mode, session_bound, pid = pg_backend_pid() AS mine FROM lockext.holders WHERE lock_id = 'console';
SELECT lockext.lock_release('console', 'me');
-- A DBA turns them off where a transaction pooler stands between clients and sessions.
SET lockext.session_leases = off;
SELECT lockext.lock_acquire('console', 'me', '1 minute', session_bound => true);
SELECT lockext.lock_acquire('console', 'me', '1 minute') IS NOT NULL AS unbound_still_fine;
SELECT lockext.lock_release('console', 'me');
RESET lockext.session_leases;
-- Only a superuser may turn them back on, so ALTER ROLE ... SET lockext.session_leases = off sticks.
CREATE ROLE regress_pooled IN ROLE lockext_user;
SET ROLE regress_pooled;
SET lockext.session_leases = on;
RESET ROLE;
DROP ROLE regress_pooled;
