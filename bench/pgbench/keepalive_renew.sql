-- Keep-alives (bench/keepalive.sh): one lock_keepalive_renew of keep-alive :ka, which extends
-- every lease attached to it, however many there are.
SELECT lockext.lock_keepalive_renew(:ka);
