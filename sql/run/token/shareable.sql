-- Whether this backend's adoption may be recorded for the server's other backends
-- (`adopted.rs`): asked after the generation is read and before the evidence is, under
-- the newest snapshot. Whatever changes the answer afterwards is DDL, or a PREPARE, which
-- raise the generation.
-- `as_made`: schema lockext is as the extension made it, so that every write of its
-- tables is one the permission hook sees as what it is: each of its tables, views and
-- other relations is the extension's (not one put in place of an evidence table by hand,
-- a view or a table made by CREATE TABLE AS, whose rows no statement writes); neither they
-- nor anything on them (an index, a trigger, a policy, a default, a constraint, a rule,
-- statistics) depend on an object that is neither built in nor the extension's (a
-- function, an operator, a type: a BEFORE trigger changes the row lockext's own statement
-- writes; an index or statistics expression, or an operator's function estimated on a
-- policy, runs while lockext's statement is planned, before its permission check); no
-- rule but a view's (an INSTEAD rule replaces lockext's statement); no row-level
-- security; no inheritance link (a write through the other relation names only that one).
-- `unprepared`: no transaction is prepared for two-phase commit, in any database: one
-- that wrote lockext's tables becomes visible at its COMMIT PREPARED, which raises no
-- generation.
-- No parameters.
WITH ext AS (
    SELECT e.oid, e.extnamespace FROM pg_extension e WHERE e.extname = 'lockext'
), rel AS (
    SELECT c.oid, c.relkind FROM pg_class c
     WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = 'lockext')
)
SELECT (SELECT extnamespace FROM ext) = (SELECT oid FROM pg_namespace WHERE nspname = 'lockext')
       AND NOT EXISTS (
           SELECT FROM rel
            WHERE rel.relkind IN ('r', 'p', 'v', 'm', 'f')
              AND NOT EXISTS (SELECT FROM pg_depend d
                               WHERE d.classid = 'pg_class'::regclass AND d.objid = rel.oid
                                 AND d.refclassid = 'pg_extension'::regclass
                                 AND d.refobjid = (SELECT oid FROM ext) AND d.deptype = 'e'))
       AND NOT EXISTS (
           SELECT FROM pg_depend d
            WHERE ((d.classid = 'pg_class'::regclass AND d.objid IN (SELECT oid FROM rel))
                   OR (d.classid, d.objid) IN (SELECT on_rel.classid, on_rel.objid
                                                 FROM pg_depend on_rel
                                                WHERE on_rel.refclassid = 'pg_class'::regclass
                                                  AND on_rel.refobjid IN (SELECT oid FROM rel)))
              AND d.deptype NOT IN ('e', 'i')
              AND d.refobjid >= 16384
              AND NOT (d.refclassid = 'pg_class'::regclass AND d.refobjid IN (SELECT oid FROM rel))
              AND NOT (d.refclassid = 'pg_namespace'::regclass
                       AND d.refobjid = (SELECT extnamespace FROM ext))
              AND NOT EXISTS (SELECT FROM pg_depend m
                               WHERE m.classid = d.refclassid AND m.objid = d.refobjid
                                 AND m.refclassid = 'pg_extension'::regclass
                                 AND m.refobjid = (SELECT oid FROM ext) AND m.deptype = 'e'))
       AND NOT EXISTS (SELECT FROM pg_class c
                        WHERE c.oid IN (SELECT oid FROM rel) AND c.relrowsecurity)
       AND NOT EXISTS (SELECT FROM pg_rewrite r
                        WHERE r.ev_class IN (SELECT oid FROM rel) AND r.rulename <> '_RETURN')
       AND NOT EXISTS (SELECT FROM pg_inherits i
                        WHERE i.inhrelid IN (SELECT oid FROM rel)
                           OR i.inhparent IN (SELECT oid FROM rel)) AS as_made,
       NOT EXISTS (SELECT FROM pg_prepared_xact()) AS unprepared
