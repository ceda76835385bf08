-- The epoch row (run under the newest snapshot), with its xmin: whether this transaction
-- wrote it.
-- No parameters.
SELECT epoch::bigint AS epoch, layout::bigint AS layout, xmin::text::bigint AS xmin,
       system_identifier
  FROM lockext.token_epoch
