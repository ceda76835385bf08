-- The floor as functions, both commits asynchronous (the reference of epoch mode's call cost).
\set id random(1, :keys)
SELECT floor.acquire_async('lock:' || :id, 'bench:' || :client_id) AS got \gset
\if :got
SELECT floor.release('lock:' || :id, 'bench:' || :client_id);
\endif
