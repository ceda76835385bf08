-- Fencing any table, in the same transaction as the write. Three patterns.
\set VERBOSITY default
\set SHOW_CONTEXT never
CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, written_by text);
INSERT INTO accounts VALUES (42, 100, 'nobody');

-- 1. lockext.fence(resource_id, fence_token) in the writing transaction.
--    A takes the lock; its lease runs out while it is paused; B takes over.
SELECT fence_token AS a FROM lockext.lock_acquire('acct:42', 'A', '20 milliseconds') \gset
SELECT pg_sleep(0.05);
SELECT fence_token AS b FROM lockext.lock_acquire('acct:42', 'B', '1 minute') \gset
BEGIN;
SELECT lockext.fence('acct:42', :b);
UPDATE accounts SET balance = 80, written_by = 'B' WHERE id = 42;
COMMIT;
-- A wakes up and writes in its own transaction: the fence aborts all of it.
BEGIN;
SELECT lockext.fence('acct:42', :a);
UPDATE accounts SET balance = 0, written_by = 'A' WHERE id = 42;
COMMIT;
SELECT * FROM accounts;
-- The same grant may fence again; the mark is kept in lockext.resources (no document).
SELECT lockext.fence('acct:42', :b);
SELECT resource_id, fence_token = :b AS mark_is_b, data FROM lockext.resources WHERE resource_id = 'acct:42';
-- fenced_update shares the mark: an older token cannot write through it either.
SELECT lockext.fenced_update('acct:42', :a, '{"balance": 0}') AS stale_fenced_update;
-- Forged tokens are refused as by fenced_update.
SELECT lockext.fence('acct:42', :b + 1000000);

