-- lockext 0.3.0 -> 0.4.0
\echo Use "ALTER EXTENSION lockext UPDATE" to load this file. \quit

-- Tokens come from the cluster's token ledger (src/ledger.rs), carried by the WAL, instead
-- of each database's sequence under an era from a file beside the data directory. The
-- library adopts this database's history on its own (token.rs): nothing to move here.

-- 0.1.0 and 0.2.0 dumps carry a `boot` column in the epoch row: the row then restores,
-- and is evidence of the tokens they handed out.
ALTER TABLE lockext.token_epoch ADD COLUMN boot bigint;
