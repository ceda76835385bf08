-- Fenced writes: a random one of the resources res:1..res:<keys>, with a valid token
-- (:tok, the highest issued; equal to the resource's high-water mark, so accepted).
\set id random(1, :keys)
SELECT lockext.fenced_update('res:' || :id, :tok, '{"n": 1}');
