-- The token sequence: what it has handed out (0: nothing yet), and its MAXVALUE.
-- $1 the sequence's oid (lockext.fence_token_seq)
SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END AS counter, q.seqmax AS max
  FROM lockext.fence_token_seq s, pg_catalog.pg_sequence q
 WHERE q.seqrelid = $1
