-- A write to a table guarded by lockext.fence_guard that leaves the token column out and
-- declares the writer's token for its transaction first (README: lockext.declare_token).
\set id random(1, :keys)
BEGIN;
SELECT lockext.declare_token(:tok);
UPDATE guarded.rows SET n = n + 1 WHERE id = :id;
COMMIT;
