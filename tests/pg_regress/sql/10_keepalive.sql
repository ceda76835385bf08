-- Keep-alives: one renewal for many leases (lock_keepalive_grant, lock_acquire's
-- keepalive, lock_keepalive_renew, lock_keepalive_revoke). An attached lease expires when
-- its keep-alive does; each keeps its own fencing token. Expiry here is forced by moving
-- the keep-alive's expiry back as superuser, not waited for. (Several sessions, the
-- reaper, the events and 100 000 leases: tests/cluster/tests/keepalive.rs; a renewal
-- racing a grant: tests/isolation/specs/keepalive.spec.)
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE FUNCTION pg_temp.sqlstate_of(statement text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE statement;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $$;
CREATE FUNCTION pg_temp.message_of(statement text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE statement;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLERRM;
END $$;
CREATE ROLE keepalive_app LOGIN;
CREATE ROLE keepalive_other LOGIN;
CREATE ROLE keepalive_operator LOGIN;
GRANT lockext_user TO keepalive_app, keepalive_other;
GRANT lockext_admin TO keepalive_operator;
SET ROLE keepalive_app;

-- A keep-alive of 1 minute; its id is a fencing token (never handed out twice).
SELECT keepalive AS k, expires_at AS k_expires FROM lockext.lock_keepalive_grant('1 minute') \gset
SELECT :k > 0 AS positive, :'k_expires'::timestamptz - clock_timestamp() BETWEEN '59 seconds' AND '1 minute' AS ttl_ok;
SELECT fence_token > :k AS tokens_go_on FROM lockext.lock_acquire('unattached', 'w1', '1 minute');

-- 20 partitions attached to it (in one transaction: at most max_locks_per_transaction / 2
-- leases), each its own grant and token, no ttl of its own.
SELECT count(*) AS granted, count(DISTINCT fence_token) AS tokens,
       bool_and(expires_at = :'k_expires'::timestamptz) AS keepalives_expiry
  FROM generate_series(1, 20) AS i,
       LATERAL lockext.lock_acquire('part-' || i, 'w1', NULL, keepalive => :k);
SELECT count(*) AS attached, bool_and(expires_at = :'k_expires'::timestamptz) AS shown_expiry
  FROM lockext.holders WHERE keepalive = :k;
SELECT leases, ended, renewals FROM lockext.keepalive_holders WHERE keepalive = :k;
-- A set, a shared lease and a permit attach the same way.
SELECT count(*) FROM lockext.lock_acquire_all(ARRAY['set-a', 'set-b'], 'w1', NULL, keepalive => :k);
SELECT lockext.lock_acquire('readers', 'w1', NULL, mode => 'shared', keepalive => :k) IS NOT NULL;
SELECT lockext.lock_acquire('pool', 'w1', NULL, permits => 2, keepalive => :k) IS NOT NULL;
SELECT lock_id, mode, expires_at = :'k_expires'::timestamptz AS keepalives_expiry
  FROM lockext.holders WHERE lock_id IN ('set-a', 'set-b', 'readers', 'pool') ORDER BY lock_id;
-- Others are refused while the keep-alive lives.
SELECT lockext.lock_acquire('part-1', 'w2', '1 minute') IS NULL AS refused;
SELECT lockext.lock_acquire('readers', 'w2', '1 minute') IS NULL AS refused;

-- One renewal extends all of them, writing one row: no lease row changes (same xmin).
CREATE TEMP TABLE before AS SELECT lock_id, xmin::text AS x FROM lockext.locks WHERE keepalive = :k;
SELECT lockext.lock_keepalive_renew(:k, '2 minutes') AS renewed_to \gset
SELECT :'renewed_to'::timestamptz - clock_timestamp() BETWEEN '119 seconds' AND '2 minutes' AS ttl_ok;
SELECT count(*) AS unchanged_rows
  FROM before JOIN lockext.locks AS l USING (lock_id) WHERE l.xmin::text = before.x;
SELECT count(*) AS extended FROM lockext.holders
 WHERE keepalive = :k AND expires_at = :'renewed_to'::timestamptz;
-- Without a ttl, a renewal extends by the keep-alive's own (1 minute).
SELECT renewed - clock_timestamp() BETWEEN '59 seconds' AND '1 minute' AS own_ttl
  FROM lockext.lock_keepalive_renew(:k) AS renewed;
SELECT renewals FROM lockext.keepalives WHERE keepalive = :k;

-- Its leases are renewed by it, not one by one: lock_renew says so (55000), changing nothing.
SELECT pg_temp.sqlstate_of($$SELECT lockext.lock_renew('part-1', 'w1', '1 hour')$$);
-- Its message names the keep-alive (compared, not printed: ids come from the token ledger,
-- so they move with the tokens that the tests before this one spent).
SELECT pg_temp.message_of($$SELECT lockext.lock_renew('part-1', 'w1', '1 hour')$$)
       = format('the lease of "part-1" is attached to keep-alive %s, which renews it', :k)
       AS names_its_keepalive;
-- The holder's fenced writes pass while the keep-alive lives.
SELECT fence_token AS p1 FROM lockext.locks WHERE lock_id = 'part-1' \gset
SELECT lockext.fenced_update('part-1-data', :p1, '{"v": 1}') AS written;
SELECT lockext.lock_check('part-1', :p1) AS live;
-- A same-owner retry with keepalive => NULL and a ttl takes the lease off the keep-alive:
-- same grant, an expiry of its own.
SELECT fence_token = :p1 AS same_grant, expires_at - clock_timestamp() > '50 minutes' AS own_expiry
  FROM lockext.lock_acquire('part-20', 'w1', '1 hour');
SELECT keepalive IS NULL AS detached FROM lockext.locks WHERE lock_id = 'part-20';
-- ...and attaching it again.
SELECT expires_at = (SELECT expires_at FROM lockext.keepalives WHERE keepalive = :k) AS attached_again
  FROM lockext.lock_acquire('part-20', 'w1', NULL, keepalive => :k);

-- Bad input: a documented SQLSTATE, and nothing changes.
SELECT pg_temp.sqlstate_of($$SELECT lockext.lock_acquire('x', 'w1', '1 minute', keepalive => 1)$$) AS ttl_and_keepalive;
SELECT pg_temp.sqlstate_of(format($$SELECT lockext.lock_acquire('x', 'w1', NULL, session_bound => true, keepalive => %s)$$, :k)) AS session_and_keepalive;
SELECT pg_temp.sqlstate_of($$SELECT lockext.lock_acquire('x', 'w1', NULL, keepalive => 0)$$) AS zero;
SELECT pg_temp.sqlstate_of($$SELECT lockext.lock_acquire('x', 'w1', NULL, keepalive => 12345)$$) AS no_such_keepalive;
SELECT pg_temp.sqlstate_of($$SELECT lockext.lock_acquire('x', 'w1', NULL)$$) AS neither;
SELECT pg_temp.sqlstate_of($$SELECT lockext.lock_keepalive_grant('0 seconds')$$) AS zero_ttl;
SELECT pg_temp.sqlstate_of($$SELECT lockext.lock_keepalive_grant('2 days')$$) AS long_ttl;
SELECT pg_temp.sqlstate_of($$SELECT lockext.lock_keepalive_renew(NULL)$$) AS null_id;
SELECT pg_temp.sqlstate_of($$SELECT lockext.lock_keepalive_revoke(-1)$$) AS negative_id;
\set VERBOSITY terse
SELECT lockext.lock_acquire('x', 'w1', NULL, keepalive => 12345);
\set VERBOSITY default
-- The hints name what to do with a keep-alive, not with a lease or a fence token.
SELECT lockext.lock_keepalive_grant('2 days');
SELECT lockext.lock_keepalive_renew(:k, '2 days');
SELECT lockext.lock_keepalive_renew(-5);
SELECT lockext.lock_acquire('x', 'w1', NULL, keepalive => 0);
-- Attaching is for READ COMMITTED (a keep-alive is renewed all the time).
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.sqlstate_of(format($$SELECT lockext.lock_acquire('x', 'w1', NULL, keepalive => %s)$$, :k)) AS repeatable_read;
COMMIT;
SELECT count(*) AS nothing_taken FROM lockext.locks WHERE lock_id = 'x';

-- Another role cannot attach to, renew or revoke it; an operator can renew and revoke.
RESET ROLE;
SET ROLE keepalive_other;
SELECT pg_temp.sqlstate_of(format($$SELECT lockext.lock_acquire('y', 'w9', NULL, keepalive => %s)$$, :k)) AS others_attach;
SELECT lockext.lock_keepalive_renew(:k) IS NULL AS others_renew_refused;
SELECT lockext.lock_keepalive_revoke(:k) IS NULL AS others_revoke_refused;
RESET ROLE;
SET ROLE keepalive_operator;
SELECT lockext.lock_keepalive_renew(:k) IS NOT NULL AS operator_renews;
RESET ROLE;

-- The keep-alive expires (forced here): every attached lease is dead at once, and free for
-- others: no fenced write of theirs passes, no renewal of the keep-alive revives them.
UPDATE lockext.keepalives SET expires_at = clock_timestamp() - interval '1 second' WHERE keepalive = :k;
SET ROLE keepalive_app;
SELECT count(*) AS live_attached FROM lockext.holders WHERE keepalive = :k;
SELECT lockext.lock_check('part-1', :p1) AS live;
RESET ROLE;
SET ROLE keepalive_other;
-- Taken over at once by another owner, with a new token: the grant ended the keep-alive.
-- (The reaper, running every second here, may have deleted the dead leases first: either
-- way the grant is immediate, and the keep-alive ended for good.)
SELECT fence_token AS q1, fence_token > :p1 AS newer FROM lockext.lock_acquire('part-1', 'w2', '1 minute') \gset
SELECT :'newer' AS newer;
SELECT lockext.fenced_update('part-1-data', :q1, '{"v": "w2"}') AS written;
SELECT count(*) AS not_ended FROM lockext.keepalives WHERE keepalive = :k AND NOT ended;
-- A shared lease over the expired one's exclusive, a lock over the expired shared lease.
SELECT lockext.lock_acquire('part-3', 'w2', '1 minute', mode => 'shared') IS NOT NULL AS shared_over_dead;
SELECT lockext.lock_acquire('readers', 'w2', '1 minute') IS NOT NULL AS exclusive_over_dead_shared;
SELECT lockext.lock_acquire('pool', 'w2', '1 minute', permits => 2) IS NOT NULL AS permit;
RESET ROLE;
SET ROLE keepalive_app;
-- Its holder learns: the renewal is refused (the keep-alive is ended), and attaching too.
SELECT lockext.lock_keepalive_renew(:k) IS NULL AS renew_refused;
SELECT pg_temp.sqlstate_of(format($$SELECT lockext.lock_acquire('z', 'w1', NULL, keepalive => %s)$$, :k)) AS attach_refused;
-- A fenced write of the old holder is refused once the new holder wrote (stale token).
SELECT lockext.fenced_update('part-1-data', :p1, '{"v": 2}') AS written;
SELECT data FROM lockext.resources WHERE resource_id = 'part-1-data';
RESET ROLE;

-- A resource bound to a lock refuses a grant whose keep-alive expired, at once, with no
-- successor needed.
SET ROLE keepalive_app;
SELECT keepalive AS k2 FROM lockext.lock_keepalive_grant('1 minute') \gset
SELECT fence_token AS b1 FROM lockext.lock_acquire('bound-lock', 'w1', NULL, keepalive => :k2) \gset
RESET ROLE;
SELECT lockext.bind_resource('bound-res', 'bound-lock');
SET ROLE keepalive_app;
SELECT lockext.fenced_update('bound-res', :b1, '{"v": 1}') AS written;
RESET ROLE;
UPDATE lockext.keepalives SET expires_at = clock_timestamp() - interval '1 second' WHERE keepalive = :k2;
SET ROLE keepalive_app;
SELECT lockext.fenced_update('bound-res', :b1, '{"v": 2}') AS written;
SELECT data FROM lockext.resources WHERE resource_id = 'bound-res';

-- Revoking ends every lease attached to it at once (released: others may take them).
SELECT keepalive AS k3 FROM lockext.lock_keepalive_grant('1 minute') \gset
SELECT count(*) FROM generate_series(1, 20) AS i,
       LATERAL lockext.lock_acquire('rev-' || i, 'w1', NULL, keepalive => :k3);
SELECT lockext.lock_keepalive_revoke(:k3) AS released;
SELECT count(*) AS left_attached FROM lockext.locks WHERE keepalive = :k3;
SELECT pg_temp.sqlstate_of(format($$SELECT lockext.lock_acquire('rev-1', 'w1', NULL, keepalive => %s)$$, :k3)) AS attach_refused;
SELECT lockext.lock_keepalive_renew(:k3) IS NULL AS renew_refused;
SELECT lockext.lock_acquire('rev-1', 'w2', '1 minute') IS NOT NULL AS free_again;
-- Revoking it again ends nothing (0, or NULL once the reaper deleted the ended row).
SELECT coalesce(lockext.lock_keepalive_revoke(:k3), 0) AS again;
-- A lease of a keep-alive may still be released one by one.
SELECT keepalive AS k4 FROM lockext.lock_keepalive_grant('1 minute') \gset
SELECT lockext.lock_acquire('one', 'w1', NULL, keepalive => :k4) IS NOT NULL;
SELECT lockext.lock_release('one', 'w1') AS released;
SELECT leases FROM lockext.keepalive_holders WHERE keepalive = :k4;
RESET ROLE;
