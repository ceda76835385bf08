-- What the older versions can have handed out: the epoch row, and the counter (run under
-- the newest snapshot, so that a token another backend's older library minted under a new
-- epoch is known the moment it is committed).
-- No parameters.
SELECT (SELECT epoch::bigint FROM lockext.token_epoch) AS epoch, is_called, last_value
  FROM lockext.fence_token_seq
