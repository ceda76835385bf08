-- Keep-alives' reference (bench/keepalive.sh): renew leases kr:1, kr:2, ... one autocommit
-- lock_renew each, as a client holding many leases without a keep-alive must. A pgbench
-- variable keeps its value from one transaction to the next, so one client run with
-- -D n=0 -t <leases> renews each lease once.
\set n :n + 1
SELECT lockext.lock_renew('kr:' || :n, 'bench', '1 hour');
