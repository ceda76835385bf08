-- Whether lockext's lease tables are distributed by Citus in this database (citus.rs). Run
-- only where Citus's catalog pg_dist_partition exists (the citus extension is installed).
SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                WHERE logicalrelid = 'lockext.locks'::pg_catalog.regclass) AS distributed
