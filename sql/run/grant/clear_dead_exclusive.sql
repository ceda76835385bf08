-- Before a shared lease or a permit: the dead exclusive lease of the lock id.
-- Dead leases are deleted before a grant that needs them dead, skipping any row that
-- someone holds locked: a renewal that got there first (it locks the row it extends). The
-- answer (all_gone) is whether every such row the statement's snapshot shows is gone, dead or not;
-- if not, the grant is refused as if the lease were live. Every row, not only the dead
-- ones: the look found them all dead, and one that is live now was renewed by a renewal
-- that committed since (a lease's own, or its keep-alive's), which must win. So a renewal and a conflicting grant can
-- never both succeed: whichever locks the row first wins, and a renewal that comes second
-- finds its row deleted. (Reading the dead rows without deleting them, as 0.2.0 did, let
-- a renewal paused after reading the clock revive a lease that a conflicting grant had
-- already seen expire.) A lease dead because its keep-alive expired is deleted only once
-- that keep-alive is ended (lockext.end_keepalive), for the same reason: the keep-alive's
-- renewal must not revive it, nor the keep-alive's other leases beside this grant.
-- The values of the grants it deletes (lockext.lease_values, src/election.rs) go in the
-- same statement: one probe of the values' key for each row deleted (a LATERAL subquery:
-- whatever the statistics say, no plan compares every value with every row), then a
-- delete by the values' row addresses (a TID scan).
-- A value row that another transaction holds locked (a setter's) is skipped, not waited
-- for, and so is one a setter changed after the statement's snapshot (its newest version
-- is not the one the delete sees): both are left to the reaper's sweep (reap_values.sql).
-- $1 lock_id, $2 owner, $3 role (the calling role), $4 ttl, $5 now (the call's clock),
-- $6 token (the new grant's), $7 lock_delay, $8 session_start (NULL: not session-bound),
-- $9 permits, $10 slot, $11 keepalive (NULL: none) (grant::Params, ACQUIRE_PARAMS: every
-- acquire statement takes all eleven)
WITH dead AS (SELECT lock_id
                FROM lockext.locks
               WHERE lock_id = $1 AND lockext.lease_expiry(expires_at, keepalive) + lock_delay <= $5
                 AND (keepalive IS NULL OR lockext.end_keepalive(keepalive, $5))
                 FOR UPDATE SKIP LOCKED),
     gone AS (DELETE FROM lockext.locks AS t
               USING dead
               WHERE t.lock_id = dead.lock_id
              RETURNING t.lock_id, t.fence_token),
     ended_values AS MATERIALIZED (
             SELECT x.ctid
               FROM gone AS r,
                    LATERAL (SELECT v.ctid FROM lockext.lease_values AS v
                              WHERE v.lock_id = r.lock_id AND v.fence_token = r.fence_token
                                FOR UPDATE SKIP LOCKED) AS x),
     values_gone AS (DELETE FROM lockext.lease_values AS v
                      WHERE v.ctid = ANY (ARRAY(SELECT ctid FROM ended_values)))
SELECT (SELECT count(*) FROM gone) =
       (SELECT count(*)
          FROM lockext.locks
         WHERE lock_id = $1) AS all_gone
