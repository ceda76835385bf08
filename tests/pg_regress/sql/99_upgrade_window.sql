-- The window between installing a new package and ALTER EXTENSION lockext UPDATE: this
-- library serving a database whose SQL objects are still 0.1.0's, then 0.2.0's, then the
-- update, with a lease, a shared lease, a fence mark and a guarded row in place. A call
-- that would mint a token is refused (55000, with the command to run); renew, release,
-- fencing, lock_check and token_parts keep the meaning the older SQL gave them; the
-- update keeps every lease and mark. (The rows are written as 0.1.0 and 0.2.0 wrote them:
-- their libraries are not installed here. tests/cluster/tests/upgrade.rs takes them with
-- 0.2.0's own library, and restarts the server onto this one.)
\set VERBOSITY default
SET client_min_messages = warning;
DROP EXTENSION lockext CASCADE;
RESET client_min_messages;
-- Every entry point 0.1.0's script names is in this library, or this would fail.
CREATE EXTENSION lockext VERSION '0.1.0';

-- What a call raised: its SQLSTATE, message and hint (or 'ok'), in a subtransaction.
CREATE FUNCTION pg_temp.outcome(q text) RETURNS TABLE (sqlstate text, message text, hint text)
LANGUAGE plpgsql AS $$
DECLARE
    h text;
BEGIN
    EXECUTE q;
    RETURN QUERY SELECT 'ok', NULL::text, NULL::text;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS h = PG_EXCEPTION_HINT;
    RETURN QUERY SELECT SQLSTATE::text, SQLERRM, h;
END $$;

CREATE ROLE regress_w_holder IN ROLE lockext_user;
CREATE ROLE regress_w_other IN ROLE lockext_user;
CREATE ROLE regress_w_admin IN ROLE lockext_admin;

-- As 0.1.0 left it: epoch 4096 (era 1) recorded, 41 tokens handed out, the last one held
-- by regress_w_holder, another lease long expired, a resource and a guarded row fenced
-- with the last token.
INSERT INTO lockext.token_epoch
SELECT true, 4096, system_identifier, timeline_id, (SELECT oid FROM pg_database WHERE datname = current_database()), 0, now()
  FROM pg_control_system(), pg_control_checkpoint();
SELECT setval('lockext.fence_token_seq', 41) AS counter;
SELECT (4096::bigint << 43) | 41 AS t \gset
INSERT INTO lockext.locks VALUES
    ('w-lease', 'holder-1', :t, 'regress_w_holder'::regrole, now(), now() + interval '1 hour'),
    ('w-dead', 'holder-0', :t - 1, 'regress_w_holder'::regrole, now() - interval '2 hours', now() - interval '1 hour');
INSERT INTO lockext.resources VALUES ('w-res', :t, '{"v": 1}', now());
CREATE TABLE w_jobs (id int PRIMARY KEY, state text, fence_token bigint);
CREATE TRIGGER w_jobs_fence BEFORE INSERT OR UPDATE ON w_jobs
    FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
GRANT ALL ON w_jobs TO regress_w_holder;

-- ---- SQL at 0.1.0 -------------------------------------------------------------------
-- A grant is refused, with what to do; nothing is minted.
\x on
SELECT * FROM pg_temp.outcome($$SELECT lockext.lock_acquire('w-new', 'holder-2', '1 hour')$$);
\x off
SET ROLE regress_w_holder;
SELECT sqlstate, hint FROM pg_temp.outcome($$SELECT lockext.lock_acquire('w-lease', 'holder-1', '1 hour')$$);
SELECT sqlstate FROM pg_temp.outcome($$SELECT lockext.lock_acquire('w-dead', 'holder-3', '1 hour')$$);
RESET ROLE;
SELECT last_value AS counter_unchanged FROM lockext.fence_token_seq;

-- The holder renews its lease, with its token or without; another role cannot, and an
-- administrator's renew of another role's lease is refused rather than answered.
SET ROLE regress_w_holder;
SELECT lockext.lock_renew('w-lease', 'holder-1', '2 hours', :t) > now() + interval '1 hour' AS renewed_with_token;
SELECT lockext.lock_renew('w-lease', 'holder-1', '2 hours') IS NOT NULL AS renewed;
SELECT lockext.lock_renew('w-lease', 'holder-1', '2 hours', :t - 1) IS NULL AS not_with_another_token;
SELECT lockext.lock_renew('w-dead', 'holder-0', '1 hour') IS NULL AS not_once_expired;
RESET ROLE;
SET ROLE regress_w_other;
SELECT lockext.lock_renew('w-lease', 'holder-1', '2 hours', :t) IS NULL AS not_for_another_role;
SELECT lockext.lock_release('w-lease', 'holder-1', :t) AS released_by_another_role;
RESET ROLE;
SET ROLE regress_w_admin;
SELECT sqlstate, message FROM pg_temp.outcome($$SELECT lockext.lock_release('w-lease', 'holder-1')$$);
RESET ROLE;
SELECT lock_id, owner, fence_token = :t AS same_token FROM lockext.locks ORDER BY lock_id;

-- lock_check says whether the grant is live.
SELECT lockext.lock_check('w-lease', :t) AS live, lockext.lock_check('w-lease', :t - 1) AS other_token,
       lockext.lock_check('w-dead', :t - 1) AS expired;
-- It reads the newest snapshot, which a parallel worker cannot take; 0.1.0 declared it
-- PARALLEL SAFE, so a parallel plan can run it there: refused, not answered from an older
-- snapshot.
-- (force_parallel_mode in 15 is debug_parallel_query from 16 on.)
SELECT set_config(name, 'on', false) AS parallel_forced FROM pg_settings
 WHERE name IN ('force_parallel_mode', 'debug_parallel_query');
SELECT lockext.lock_check('w-lease', :t);
SELECT set_config(name, 'off', false) AS parallel_forced FROM pg_settings
 WHERE name IN ('force_parallel_mode', 'debug_parallel_query');

-- The mark refuses an older token, in every way in; the holder's token is accepted.
SET ROLE regress_w_holder;
SELECT lockext.fenced_update('w-res', :t - 1, '{"v": 0}') AS older_token_stored;
SELECT sqlstate, message FROM pg_temp.outcome(format('SELECT lockext.fence(%L, %s)', 'w-res', :t - 1));
SELECT lockext.fenced_update('w-res', :t, '{"v": 2}') AS holder_stored;
SELECT lockext.fence('w-res', :t);
INSERT INTO w_jobs VALUES (1, 'new', :t);
SELECT sqlstate, message FROM pg_temp.outcome(format('UPDATE w_jobs SET state = %L, fence_token = %s', 'stale', :t - 1));
UPDATE w_jobs SET state = 'running', fence_token = :t;
RESET ROLE;
SELECT resource_id, fence_token = :t AS mark_kept, data FROM lockext.resources;
-- A token above any that 0.1.0 or 0.2.0 could have handed out is refused as never issued:
-- the last raise of the era after the recorded one (era 2), over the counter. The update
-- starts above that (99_upgrade).
SELECT ((((2 << 12) | 4095)::bigint << 43) | 41) AS bound \gset
SELECT sqlstate FROM pg_temp.outcome(format('SELECT lockext.check_token(%s)', :bound));
SELECT sqlstate, message FROM pg_temp.outcome(format('SELECT lockext.check_token(%s)', :bound + 1));
-- token_parts keeps 0.1.0's columns, and their meaning.
SELECT * FROM lockext.token_parts(:t);

-- ---- SQL at 0.2.0 -------------------------------------------------------------------
ALTER EXTENSION lockext UPDATE TO '0.2.0';
-- A 0.2.0 shared lease, as 0.2.0 wrote it.
INSERT INTO lockext.shared_leases (lock_id, owner, fence_token, holder_role, acquired_at, expires_at)
VALUES ('w-shared', 'reader-1', :t - 2, 'regress_w_holder'::regrole, now(), now() + interval '1 hour');
-- Grants are refused at once, waiting or not, one lock or a set.
SET ROLE regress_w_holder;
SELECT sqlstate, hint FROM pg_temp.outcome($$SELECT lockext.lock_acquire('w-new', 'holder-2', '1 hour', wait => '10 seconds')$$);
SELECT sqlstate FROM pg_temp.outcome($$SELECT lockext.lock_acquire('w-new', 'holder-2', '1 hour', mode => 'shared')$$);
SELECT sqlstate FROM pg_temp.outcome($$SELECT * FROM lockext.lock_acquire_all(ARRAY['w-a', 'w-b'], 'holder-2', '1 hour')$$);
-- Renewals are counted, as 0.2.0 counts them, in both tables.
SELECT lockext.lock_renew('w-lease', 'holder-1', '2 hours', :t) IS NOT NULL AS renewed,
       lockext.lock_renew('w-shared', 'reader-1', '2 hours', :t - 2) IS NOT NULL AS shared_renewed;
SELECT lock_id, mode, owner, role, renewals FROM lockext.holders ORDER BY lock_id;
-- Readers are fenced too.
SELECT sqlstate, message FROM pg_temp.outcome(format('SELECT lockext.fence_read(%L, %s)', 'w-res', :t - 1));
SELECT lockext.fenced_read('w-res', :t);
RESET ROLE;
SET ROLE regress_w_other;
SELECT lockext.lock_release_all(ARRAY['w-lease', 'w-shared'], 'holder-1') AS released_by_another_role;
RESET ROLE;
SET ROLE regress_w_admin;
SELECT sqlstate FROM pg_temp.outcome($$SELECT lockext.lock_renew('w-shared', 'reader-1', '1 hour')$$);
RESET ROLE;
SELECT count(*) > 0 AS counters FROM lockext.stats;
SELECT count(*) AS waiting FROM lockext.waiters;

-- ---- the update ---------------------------------------------------------------------
ALTER EXTENSION lockext UPDATE;
SELECT extversion AS updated_to FROM pg_extension WHERE extname = 'lockext';
-- The leases are still held: renewable and releasable by their holder with its token,
-- refused to another role, and no one else can take them.
SET ROLE regress_w_holder;
SELECT lockext.lock_renew('w-lease', 'holder-1', '1 hour', :t) IS NOT NULL AS renewed_after_update;
RESET ROLE;
SET ROLE regress_w_other;
SELECT lockext.lock_renew('w-lease', 'holder-1', '1 hour', :t) IS NULL AS not_for_another_role,
       lockext.lock_release('w-lease', 'holder-1', :t) AS released_by_another_role;
SELECT fence_token IS NULL AS not_available FROM lockext.lock_acquire('w-lease', 'other-1', '1 hour');
SELECT fence_token IS NULL AS not_available FROM lockext.lock_acquire('w-shared', 'writer-1', '1 hour');
-- The mark still refuses an older token.
SELECT sqlstate, message FROM pg_temp.outcome(format('SELECT lockext.fence(%L, %s)', 'w-res', :t - 1));
-- A new grant's token is above every token handed out before.
SELECT fence_token > :bound AS above_the_bound FROM lockext.lock_acquire('w-new', 'other-1', '1 hour');
RESET ROLE;
SET ROLE regress_w_holder;
SELECT sqlstate, message FROM pg_temp.outcome(format('UPDATE w_jobs SET state = %L, fence_token = %s', 'stale', :t - 1));
SELECT lockext.lock_release('w-lease', 'holder-1', :t) AS released, lockext.lock_release('w-shared', 'reader-1', :t - 2) AS shared_released;
-- The guarded row takes the holder's writes, as 0.3.0 fences them.
BEGIN;
SELECT lockext.declare_token(:t);
UPDATE w_jobs SET state = 'done';
COMMIT;
RESET ROLE;
SELECT id, state, fence_token = :t AS same_token FROM w_jobs;
-- Now the administrator may act on another role's lease, through 0.3.0's SQL.
SET ROLE regress_w_admin;
SELECT lockext.lock_release('w-new', 'other-1') AS admin_released;
RESET ROLE;
SELECT * FROM lockext.token_parts(:t);

-- Back to a fresh installation for whatever comes next.
DROP TABLE w_jobs;
SET client_min_messages = warning;
DROP EXTENSION lockext CASCADE;
RESET client_min_messages;
CREATE EXTENSION lockext;
DROP ROLE regress_w_holder;
DROP ROLE regress_w_other;
DROP ROLE regress_w_admin;
