//! SQL fragments that several modules' statements share, as macros that `concat!` into
//! the statements' text at compile time: what a grant sets and returns, the deletion of
//! dead or session-ended leases, and the events sent for them. Parameters follow the
//! statements that use them (`ACQUIRE_PARAMS` in `grant.rs` for the grant fragments).

/// The rows of CTE `reaped` (lock_id, fence_token of each lease ended), each with an event
/// for LISTENers when parameter `$notify` (lockext.notify) is true.
macro_rules! with_events {
    ($event:literal, $notify:literal, $($ctes:tt)*) => {
        concat!(
            "WITH ", $($ctes)*, " \
             SELECT lock_id, \
                    CASE WHEN ", $notify, " THEN pg_catalog.pg_notify('lockext', pg_catalog.json_build_object( \
                        'event', '", $event, "', 'lock_id', lock_id, 'fence_token', fence_token, \
                        'previous_fence_token', NULL)::text) END \
               FROM reaped"
        )
    };
}
pub(crate) use with_events;

/// A CTE `$name` deleting the session-bound leases of `$table` whose rows `s` match
/// `$which`, `$limit` at most; it returns lock_id and fence_token of each.
macro_rules! end_sessions_in {
    ($name:literal, $table:literal, $which:expr, $limit:literal) => {
        concat!(
            $name,
            " AS (DELETE FROM ",
            $table,
            " AS l \
                    USING (SELECT lock_id, owner FROM ",
            $table,
            " AS s \
                            WHERE s.session_start IS NOT NULL AND ",
            $which,
            " ",
            $limit,
            " \
                              FOR UPDATE SKIP LOCKED) AS c \
                    WHERE l.lock_id = c.lock_id AND l.owner = c.owner \
                   RETURNING l.lock_id, l.fence_token)"
        )
    };
}
pub(crate) use end_sessions_in;

/// Deletes session-bound leases from both lease tables: those of rows `s` matching `$which`,
/// `$limit` of each at most: CTEs that end with `reaped` (lock_id, fence_token of each).
macro_rules! end_sessions_sql {
    ($which:literal, $limit:literal) => {
        concat!(
            $crate::sql::end_sessions_in!("x", "lockext.locks", $which, $limit),
            ", ",
            $crate::sql::end_sessions_in!("sh", "lockext.shared_leases", $which, $limit),
            ", reaped AS (SELECT lock_id, fence_token FROM x \
                          UNION ALL SELECT lock_id, fence_token FROM sh)"
        )
    };
}
pub(crate) use end_sessions_sql;

/// What an acquire sets on the lease it grants, in either lease table; `c` is the row it
/// took, with `same_grant` when that is the caller's own live lease.
macro_rules! grant_sets {
    () => {
        concat!(
            "owner = $2, holder_role = $3, \
             fence_token = CASE WHEN c.same_grant THEN l.fence_token ELSE $6 END, \
             acquired_at = CASE WHEN c.same_grant THEN l.acquired_at ELSE $5 END, \
             expires_at = $5 + $4, \
             renewals = CASE WHEN c.same_grant THEN l.renewals + 1 ELSE 0 END, \
             lock_delay = $7, session_start = $8, \
             taker_pid = pg_backend_pid(), \
             application_name = current_setting('application_name'), \
             client_addr = inet_client_addr()"
        )
    };
}
pub(crate) use grant_sets;

/// What an acquire statement returns, as plain columns (`Granted`, read by name): the
/// grant's, then `minted` (whether it minted a token) and `previous_token` (the token it
/// replaced, a take-over's).
macro_rules! grant_returning {
    () => {
        " RETURNING l.lock_id, l.owner, l.fence_token, l.acquired_at, l.expires_at, "
    };
}
pub(crate) use grant_returning;

/// Dead leases of another kind, or in the slot a permit taker claimed, are deleted before
/// a grant that needs them dead, skipping any row that someone holds locked: a renewal that
/// got there first (it locks the row it extends). The answer is whether every dead row the
/// statement's snapshot shows is gone; if not, the grant is refused as if the lease were
/// live. So a renewal and a conflicting grant can never both succeed: whichever locks the
/// row first wins, and a renewal that comes second finds its row deleted. (Reading the
/// dead rows without deleting them, as 0.2.0 did, let a renewal paused after reading the
/// clock revive a lease that a conflicting grant had already seen expire.)
macro_rules! clear_dead_sql {
    ($table:literal, $key:literal, $same_row:literal, $which:literal) => {
        concat!(
            "WITH dead AS (SELECT ",
            $key,
            " FROM ",
            $table,
            " \
                            WHERE lock_id = $1 AND expires_at + lock_delay <= $5 ",
            $which,
            " \
                              FOR UPDATE SKIP LOCKED), \
                  gone AS (DELETE FROM ",
            $table,
            " AS t USING dead \
                            WHERE ",
            $same_row,
            " RETURNING 1) \
             SELECT (SELECT count(*) FROM gone) = \
                    (SELECT count(*) FROM ",
            $table,
            " \
                      WHERE lock_id = $1 AND expires_at + lock_delay <= $5 ",
            $which,
            ")"
        )
    };
}
pub(crate) use clear_dead_sql;
