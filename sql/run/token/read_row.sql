-- The epoch row (run under the newest snapshot), with its xmin: whether this transaction
-- wrote it. `boot` is set only in a row of 0.1.0 or 0.2.0 (restored from their dump): such
-- a row is of 0.2.0's layout, whatever its layout column defaulted to.
-- No parameters.
SELECT epoch::bigint AS epoch, layout::bigint AS layout, boot, xmin::text::bigint AS xmin,
       system_identifier
  FROM lockext.token_epoch
