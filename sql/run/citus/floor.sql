-- The highest token any node could have handed out before the lease tables were
-- distributed (sql/citus.sql): every grant starts above it. Read on this node's copy of
-- the reference table (statements::with_relations).
SELECT floor FROM lockext.token_floor
