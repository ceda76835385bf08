-- The epoch row of an installation whose SQL is 0.3.0's (run under the newest snapshot):
-- it has a layout column and no `boot`.
-- No parameters.
SELECT epoch::bigint AS epoch, layout::bigint AS layout, NULL::bigint AS boot,
       xmin::text::bigint AS xmin, system_identifier
  FROM lockext.token_epoch
