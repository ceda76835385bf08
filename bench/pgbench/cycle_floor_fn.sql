-- The floor as functions (bench/setup.sql): the floor's INSERT (durable) and DELETE (async),
-- each inside a SECURITY DEFINER function with a pinned search_path, as lockext's calls are.
\set id random(1, :keys)
SELECT coalesce(floor.acquire('lock:' || :id, 'bench:' || :client_id), 0) AS got \gset
\if :got
SELECT floor.release('lock:' || :id, 'bench:' || :client_id);
\endif
