-- Whether this adoption may be shared with the server's other backends (`adopted.rs`),
-- asked after the generation is read and before the evidence is (under the newest
-- snapshot): no transaction is prepared for two-phase commit, in any database (one that
-- wrote lockext's tables becomes visible at its COMMIT PREPARED, which raises no
-- generation), and no relation of schema lockext inherits or is inherited from (a write
-- through the other relation names only that one, which the permission hook does not see
-- as lockext's).
-- No parameters.
SELECT NOT EXISTS (SELECT FROM pg_prepared_xact())
       AND NOT EXISTS (SELECT FROM pg_inherits i
                         JOIN pg_class c ON c.oid IN (i.inhrelid, i.inhparent)
                        WHERE c.relnamespace = (SELECT oid FROM pg_namespace
                                                 WHERE nspname = 'lockext')) AS shareable
