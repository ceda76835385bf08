-- The last value of the token sequence, which lockext 0.1.0 to 0.3.0 counted tokens with
-- (0: never used). Without preload this library mints nothing, but an older library's
-- sessions may still mint with it (between installing a package and a restart): fence
-- checks must know those tokens as issued.
-- No parameters.
SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS last FROM lockext.fence_token_seq