-- 2. A trigger that keeps a fence per row: a stale UPDATE from any client is rejected.
CREATE TABLE jobs (id int PRIMARY KEY, state text, fence_token bigint);
CREATE TRIGGER jobs_fence BEFORE INSERT OR UPDATE OR DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
INSERT INTO jobs VALUES (1, 'queued', :a);
UPDATE jobs SET state = 'running', fence_token = :b WHERE id = 1;       -- higher: accepted
UPDATE jobs SET state = 'stale', fence_token = :a WHERE id = 1;         -- lower: rejected
SELECT id, state, fence_token = :b AS holds_b FROM jobs;
-- An UPDATE that leaves the token column out of its SET list carries no writer's token: it
-- must declare one, or it is refused (22004). One that names the column carries the
-- token it sets, even the row's own: the holder writes its row again, and the token it
-- set counts as declared for its transaction's next writes.
UPDATE jobs SET state = 'stale, without a token' WHERE id = 1;
UPDATE jobs SET state = 'again', fence_token = :b WHERE id = 1;
BEGIN;
UPDATE jobs SET state = 'and again', fence_token = :b WHERE id = 1;
UPDATE jobs SET state = 'once more, declared by the last write' WHERE id = 1;
COMMIT;
SELECT id, state, fence_token = :b AS holds_b FROM jobs;
-- A stale holder that declares its own token is refused (55L01), and so is one that
-- declares nothing; the row's holder that declares its token writes.
BEGIN;
SELECT lockext.declare_token(:a);
UPDATE jobs SET state = 'stale, declared' WHERE id = 1;
ROLLBACK;
BEGIN;
SELECT lockext.declare_token(:b);
UPDATE jobs SET state = 'running again' WHERE id = 1;
COMMIT;
SELECT id, state, fence_token = :b AS holds_b FROM jobs;
-- DELETE and a re-INSERT under an old token: the DELETE needs a declared token too.
DELETE FROM jobs WHERE id = 1;
BEGIN;
SELECT lockext.declare_token(:a);
DELETE FROM jobs WHERE id = 1;
ROLLBACK;
-- A declaration counts for its own transaction and role only: not in the next transaction,
-- not for another role (a foreign key's cascade, a SECURITY DEFINER function, SET ROLE).
SELECT lockext.declare_token(:b);
DELETE FROM jobs WHERE id = 1;
CREATE ROLE regress_declarer IN ROLE lockext_user;
GRANT DELETE ON jobs TO regress_declarer;
BEGIN;
SET LOCAL ROLE regress_declarer;
SELECT lockext.declare_token(:b);
RESET ROLE;
DELETE FROM jobs WHERE id = 1;
ROLLBACK;
-- Each role has its own: a SECURITY DEFINER function of another role that declares that
-- role's token (for its own guarded table) leaves the caller's declaration as it was.
CREATE FUNCTION pg_temp.declare_as_definer(t bigint) RETURNS void LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog AS 'SELECT lockext.declare_token(t)';
ALTER FUNCTION pg_temp.declare_as_definer(bigint) OWNER TO regress_declarer;
BEGIN;
SELECT lockext.declare_token(:b);
SELECT pg_temp.declare_as_definer(:a);
SELECT lockext.declared_token() = :b AS callers_declaration_kept;
ROLLBACK;
DROP FUNCTION pg_temp.declare_as_definer(bigint);
REVOKE DELETE ON jobs FROM regress_declarer;
DROP ROLE regress_declarer;
-- ROLLBACK TO SAVEPOINT undoes a declaration made after the savepoint, explicit or made by
-- an accepted write (an INSERT declares its token), and keeps one made before it.
BEGIN;
SAVEPOINT s;
SELECT lockext.declare_token(:b);
ROLLBACK TO s;
SELECT lockext.declared_token() AS declared_after_rollback_to;
DELETE FROM jobs WHERE id = 1;
ROLLBACK;
BEGIN;
SAVEPOINT s;
INSERT INTO jobs VALUES (99, 'rolled back', :b);
ROLLBACK TO s;
SELECT lockext.declared_token() AS declared_after_rollback_to;
ROLLBACK;
BEGIN;
SELECT lockext.declare_token(:b);
SAVEPOINT s;
SELECT lockext.declare_token(:a);
ROLLBACK TO s;
SELECT lockext.declared_token() = :b AS outer_declaration_kept;
ROLLBACK;
SELECT lockext.declare_token(:b + 1000000);  -- never issued
SELECT count(*) AS jobs_left FROM jobs;
-- A declared token newer than the row's is written into the row.
INSERT INTO jobs VALUES (3, 'queued', :a);
BEGIN;
SELECT lockext.declare_token(:b);
UPDATE jobs SET state = 'taken' WHERE id = 3;
COMMIT;
SELECT id, state, fence_token = :b AS holds_b FROM jobs WHERE id = 3;
-- A row must carry a token, and a real one.
UPDATE jobs SET fence_token = NULL WHERE id = 1;
INSERT INTO jobs VALUES (2, 'untokened', NULL);
INSERT INTO jobs VALUES (2, 'zero', 0);
INSERT INTO jobs VALUES (2, 'forged', :b + 1000000);
-- Each stale writer refused counts in lockext.stats (fence_rejected_stale), as those of
-- fenced_update and lockext.fence do, although the trigger's error rolls its transaction
-- back: the counters live in shared memory.
SELECT value AS stale_before FROM lockext.stats WHERE name = 'fence_rejected_stale' \gset
UPDATE jobs SET state = 'stale', fence_token = :a WHERE id = 1;
BEGIN;
SELECT lockext.declare_token(:a);
DELETE FROM jobs WHERE id = 1;
ROLLBACK;
SELECT value - :stale_before AS rejections_counted FROM lockext.stats WHERE name = 'fence_rejected_stale';
-- With a resource id, the row's token also fences that resource.
CREATE TABLE ledger (id int PRIMARY KEY, amount int, fence_token bigint);
CREATE TRIGGER ledger_fence BEFORE INSERT OR UPDATE OR DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token', 'ledger');
INSERT INTO ledger VALUES (1, 10, :b);
INSERT INTO ledger VALUES (2, 20, :a);  -- a new row, but the resource has seen :b
SELECT id, amount FROM ledger;
-- A declared token also fences the resource, and one newer than the row's is written in.
BEGIN;
SELECT lockext.declare_token(:a);
DELETE FROM ledger WHERE id = 1;        -- the row has :b, and so has the resource
ROLLBACK;
BEGIN;
SELECT lockext.declare_token(:b);
UPDATE ledger SET amount = 11 WHERE id = 1;
DELETE FROM ledger WHERE id = 1;
COMMIT;
SELECT count(*) AS ledger_rows FROM ledger;
-- An UPDATE that moves a row to another partition is a DELETE and an INSERT: the token it
-- carries counts for both.
CREATE TABLE pjobs (id int, state text, fence_token bigint) PARTITION BY RANGE (id);
CREATE TABLE pjobs_low PARTITION OF pjobs FOR VALUES FROM (0) TO (100);
CREATE TABLE pjobs_high PARTITION OF pjobs FOR VALUES FROM (100) TO (200);
CREATE TRIGGER pjobs_fence BEFORE INSERT OR UPDATE OR DELETE ON pjobs
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
INSERT INTO pjobs VALUES (150, 'queued', :a);
UPDATE pjobs SET id = 50, fence_token = :b WHERE id = 150;
SELECT tableoid::regclass, id, fence_token = :b AS holds_b FROM pjobs;
-- Misuse is reported clearly.
CREATE TABLE untokened (id int);
CREATE TRIGGER untokened_fence BEFORE INSERT ON untokened
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
INSERT INTO untokened VALUES (1);
CREATE TABLE wrongtype (id int, fence_token text);
CREATE TRIGGER wrongtype_fence BEFORE INSERT ON wrongtype
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
INSERT INTO wrongtype VALUES (1, 'abc');
CREATE TABLE after_t (id int, fence_token bigint);
CREATE TRIGGER after_t_fence AFTER INSERT ON after_t
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
INSERT INTO after_t VALUES (1, :b);
CREATE TABLE noargs_t (id int, fence_token bigint);
CREATE TRIGGER noargs_t_fence BEFORE INSERT ON noargs_t
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard();
INSERT INTO noargs_t VALUES (1, :b);
-- fence_guard is a trigger function: called alone, it says so.
SELECT lockext.fence_guard();
-- A system column is no token column.
CREATE TABLE sysname_t (id int);
CREATE TRIGGER sysname_t_fence BEFORE INSERT ON sysname_t
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('ctid');
INSERT INTO sysname_t VALUES (1);
-- Names that must be quoted are quoted in the hints, as they are written in SQL.
CREATE TABLE "Odd Jobs" (id int);
CREATE TRIGGER odd_fence BEFORE INSERT ON "Odd Jobs"
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('Fence Token');
INSERT INTO "Odd Jobs" VALUES (1);
-- The token column's type: bigint, integer or smallint, or a domain over one of them. Any
-- other is refused whatever the row holds, NULL too (numeric, which can hold 1.5; text,
-- which can hold '1'; jsonb, which can hold 1).
CREATE DOMAIN token_d AS bigint CHECK (VALUE > 0);
CREATE DOMAIN old_token_d AS bigint CHECK (VALUE <= :a);
CREATE TABLE t_int (id int, fence_token integer);
CREATE TABLE t_small (id int, fence_token smallint);
CREATE TABLE t_domain (id int, fence_token token_d);
CREATE TABLE t_old_domain (id int, fence_token old_token_d);
CREATE TABLE t_numeric (id int, fence_token numeric);
CREATE TABLE t_text (id int, fence_token text);
CREATE TABLE t_jsonb (id int, fence_token jsonb);
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['t_int', 't_small', 't_domain', 't_old_domain', 't_numeric', 't_text', 't_jsonb'] LOOP
        EXECUTE format('CREATE TRIGGER %I BEFORE INSERT OR UPDATE OR DELETE ON %I
                        FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard(''fence_token'')', t || '_fence', t);
    END LOOP;
END $$;
INSERT INTO t_int VALUES (1, :a);
INSERT INTO t_small VALUES (1, :a);
INSERT INTO t_domain VALUES (1, :a);
INSERT INTO t_old_domain VALUES (1, :a);
-- A declared token is written into each of them, and read back as the token it is.
BEGIN;
SELECT lockext.declare_token(:b);
UPDATE t_int SET id = 2;
UPDATE t_small SET id = 2;
UPDATE t_domain SET id = 2;
COMMIT;
SELECT 'integer' AS type, fence_token = :b AS holds_b FROM t_int
UNION ALL SELECT 'smallint', fence_token = :b FROM t_small
UNION ALL SELECT 'token_d', fence_token = :b FROM t_domain;
UPDATE t_int SET fence_token = :a;
UPDATE t_small SET fence_token = :a;
-- The domain's constraints hold for the token the trigger writes.
BEGIN;
SELECT lockext.declare_token(:b);
UPDATE t_old_domain SET id = 2;
ROLLBACK;
INSERT INTO t_numeric VALUES (1, :b);
INSERT INTO t_text VALUES (1, NULL);
INSERT INTO t_jsonb VALUES (1, to_jsonb(:b));
-- The token column is found by its name, wherever it is: after dropped columns, and added
-- after the rows with a default (rows then hold it without storing it).
CREATE TABLE dropped_t (gone1 text, id int, gone2 int, state text);
INSERT INTO dropped_t VALUES ('x', 1, 2, 'queued');
ALTER TABLE dropped_t DROP COLUMN gone1, DROP COLUMN gone2;
ALTER TABLE dropped_t ADD COLUMN fence_token bigint NOT NULL DEFAULT :a;
CREATE TRIGGER dropped_t_fence BEFORE INSERT OR UPDATE OR DELETE ON dropped_t
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
UPDATE dropped_t SET state = 'stale', fence_token = :a - 1 WHERE id = 1;
BEGIN;
SELECT lockext.declare_token(:b);
UPDATE dropped_t SET state = 'taken' WHERE id = 1;
COMMIT;
INSERT INTO dropped_t VALUES (2, 'new', :b);
SELECT id, state, fence_token = :b AS holds_b FROM dropped_t ORDER BY id;
-- A partition whose columns are numbered otherwise than its parent's (a dropped column
-- before them): the UPDATE's SET list is read in the partition's numbers. Naming the
-- token column, even with the row's own value, declares it; leaving it out does not.
CREATE TABLE ppart (id int, state text, fence_token bigint) PARTITION BY RANGE (id);
CREATE TABLE ppart_low (gone int, id int, state text, fence_token bigint);
ALTER TABLE ppart_low DROP COLUMN gone;
ALTER TABLE ppart ATTACH PARTITION ppart_low FOR VALUES FROM (0) TO (100);
CREATE TABLE ppart_high PARTITION OF ppart FOR VALUES FROM (100) TO (200);
CREATE TRIGGER ppart_fence BEFORE INSERT OR UPDATE OR DELETE ON ppart
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
SELECT attname, attnum FROM pg_attribute
 WHERE attrelid IN ('ppart'::regclass, 'ppart_low'::regclass) AND attname = 'fence_token' ORDER BY attrelid;
INSERT INTO ppart VALUES (10, 'queued', :a);
UPDATE ppart SET state = 'no token' WHERE id = 10;
BEGIN;
UPDATE ppart SET state = 'own token', fence_token = :a WHERE id = 10;
DELETE FROM ppart WHERE id = 10;   -- declared by the UPDATE
ROLLBACK;
-- Moved to the other partition: the token it carries counts for the DELETE from this one.
UPDATE ppart SET id = 150, state = 'moved', fence_token = :b WHERE id = 10;
-- And back, by an UPDATE that leaves the column out, with a declared token.
BEGIN;
SELECT lockext.declare_token(:b);
UPDATE ppart SET id = 20, state = 'moved back' WHERE id = 150;
COMMIT;
SELECT tableoid::regclass, id, state, fence_token = :b AS holds_b FROM ppart;
BEGIN;
SELECT lockext.declare_token(:a);
UPDATE ppart SET id = 160 WHERE id = 20;   -- a stale move is refused
ROLLBACK;

-- 3. lockext.lock_check(lock_id, fence_token): is that exact grant still live? With fence,
--    a transaction can demand both the newest token and a live lease.
SELECT lockext.lock_check('acct:42', :b) AS b_live, lockext.lock_check('acct:42', :a) AS a_live;
SELECT lockext.lock_release('acct:42', 'B', :b);
SELECT lockext.lock_check('acct:42', :b) AS b_live_after_release;

-- The stale-token error has lockext's own SQLSTATE, 55L01.
DO $$
DECLARE mark bigint;
BEGIN
    SELECT fence_token INTO mark FROM lockext.resources WHERE resource_id = 'acct:42';
    PERFORM lockext.fence('acct:42', mark - 1);
EXCEPTION WHEN SQLSTATE '55L01' THEN
    RAISE NOTICE 'caught SQLSTATE %', SQLSTATE;
END $$;

-- 4. Bound resources: a resource bound to the lock that guards it accepts only that
--    lock's live grant. A member holding no lock on 'ledger-b' takes a throwaway lock,
--    whose token is newer than the real holder's, and cannot poison the resource with it.
SELECT lockext.bind_resource('acct:bound', 'ledger-b');
SELECT fence_token AS holder FROM lockext.lock_acquire('ledger-b', 'real', '1 minute') \gset
SELECT fence_token AS attacker FROM lockext.lock_acquire('throwaway', 'attacker', '1 minute') \gset
SELECT :attacker > :holder AS attacker_token_is_newer;
SELECT lockext.fenced_update('acct:bound', :attacker, '{"by": "attacker"}') AS attacker_stored;
SELECT lockext.fence('acct:bound', :attacker);
SELECT lockext.fenced_update('acct:bound', :holder, '{"by": "real"}') AS holder_stored;
SELECT lock_id, fence_token = :holder AS holders_mark, data FROM lockext.resources WHERE resource_id = 'acct:bound';
-- fence_guard with a bound resource refuses the attacker's token as lockext.fence does.
CREATE TABLE bound_rows (id int, fence_token bigint);
CREATE TRIGGER bound_rows_fence BEFORE INSERT OR UPDATE OR DELETE ON bound_rows
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token', 'acct:bound');
INSERT INTO bound_rows VALUES (1, :attacker);
INSERT INTO bound_rows VALUES (1, :holder);
SELECT count(*) AS bound_rows FROM bound_rows;
-- An unbound resource keeps the high-water mark alone: any real token at least the mark
-- moves it, whichever lock it was granted for.
SELECT lockext.fenced_update('acct:unbound', :attacker, '{"by": "attacker"}') AS unbound_accepts_any_real_token;
-- A holder whose lease has run out is refused at once by a bound resource, even before a
-- successor has written (the high-water mark alone would still accept it).
SELECT lockext.bind_resource('acct:short', 'ledger-short');
SELECT fence_token AS short FROM lockext.lock_acquire('ledger-short', 'paused', '20 milliseconds') \gset
SELECT lockext.fenced_update('acct:short', :short, '{"step": 1}') AS write_while_live;
SELECT pg_sleep(0.1);
SELECT lockext.fenced_update('acct:short', :short, '{"step": 2}') AS late_write_stored;
-- Readers of a bound resource need a live lease of its lock.
SELECT fence_token AS reader FROM lockext.lock_acquire('ledger-short', 'reader', '1 minute', mode => 'shared') \gset
SELECT lockext.fenced_read('acct:short', :reader) AS read_by_live_reader;
SELECT lockext.fence_read('acct:short', :attacker);
-- A token is no secret (lockext.locks shows it to everyone): another role presenting the
-- holder's live grant is refused by a bound resource, writing or reading.
CREATE ROLE regress_thief IN ROLE lockext_user;
GRANT USAGE ON SCHEMA public TO regress_thief;
SET ROLE regress_thief;
SELECT lockext.fenced_update('acct:bound', (SELECT fence_token FROM lockext.locks WHERE lock_id = 'ledger-b'),
                             '{"by": "thief"}') AS thief_stored;
SELECT lockext.fence('acct:bound', (SELECT fence_token FROM lockext.locks WHERE lock_id = 'ledger-b'));
SELECT lockext.fence_read('acct:short', :reader);
RESET ROLE;
REVOKE USAGE ON SCHEMA public FROM regress_thief;
DROP ROLE regress_thief;
SELECT lockext.fenced_read('acct:bound', :holder) AS still_the_holders;
-- Unbinding, and who may bind: an operator only.
SELECT lockext.bind_resource('acct:short', NULL);
SELECT lock_id FROM lockext.resources WHERE resource_id = 'acct:short';
-- Binding to a lock clears a mark that any other lock's token left (anyone may raise an
-- unbound resource's mark): the lock's holder writes at once.
SELECT fence_token AS late FROM lockext.lock_acquire('late-bound-lock', 'h', '1 minute') \gset
SELECT fence_token AS early FROM lockext.lock_acquire('early-bird-lock', 'e', '1 minute') \gset
SELECT lockext.fenced_update('late-bound', :early, '{"by": "early bird"}') AS raised_before_binding;
SELECT lockext.bind_resource('late-bound', 'late-bound-lock');
SELECT lockext.fenced_update('late-bound', :late, '{"by": "holder"}') AS holder_writes;
CREATE ROLE regress_binder IN ROLE lockext_user;
SET ROLE regress_binder;
SELECT lockext.bind_resource('acct:other', 'mine');
RESET ROLE;
DROP ROLE regress_binder;
SELECT lockext.bind_resource(NULL, 'x');
