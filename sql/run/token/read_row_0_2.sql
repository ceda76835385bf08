-- The epoch row of an installation whose SQL is older than 0.3.0 (run under the newest
-- snapshot): it has no layout column, and its epoch is 0.2.0's (layout 1).
-- No parameters.
SELECT epoch::bigint AS epoch, 1::bigint AS layout, boot, xmin::text::bigint AS xmin,
       system_identifier
  FROM lockext.token_epoch
