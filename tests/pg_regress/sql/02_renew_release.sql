-- lock_renew(lock_id, owner, ttl [, fence_token]) moves a live lease's expiry to now + ttl
-- and returns it; NULL means the caller does not hold a live lease (stop working).
-- lock_release(lock_id, owner [, fence_token]) ends the lease; true means the caller
-- still held it, false that it held nothing.

SELECT fence_token AS t FROM lockext.lock_acquire('job', 'w1', '1 second') \gset
SELECT lockext.lock_renew('job', 'w1', '1 minute') - clock_timestamp() > interval '59 seconds' AS renewed;
SELECT expires_at - clock_timestamp() > interval '59 seconds' AS stored
  FROM lockext.locks WHERE lock_id = 'job';

-- Only the holder renews: another owner, another token, another lock get NULL.
SELECT lockext.lock_renew('job', 'w2', '1 minute') AS other_owner;
SELECT lockext.lock_renew('job', 'w1', '1 minute', :t + 1) AS other_token;
SELECT lockext.lock_renew('job', 'w1', '1 minute', :t) IS NOT NULL AS own_token;
SELECT lockext.lock_renew('no-such-lock', 'w1', '1 minute') AS no_lease;

-- A lease that has expired cannot be renewed: its holder must acquire again.
SELECT fence_token AS e FROM lockext.lock_acquire('short', 'w1', '10 milliseconds') \gset
SELECT pg_sleep(0.05);
SELECT lockext.lock_renew('short', 'w1', '1 minute') AS expired;

-- Release: wrong owner or token change nothing (and take no transaction id).
BEGIN;
SELECT lockext.lock_release('job', 'w2') AS other_owner;
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_transaction_id;
COMMIT;
SELECT lockext.lock_release('job', 'w1', :t + 1) AS other_token;
SELECT count(*) AS still_held FROM lockext.locks WHERE lock_id = 'job';
SELECT lockext.lock_release('job', 'w1', :t) AS released;
SELECT lockext.lock_release('job', 'w1') AS released_twice;
SELECT owner FROM lockext.lock_acquire('job', 'w2', '1 minute');

-- Releasing an expired lease returns false (it was not held any more) and clears its row.
SELECT lockext.lock_release('short', 'w1') AS expired_release;
SELECT count(*) AS rows_left FROM lockext.locks WHERE lock_id = 'short';

-- A renewal runs in a subtransaction, kept when it renewed, rolled back when it found
-- nothing, so that a refused call keeps no row lock while its transaction goes on (a DO
-- block, a function, a statement that calls something after it: held_row.rs shows why).
-- An autocommit renewal that renews so takes two transaction ids, its own and its
-- subtransaction's.
SELECT pg_current_xact_id() AS x0 \gset
SELECT lockext.lock_renew('job', 'w2', '1 minute') IS NOT NULL AS renewed;
SELECT pg_current_xact_id()::text::bigint - :'x0'::text::bigint AS ids_since;  -- the renewal's two, this one's
