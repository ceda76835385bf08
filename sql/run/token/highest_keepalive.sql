-- The highest token in lockext.keepalives (run under the newest snapshot): evidence of the
-- tokens this database's history handed out, which travels with dumps and pg_upgrade.
-- No parameters.
SELECT max(keepalive) AS highest FROM lockext.keepalives
