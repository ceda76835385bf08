-- The highest token in lockext.locks (run under the newest snapshot): evidence of the
-- tokens this database's history handed out, which travels with dumps and pg_upgrade.
-- No parameters.
SELECT max(fence_token) AS highest FROM lockext.locks
