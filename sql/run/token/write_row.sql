-- Writes the epoch row: inserts it, or moves it to a later epoch or to another layout.
-- $1 epoch, $2 layout, $3 system_identifier, $4 timeline, $5 database (oid)
INSERT INTO lockext.token_epoch AS t
       (singleton, epoch, layout, system_identifier, timeline, database, raised_at)
VALUES (true, $1, $2, $3, $4, $5, clock_timestamp())
    ON CONFLICT (singleton) DO UPDATE
   SET epoch = EXCLUDED.epoch, layout = EXCLUDED.layout,
       system_identifier = EXCLUDED.system_identifier, timeline = EXCLUDED.timeline,
       database = EXCLUDED.database, raised_at = EXCLUDED.raised_at
 WHERE t.epoch < EXCLUDED.epoch OR t.layout <> EXCLUDED.layout
