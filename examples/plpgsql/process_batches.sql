-- lockext from a stored procedure: acquire, commit, then work in several transactions that
-- each start with lockext.fence, renewing as it goes, and release at the end.
--
--   psql -f examples/plpgsql/process_batches.sql
--   CALL public.process_batches('nightly-ledger', 'host-a:4242:run-17', 'ledger', 10);
--
-- CALL it outside an explicit transaction block (autocommit), or its COMMITs fail (2D000).
-- Through PgBouncer in transaction pooling mode the whole CALL holds one server connection,
-- as any statement does; lockext keeps no session state across its transactions.
--
-- Why each batch starts with lockext.fence(resource, token): if this procedure stalls past its
-- lease (a slow batch, a paused VM, a lock wait) and another holder takes the lock and writes,
-- the stale batch's fence raises 55L01 and its transaction rolls back with everything it wrote.
-- The batches committed before stay (they were written while the lease was ours); nothing is
-- written after. The renewal at the end of each batch notices a lease that ended while nobody
-- wrote yet, and stops the procedure as well.
--
-- The demonstration tables: one row per committed batch, and the protected state.

CREATE TABLE IF NOT EXISTS public.batch_log (
    resource_id text        NOT NULL,
    batch       int         NOT NULL,
    owner       text        NOT NULL,
    fence_token bigint      NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (resource_id, fence_token, batch)
);

CREATE TABLE IF NOT EXISTS public.batch_state (
    resource_id text PRIMARY KEY,
    batches     int    NOT NULL,
    owner       text   NOT NULL,
    fence_token bigint NOT NULL
);

CREATE OR REPLACE PROCEDURE public.process_batches(
    p_lock_id     text,
    p_owner       text,           -- unique per holder: host:pid:run
    p_resource_id text,
    p_batches     int,
    p_ttl         interval DEFAULT '30 seconds',  -- longer than one batch takes
    p_wait        interval DEFAULT '0',           -- how long to wait for the lock
    p_pause_after int      DEFAULT NULL,          -- testing: stall after this batch ...
    p_pause       interval DEFAULT '0'            -- ... for this long (between transactions)
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_token bigint;
BEGIN
    -- 1. Acquire in a transaction of its own and COMMIT it: a grant is transactional, and
    --    this makes it visible to others and durable before any work relies on it.
    SELECT fence_token INTO v_token
      FROM lockext.lock_acquire(p_lock_id, p_owner, p_ttl, wait => p_wait);
    IF v_token IS NULL THEN
        RAISE EXCEPTION 'lock "%" is held by another owner', p_lock_id
            USING ERRCODE = 'lock_not_available';
    END IF;
    COMMIT;

    -- 2. One transaction per batch, each starting with the fence.
    FOR i IN 1 .. p_batches LOOP
        PERFORM lockext.fence(p_resource_id, v_token);      -- 55L01 if a newer holder wrote

        INSERT INTO public.batch_log (resource_id, batch, owner, fence_token)
        VALUES (p_resource_id, i, p_owner, v_token);
        INSERT INTO public.batch_state AS s (resource_id, batches, owner, fence_token)
        VALUES (p_resource_id, 1, p_owner, v_token)
        ON CONFLICT (resource_id) DO UPDATE
            SET batches = s.batches + 1, owner = EXCLUDED.owner, fence_token = EXCLUDED.fence_token;

        -- Renew with the batch: NULL means the lease already ended (expired, taken over or
        -- released by an operator): stop, and let this batch roll back with the error.
        IF lockext.lock_renew(p_lock_id, p_owner, p_ttl, v_token) IS NULL THEN
            RAISE EXCEPTION 'lease on "%" (fence token %) was lost before batch % committed',
                p_lock_id, v_token, i
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Acquire the lock again and resume from the last committed batch.';
        END IF;
        COMMIT;

        IF i = p_pause_after THEN
            PERFORM pg_sleep_for(p_pause);  -- a stall between two transactions
        END IF;
    END LOOP;

    -- 3. Release. (It returns false if the lease ended on its own meanwhile; no batch was
    --    accepted after a newer holder's write all the same: the fences see to that.)
    PERFORM lockext.lock_release(p_lock_id, p_owner, v_token);
    COMMIT;
END;
$$;
