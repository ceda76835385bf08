-- Bad input raises an error with a documented SQLSTATE and changes nothing.
-- try() shows "SQLSTATE: message" for a statement, in a subtransaction.
CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- The token before: of a lease taken and given back at once.
SELECT fence_token AS token_before FROM lockext.lock_acquire('errors:probe', 'w', '1 minute') \gset
SELECT lockext.lock_release('errors:probe', 'w', :token_before);
SELECT count(*) AS leases_before FROM lockext.locks \gset
SELECT count(*) AS resources_before FROM lockext.resources \gset

-- 22004 null_value_not_allowed: NULL where a value is required.
SELECT pg_temp.try($$SELECT lockext.lock_acquire(NULL, 'w', '1 minute')$$);
SELECT pg_temp.try($$SELECT lockext.lock_acquire('l', NULL, '1 minute')$$);
SELECT pg_temp.try($$SELECT lockext.lock_acquire('l', 'w', NULL)$$);
SELECT pg_temp.try($$SELECT lockext.lock_renew('l', NULL, '1 minute')$$);
SELECT pg_temp.try($$SELECT lockext.lock_release(NULL, 'w')$$);
SELECT pg_temp.try($$SELECT lockext.fenced_update(NULL, 1, '{}')$$);
SELECT pg_temp.try($$SELECT lockext.fenced_update('r', NULL, '{}')$$);
SELECT pg_temp.try($$SELECT lockext.fenced_update('r', 1, NULL)$$);

-- 22023 invalid_parameter_value: empty ids, ttl out of (0, 1 day], tokens below 1,
-- tokens never issued.
SELECT pg_temp.try($$SELECT lockext.lock_acquire('', 'w', '1 minute')$$);
SELECT pg_temp.try($$SELECT * FROM lockext.token_parts(-1)$$);
SELECT pg_temp.try($$SELECT * FROM lockext.token_parts(0)$$);
SELECT pg_temp.try($$SELECT lockext.lock_acquire('l', '', '1 minute')$$);
SELECT pg_temp.try($$SELECT lockext.lock_acquire('l', 'w', '0 seconds')$$);
SELECT pg_temp.try($$SELECT lockext.lock_acquire('l', 'w', '-5 seconds')$$);
SELECT pg_temp.try($$SELECT lockext.lock_acquire('l', 'w', '1 day 1 second')$$);
SELECT pg_temp.try($$SELECT lockext.lock_acquire('l', 'w', '1 month')$$);
SELECT pg_temp.try($$SELECT lockext.lock_renew('l', 'w', '0 seconds')$$);
SELECT pg_temp.try($$SELECT lockext.lock_renew('l', 'w', '1 minute', 0)$$);
SELECT pg_temp.try($$SELECT lockext.lock_release('l', 'w', -1)$$);
SELECT pg_temp.try($$SELECT lockext.fenced_update('', 1, '{}')$$);
SELECT pg_temp.try($$SELECT lockext.fenced_update('r', 0, '{}')$$);
SELECT pg_temp.try($$SELECT lockext.fenced_update('r', 9223372036854775807, '{}')$$);

-- 22001 string_data_right_truncation: ids over 256 bytes.
SELECT pg_temp.try(format($$SELECT lockext.lock_acquire(%L, 'w', '1 minute')$$, repeat('x', 257)));
SELECT pg_temp.try(format($$SELECT lockext.lock_acquire('l', %L, '1 minute')$$, repeat('é', 129)));
SELECT pg_temp.try(format($$SELECT lockext.fenced_update(%L, 1, '{}')$$, repeat('x', 257)));

-- The limits themselves are accepted.
SELECT pg_temp.try(format($$SELECT lockext.lock_acquire(%L, %L, '1 day')$$, repeat('x', 256), repeat('y', 256)));

-- Nothing was written by the failures: one lease and one token (the last call's).
SELECT count(*) - :leases_before AS new_leases FROM lockext.locks;
SELECT count(*) - :resources_before AS new_resources FROM lockext.resources;
SELECT max(fence_token) - :token_before AS tokens_minted FROM lockext.locks;

-- Errors carry a hint where there is something to do about them.
\set VERBOSITY default
SELECT lockext.lock_acquire('l', 'w', '2 days');
