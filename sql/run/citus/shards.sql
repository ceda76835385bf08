-- The shard of each of lockext's distributed tables that holds lock id $1, by relation name
-- (schema-qualified, quoted as needed): the tables are colocated, so each is the shard of
-- the same range of hash values, on the same node. Citus names a shard after its table
-- and the shard's id (lockext.locks_102008), which the statements then name instead of
-- the table (statements::with_relations).
-- $1 lock_id
SELECT s.shard,
       shard_name('lockext.locks'::regclass, s.shard) AS locks,
       shard_name('lockext.shared_leases'::regclass,
                  get_shard_id_for_distribution_column('lockext.shared_leases', $1)) AS shared_leases,
       shard_name('lockext.lease_values'::regclass,
                  get_shard_id_for_distribution_column('lockext.lease_values', $1)) AS lease_values,
       shard_name('lockext.lock_tokens'::regclass,
                  get_shard_id_for_distribution_column('lockext.lock_tokens', $1)) AS lock_tokens
  FROM (SELECT get_shard_id_for_distribution_column('lockext.locks', $1) AS shard) AS s
