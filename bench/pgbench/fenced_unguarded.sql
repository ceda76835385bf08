-- The guarded workloads' reference: the same UPDATE of the same table without the trigger.
\set id random(1, :keys)
UPDATE guarded.plain SET n = n + 1, fence_token = :tok WHERE id = :id;
