-- lock_release: deletes the values of the grant the release just deleted (release_lock.sql
-- and release_shared_lease.sql say when there are some), found by one probe of the values'
-- key and deleted by their row addresses (a TID scan).
-- A value row that another transaction holds locked (a setter's) is skipped, not waited
-- for, and so is one a setter changed after this statement's snapshot (its newest version
-- is not the one the delete sees): both are left to the reaper's sweep (reap_values.sql).
-- $1 lock_id, $2 fence_token (the ended grant's)
DELETE FROM lockext.lease_values AS v
 WHERE v.ctid = ANY (ARRAY(SELECT ctid FROM lockext.lease_values
                            WHERE lock_id = $1 AND fence_token = $2
                              FOR UPDATE SKIP LOCKED))
