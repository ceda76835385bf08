-- Leader election: a grant carries a value (lock_campaign, lock_set_value), anyone with
-- lockext_user asks who holds a lock now (lock_holders), and waits for that to change
-- (lock_observe). A value belongs to one grant: once the grant is not live, nobody sees
-- it. (Several sessions, SIGKILL of a leader and the events: tests/cluster/tests/election.rs;
-- a stale holder against the new leader: tests/isolation/specs/leader_election.spec.)
\set VERBOSITY default
\set SHOW_CONTEXT never

-- The SQLSTATE a statement raises ('ok' when none).
CREATE FUNCTION pg_temp.sqlstate_of(statement text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE statement;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $$;
CREATE ROLE election_app LOGIN;
CREATE ROLE election_other LOGIN;
CREATE ROLE election_outsider LOGIN;
GRANT lockext_user TO election_app, election_other;
SET ROLE election_app;

-- A campaign is lock_acquire with a value: the grant, and its value, in one call.
SELECT lock_id, owner FROM lockext.lock_campaign('db-primary', 'node-a', '1 minute', '{"addr": "10.0.0.1:5432"}');
SELECT fence_token AS a FROM lockext.lock_holders('db-primary') \gset
-- Who leads now, with the value and its version (1: the grant's first value).
SELECT owner, kind, fence_token = :a AS same_token, value, version,
       expires_at > clock_timestamp() AS live
  FROM lockext.lock_holders('db-primary');
-- Another campaign is refused while the leader's lease is live, and sets nothing.
SELECT lockext.lock_campaign('db-primary', 'node-b', '1 minute', '{"addr": "10.0.0.2:5432"}') IS NULL AS refused;
SELECT owner, value FROM lockext.lock_holders('db-primary');

-- The holder changes its value (fenced by its token): the version counts the changes.
SELECT lockext.lock_set_value('db-primary', 'node-a', :a, '{"addr": "10.0.0.1:6432"}') AS version;
SELECT owner, value, version FROM lockext.lock_holders('db-primary');
-- A same-owner retry of the campaign gets the same grant back and sets the value again.
SELECT fence_token = :a AS same_grant
  FROM lockext.lock_campaign('db-primary', 'node-a', '1 minute', '{"addr": "10.0.0.1:7432"}');
SELECT value, version FROM lockext.lock_holders('db-primary');

-- Anyone but the holder, with exactly this token, is refused with 55L01 ('fence token ...
-- is not a live grant of lock ...'), and nothing changes: another owner, another token,
-- another role holding the same owner name.
SELECT pg_temp.sqlstate_of(format($$SELECT lockext.lock_set_value('db-primary', 'node-b', %s, '"no"')$$, :a));
SELECT pg_temp.sqlstate_of(format($$SELECT lockext.lock_set_value('db-primary', 'node-a', %s, '"no"')$$, :a + 1));
RESET ROLE;
SET ROLE election_other;
SELECT pg_temp.sqlstate_of(format($$SELECT lockext.lock_set_value('db-primary', 'node-a', %s, '"no"')$$, :a));
-- Every member may read who holds it, with the value (as anyone with read access in etcd).
SELECT owner, value, version FROM lockext.lock_holders('db-primary');
RESET ROLE;
-- A role without lockext_user may not, and cannot read the values' table either.
SET ROLE election_outsider;
SELECT * FROM lockext.lock_holders('db-primary');
SELECT * FROM lockext.lock_observe('db-primary');
SELECT * FROM lockext.lease_values;
RESET ROLE;
SET ROLE election_app;

-- Bad input is refused before anything is written.
SELECT lockext.lock_set_value('db-primary', 'node-a', 1, NULL);
SELECT lockext.lock_set_value('db-primary', 'node-a', 0, '1');
SELECT lockext.lock_set_value('', 'node-a', 1, '1');
SELECT lockext.lock_campaign('big', 'node-a', '1 minute', to_jsonb(repeat('x', 1100000)));
SELECT lockext.lock_campaign('big', 'node-a', '1 minute', NULL);
SELECT count(*) AS nothing_taken FROM lockext.locks WHERE lock_id = 'big';
-- lockext.value_max_size bounds a value (default 1 MiB, as jsonb). Only a superuser sets
-- it (for a role too: ALTER ROLE ... SET); a value over it is refused (22023) and the
-- grant keeps its value and version.
SET lockext.value_max_size = '1MB';
RESET ROLE;
SET lockext.value_max_size = '1kB';
SET ROLE election_app;
SHOW lockext.value_max_size;
SELECT version AS before FROM lockext.lock_holders('db-primary');
SELECT pg_temp.sqlstate_of(format($$SELECT lockext.lock_set_value('db-primary', 'node-a', %s, to_jsonb(repeat('x', 2000)))$$, :a));
SELECT lockext.lock_set_value('db-primary', 'node-a', :a, to_jsonb(repeat('x', 2000)));
SELECT value, version AS unchanged FROM lockext.lock_holders('db-primary');
SELECT lockext.lock_campaign('small-limit', 'node-a', '1 minute', to_jsonb(repeat('x', 2000)));
SELECT count(*) AS nothing_taken FROM lockext.locks WHERE lock_id = 'small-limit';
-- lockext.role_values_size bounds what one role stores in the database (default 16 MiB),
-- each value counted as at least 1 kB. At 2 kB this role has room for two values:
-- db-primary's and one more; a third is refused (53400), takes no lease and stores
-- nothing, while the holder of a value may still replace it.
RESET ROLE;
SET lockext.role_values_size = '2kB';
SHOW lockext.role_values_size;
SELECT count(*) AS values_of_the_role FROM lockext.lease_values v
  JOIN pg_roles r ON r.oid = v.holder_role WHERE r.rolname = 'election_app';
SET ROLE election_app;
SELECT lock_id FROM lockext.lock_campaign('quota-a', 'node-a', '1 minute', '"a"');
SELECT fence_token AS q FROM lockext.lock_holders('quota-a') \gset
SELECT pg_temp.sqlstate_of($$SELECT lockext.lock_campaign('quota-b', 'node-a', '1 minute', '"b"')$$);
SELECT lockext.lock_campaign('quota-b', 'node-a', '1 minute', '"b"');
SELECT count(*) AS nothing_taken FROM lockext.locks WHERE lock_id = 'quota-b';
SELECT lockext.lock_set_value('quota-a', 'node-a', :q, '"a, again"') AS version;
RESET ROLE;
RESET lockext.value_max_size;
RESET lockext.role_values_size;
SET ROLE election_app;
SELECT * FROM lockext.lock_observe('db-primary', :a, -1, '1 second');
SELECT * FROM lockext.lock_observe('db-primary', :a, 3, '2 days');
SELECT value, version FROM lockext.lock_holders('db-primary');

-- lock_observe returns at once when the leader or its value is not what the caller knows,
-- with changed = true; at the timeout with changed = false when it is.
SELECT changed, owner, value, version FROM lockext.lock_observe('db-primary', :a, 2, '10 seconds');
SELECT changed, owner, fence_token = :a AS same_token, version
  FROM lockext.lock_observe('db-primary', NULL, NULL, '10 seconds');
SELECT clock_timestamp() AS before \gset
SELECT changed, owner, version FROM lockext.lock_observe('db-primary', :a, 3, '200 ms');
SELECT clock_timestamp() - :'before' >= interval '200 ms' AS waited_the_timeout;
-- A free lock: no holders, and lock_observe's row has NULLs.
SELECT count(*) AS holders FROM lockext.lock_holders('nobody-holds-this');
SELECT * FROM lockext.lock_observe('nobody-holds-this', NULL, NULL, '0');
-- Observing needs a snapshot per statement: it would never see a change otherwise.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.sqlstate_of($$SELECT lockext.lock_observe('db-primary')$$);
SELECT * FROM lockext.lock_observe('db-primary', :a, 3, '1 second');
ROLLBACK;
-- Setting a value too: an older snapshot could show a lease that has since ended as held.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.sqlstate_of(format($$SELECT lockext.lock_set_value('db-primary', 'node-a', %s, '"from an old snapshot"')$$, :a));
ROLLBACK;

-- Resignation: after a release nobody holds it and no value is shown; the next leader's
-- campaign has a newer token, version 1, and the old value is deleted.
SELECT lockext.lock_release('db-primary', 'node-a', :a) AS resigned;
SELECT count(*) AS holders FROM lockext.lock_holders('db-primary');
SELECT changed, owner FROM lockext.lock_observe('db-primary', :a, 3, '10 seconds');
SELECT pg_temp.sqlstate_of(format($$SELECT lockext.lock_set_value('db-primary', 'node-a', %s, '"after resigning"')$$, :a));
SELECT fence_token > :a AS newer FROM lockext.lock_campaign('db-primary', 'node-b', '1 minute', '{"addr": "10.0.0.2:5432"}');
SELECT owner, value, version FROM lockext.lock_holders('db-primary');
RESET ROLE;
SELECT count(*) AS values_kept, bool_and(owner = 'node-b') AS only_the_new_leaders
  FROM lockext.lease_values WHERE lock_id = 'db-primary';
SET ROLE election_app;

-- Expiry: a leader that stops renewing is not shown once its lease has run out, and its
-- value with it; a stale holder setting its value then is refused.
SELECT fence_token AS e FROM lockext.lock_campaign('short', 'node-a', '50 ms', '"a"') \gset
SELECT pg_sleep(0.1);
SELECT count(*) AS holders FROM lockext.lock_holders('short');
SELECT pg_temp.sqlstate_of(format($$SELECT lockext.lock_set_value('short', 'node-a', %s, '"still me"')$$, :e));
-- Taken over: the new leader's grant shows its own value only.
SELECT fence_token > :e AS newer FROM lockext.lock_campaign('short', 'node-b', '1 minute', '"b"');
SELECT owner, value, version FROM lockext.lock_holders('short');

-- Shared leases and permits: every holder, oldest grant first (the first is the leader),
-- each with its own value or none (version 0). A plain lock_acquire sets no value.
SELECT lock_id FROM lockext.lock_acquire('pool', 'w1', '1 minute', permits => 3);
SELECT lock_id FROM lockext.lock_campaign('pool', 'w2', '1 minute', '{"shard": 2}', permits => 3);
SELECT lock_id FROM lockext.lock_campaign('pool', 'w3', '1 minute', '{"shard": 3}', permits => 3);
SELECT owner, kind, value, version FROM lockext.lock_holders('pool');
SELECT changed, owner, kind, value FROM lockext.lock_observe('pool', NULL, NULL, '1 second');
SELECT lock_id FROM lockext.lock_campaign('readers', 'r1', '1 minute', '"r1"', mode => 'shared');
SELECT owner, kind, value FROM lockext.lock_holders('readers');

-- Values are in a table of their own: grants without one write nothing there.
RESET ROLE;
SELECT lock_id, owner, value, version FROM lockext.lease_values ORDER BY lock_id, owner;
SELECT lockext.lock_release(lock_id, owner) FROM lockext.holders
 WHERE lock_id IN ('db-primary', 'short', 'pool', 'readers', 'quota-a') ORDER BY lock_id, owner;
DROP OWNED BY election_app, election_other, election_outsider;
DROP ROLE election_app, election_other, election_outsider;
