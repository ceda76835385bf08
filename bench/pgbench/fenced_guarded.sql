-- A write to a table guarded by lockext.fence_guard, carrying the writer's token in the
-- token column (:tok, the highest issued; equal to the row's, so accepted): one UPDATE.
\set id random(1, :keys)
UPDATE guarded.rows SET n = n + 1, fence_token = :tok WHERE id = :id;
