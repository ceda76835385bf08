-- The highest token a grant of lock id $1 ever had, on whichever node it was minted: each
-- grant writes it (record_high.sql), and the row moves with the lock id's shard. Read under
-- the newest snapshot, on the shard of this node (statements::with_relations).
-- $1 lock_id
SELECT high FROM lockext.lock_tokens WHERE lock_id = $1
