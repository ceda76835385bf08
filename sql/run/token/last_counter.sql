-- The token sequence's last value (0: never used).
-- No parameters.
SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM lockext.fence_token_seq
