-- The reference of the declared way: the same transaction, statement for statement, without
-- lockext. The declared way needs a transaction of its own (lockext.declare_token holds for
-- the transaction), so its own cost is what separates it from this, not the round trips of
-- BEGIN, a SELECT and COMMIT that any caller of a transaction-scoped setting pays.
\set id random(1, :keys)
BEGIN;
SELECT :tok::bigint;
UPDATE guarded.plain SET n = n + 1 WHERE id = :id;
COMMIT;
