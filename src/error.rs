//! Every error a caller of lockext can meet, each with the SQLSTATE that docs/errors.md
//! documents, and what a client sees of it: its message, detail and hint, never a Rust
//! backtrace.
//!
//! Functions validate all their arguments before they touch a table, so bad input
//! changes nothing: the error is raised before the first write.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::spi::SpiError;
use pgrx::PgSqlErrorCode;

use crate::text::Text;

/// Longest lock id, owner or resource id accepted, in bytes. Ids are b-tree keys; a bound
/// keeps index entries small and tells a caller who passes a payload instead of a name.
pub const MAX_ID_BYTES: usize = 256;

/// Most permits a semaphore may have.
pub const MAX_PERMITS: i32 = 1_000_000;

/// Longest lease accepted. A lease is renewed by a live holder; a TTL longer than a day
/// only keeps a dead client's lock from being cleaned up.
pub const MAX_TTL_MICROS: i64 = 24 * 60 * 60 * 1_000_000;

/// What a ttl is the length of: the hint of a ttl too long names how to renew that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlOf {
    Lease,
    Keepalive,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{arg} must not be NULL")]
    NullArgument { arg: &'static str },

    #[error("{arg} must not be empty")]
    EmptyIdentifier { arg: &'static str },

    #[error("{arg} is {len} bytes long; the limit is {MAX_ID_BYTES} bytes")]
    IdentifierTooLong { arg: &'static str, len: usize },

    #[error("ttl must be positive, got {ttl}")]
    TtlNotPositive { ttl: String },

    #[error("ttl must be at most 1 day, got {ttl}")]
    TtlTooLong { ttl: String, of: TtlOf },

    #[error("{arg} must be between 0 and 1 day, got {value}")]
    DurationOutOfRange { arg: &'static str, value: String },

    #[error("lock_acquire can wait only in READ COMMITTED transactions")]
    WaitNeedsReadCommitted,

    #[error("lock_observe can wait only in READ COMMITTED transactions")]
    ObserveNeedsReadCommitted,

    #[error("lock_set_value works only in READ COMMITTED transactions")]
    SetValueNeedsReadCommitted,

    #[error("value is {len} bytes as jsonb; the limit is {limit} bytes (lockext.value_max_size)")]
    ValueTooLarge { len: usize, limit: usize },

    #[error("{arg} must not be negative, got {value}")]
    VersionNegative { arg: &'static str, value: i64 },

    #[error("{arg} must be positive, got {value}")]
    TokenNotPositive { arg: &'static str, value: i64 },

    #[error("fence token {token} was never issued (the highest issued is {highest})")]
    TokenNeverIssued { token: i64, highest: i64 },

    #[error("lockext cannot change leases or resources during recovery")]
    ReadOnlyServer,

    #[error("the fencing token {what} is exhausted")]
    TokensExhausted { what: &'static str },

    #[error("lockext cannot use its token ledger: {detail}")]
    EraRecord { detail: String },

    #[error("lockext hands out fencing tokens only when it is loaded at server start")]
    LedgerNeedsPreload,

    #[error("the server clock reads a time outside the timestamptz range")]
    ClockOutOfRange,

    #[error("mode must be 'exclusive' or 'shared', got '{mode}'")]
    UnknownMode { mode: String },

    #[error("permits must be between 1 and {MAX_PERMITS}, got {permits}")]
    PermitsOutOfRange { permits: i32 },

    #[error("a semaphore's permits are taken in mode 'exclusive', not 'shared'")]
    SharedPermits,

    #[error("semaphore \"{lock_id}\" has {has} permits, not {asked}")]
    PermitsMismatch {
        lock_id: String,
        has: i32,
        asked: i32,
    },

    #[error("\"{lock_id}\" is {is}, not {asked}")]
    WrongKind {
        lock_id: String,
        is: &'static str,
        asked: &'static str,
    },

    #[error("{arg} must not be empty")]
    EmptyLockSet { arg: &'static str },

    #[error("session-bound leases are off for this session (lockext.session_leases)")]
    SessionLeasesOff,

    #[error("too many leases taken in one transaction")]
    TooManyClaims,

    #[error(
        "the values of this role would take more than {limit} bytes (lockext.role_values_size)"
    )]
    RoleValuesFull { limit: usize },

    /// The calling role lacks the privileges of the role a function needs (`caller::require`).
    /// PostgreSQL's own check would come first and name the function, an internal one when
    /// a wrapper or a trigger calls it, without saying which role to grant: so EXECUTE is
    /// granted to PUBLIC and this is the check.
    #[error("permission denied to {action}")]
    NotPermitted {
        action: &'static str,
        role: String,
        /// The role's name as GRANT takes it (quoted when it must be).
        grantee: String,
        needs: &'static str,
    },

    #[error("keep-alive {keepalive} is not live, or not this role's")]
    KeepaliveNotLive { keepalive: i64 },

    #[error("a lease attached to a keep-alive has no ttl of its own: pass ttl => NULL")]
    KeepaliveWithTtl,

    #[error("a lease is attached to a keep-alive or bound to its session, not both")]
    KeepaliveWithSession,

    #[error("leases are attached to keep-alives only in READ COMMITTED transactions")]
    KeepaliveNeedsReadCommitted,

    #[error("the lease of \"{lock_id}\" is attached to keep-alive {keepalive}, which renews it")]
    RenewAttached { lock_id: String, keepalive: i64 },

    #[error("lock id \"{lock_id}\" is on another node of the Citus cluster now (shard {shard})")]
    CitusOtherNode { lock_id: String, shard: i64 },

    #[error("lockext.citus_distribute() has not finished on this Citus cluster")]
    CitusNotReady,

    #[error("on a Citus cluster, {what}")]
    CitusUnsupported {
        what: &'static str,
        hint: &'static str,
    },

    #[error("lockext internal error: a grant has no {name}")]
    MissingColumn { name: &'static str },

    #[error("lockext internal error: {0}")]
    Spi(#[from] SpiError),
}

impl LockError {
    pub fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            LockError::NullArgument { .. } => ERRCODE_NULL_VALUE_NOT_ALLOWED, // 22004
            LockError::EmptyIdentifier { .. }
            | LockError::TtlNotPositive { .. }
            | LockError::TtlTooLong { .. }
            | LockError::DurationOutOfRange { .. }
            | LockError::TokenNotPositive { .. }
            | LockError::TokenNeverIssued { .. }
            | LockError::UnknownMode { .. }
            | LockError::PermitsOutOfRange { .. }
            | LockError::SharedPermits
            | LockError::PermitsMismatch { .. }
            | LockError::EmptyLockSet { .. }
            | LockError::ValueTooLarge { .. }
            | LockError::VersionNegative { .. }
            | LockError::KeepaliveWithTtl
            | LockError::KeepaliveWithSession => ERRCODE_INVALID_PARAMETER_VALUE, // 22023
            LockError::KeepaliveNotLive { .. }
            | LockError::RenewAttached { .. }
            | LockError::LedgerNeedsPreload
            | LockError::CitusNotReady => {
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE // 55000
            }
            LockError::WrongKind { .. } => ERRCODE_WRONG_OBJECT_TYPE, // 42809
            LockError::NotPermitted { .. } => ERRCODE_INSUFFICIENT_PRIVILEGE, // 42501
            LockError::SessionLeasesOff | LockError::CitusUnsupported { .. } => {
                ERRCODE_FEATURE_NOT_SUPPORTED // 0A000
            }
            LockError::CitusOtherNode { .. } => ERRCODE_T_R_SERIALIZATION_FAILURE, // 40001
            LockError::TooManyClaims => ERRCODE_OUT_OF_MEMORY,                     // 53200
            LockError::RoleValuesFull { .. } => ERRCODE_CONFIGURATION_LIMIT_EXCEEDED, // 53400
            LockError::IdentifierTooLong { .. } => ERRCODE_STRING_DATA_RIGHT_TRUNCATION, // 22001
            LockError::ReadOnlyServer => ERRCODE_READ_ONLY_SQL_TRANSACTION,        // 25006
            LockError::WaitNeedsReadCommitted
            | LockError::ObserveNeedsReadCommitted
            | LockError::SetValueNeedsReadCommitted
            | LockError::KeepaliveNeedsReadCommitted => {
                ERRCODE_FEATURE_NOT_SUPPORTED // 0A000
            }
            LockError::ClockOutOfRange => ERRCODE_DATETIME_FIELD_OVERFLOW, // 22008
            LockError::TokensExhausted { .. } => ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED, // 2200H
            LockError::EraRecord { .. } => ERRCODE_IO_ERROR,               // 58030
            LockError::Spi(_) | LockError::MissingColumn { .. } => ERRCODE_INTERNAL_ERROR, // XX000
        }
    }

    fn detail(&self) -> Option<String> {
        match self {
            LockError::NotPermitted { role, needs, .. } => Some(format!(
                "Role \"{role}\" does not have the privileges of role {needs}."
            )),
            _ => None,
        }
    }

    fn hint(&self) -> Option<String> {
        if let LockError::NotPermitted { grantee, needs, .. } = self {
            return Some(format!(
                "An administrator grants them with: GRANT {needs} TO {grantee};"
            ));
        }
        self.fixed_hint().map(str::to_string)
    }

    fn fixed_hint(&self) -> Option<&'static str> {
        match self {
            LockError::EmptyIdentifier { .. } => {
                Some("An empty string names no lock, owner or resource: pass its name.")
            }
            LockError::EmptyLockSet { .. } => Some("Pass at least one lock id."),
            LockError::TokenNotPositive {
                arg: "keepalive", ..
            } => Some(
                "Keep-alive ids are positive: pass the keepalive that \
                 lockext.lock_keepalive_grant returned.",
            ),
            LockError::TokenNotPositive { .. } => Some(
                "Fence tokens are positive: pass the fence_token that lockext.lock_acquire returned.",
            ),
            LockError::IdentifierTooLong { .. } => {
                Some("Use a short name; keep payloads in fenced_update's data.")
            }
            LockError::TtlTooLong {
                of: TtlOf::Lease, ..
            } => {
                Some("Take a shorter lease and renew it with lockext.lock_renew while you work.")
            }
            LockError::TtlTooLong {
                of: TtlOf::Keepalive,
                ..
            } => Some(
                "Give the keep-alive a ttl of at most a day, and renew it with \
                 lockext.lock_keepalive_renew while you work.",
            ),
            LockError::TokenNeverIssued { .. } => {
                Some("Pass the fence_token that lockext.lock_acquire returned.")
            }
            LockError::ReadOnlyServer => Some("Connect to the primary server."),
            LockError::WaitNeedsReadCommitted => Some(
                "A snapshot taken at the transaction's start never sees the release; \
                 wait from a READ COMMITTED transaction, or poll with wait => '0'.",
            ),
            LockError::ObserveNeedsReadCommitted => Some(
                "A snapshot taken at the transaction's start never sees the change; observe \
                 from a READ COMMITTED transaction, or read lockext.lock_holders.",
            ),
            LockError::SetValueNeedsReadCommitted => Some(
                "A snapshot taken at the transaction's start can show a lease that has since \
                 ended as still held; set the value from a READ COMMITTED transaction.",
            ),
            LockError::KeepaliveNotLive { .. } => Some(
                "It expired, was revoked, or was granted by another role: grant a new one with \
                 lockext.lock_keepalive_grant and take the locks again, attached to it.",
            ),
            LockError::RenewAttached { .. } => Some(
                "Renew the keep-alive (lockext.lock_keepalive_renew), or take the lock again \
                 with keepalive => NULL and a ttl to give it an expiry of its own.",
            ),
            LockError::KeepaliveNeedsReadCommitted => Some(
                "A keep-alive is renewed all the time: a snapshot taken at the transaction's \
                 start sees an old expiry. Attach from a READ COMMITTED transaction.",
            ),
            LockError::RoleValuesFull { .. } => Some(
                "Each value counts as at least 1 kB, and a value of an ended grant until it is \
                 deleted (with its lease; one left behind, by the next value set on its lock \
                 id or the reaper's next sweep). \
                 Release grants whose values are not needed, publish smaller values, or ask a \
                 superuser to raise lockext.role_values_size for the role.",
            ),
            LockError::ValueTooLarge { .. } => Some(
                "Publish where the data is (an address, a key), not the data: every follower \
                 reads the value at each change.",
            ),
            LockError::CitusOtherNode { .. } => Some(
                "Its shard moved while the call was routed to this node. Call again: Citus \
                 sends the call to the node that holds the shard now (docs/citus.md).",
            ),
            LockError::CitusUnsupported { hint, .. } => Some(hint),
            LockError::CitusNotReady => Some(
                "The lease tables are distributed, but the floor of the tokens handed out \
                 before is not recorded yet (lockext.token_floor): wait for CALL \
                 lockext.citus_distribute() to end, or run it again (docs/citus.md).",
            ),
            LockError::LedgerNeedsPreload => Some(
                "Add lockext to shared_preload_libraries in postgresql.conf and restart the \
                 server: the token ledger travels in the WAL through lockext's own WAL \
                 resource manager, which exists only when the library is preloaded.",
            ),
            LockError::EraRecord { .. } => Some(
                "The file pg_lockext/ledger in the data directory, kept up to date by the \
                 WAL, records how high this cluster's tokens have gone; lockext hands out no \
                 token it cannot read. Restore it from a copy of this data directory, or \
                 replay the WAL over one (a base backup); never edit it.",
            ),
            LockError::TokensExhausted { .. } => Some(
                "No more tokens can be handed out that are higher than every earlier one; \
                 see lockext's docs/tokens.md.",
            ),
            LockError::PermitsMismatch { .. } => Some(
                "Every acquire of a semaphore asks for the same number of permits while any \
                 permit of it is held.",
            ),
            LockError::WrongKind { .. } => Some(
                "A lock id is a lock (exclusive and shared leases) or a semaphore (permits), \
                 not both at once.",
            ),
            LockError::SessionLeasesOff => Some(
                "A DBA turned session-bound leases off, as for a role that connects through a \
                 transaction-pooling PgBouncer, where the server session is not the client's. \
                 Take a lease without session_bound, and renew it.",
            ),
            LockError::TooManyClaims => Some(
                "Take fewer leases in one transaction (a lockext_admin member may take more \
                 exclusive ones), or raise max_locks_per_transaction.",
            ),
            _ => None,
        }
    }

    /// Raises this error as a PostgreSQL ERROR. Unwinds through Rust (destructors run) and
    /// aborts the caller's transaction, as any SQL error does.
    pub fn report(self) -> ! {
        let mut report = ErrorReport::new(self.sqlstate(), self.to_string(), "lockext");
        if let Some(detail) = self.detail() {
            report = report.set_detail(detail);
        }
        if let Some(hint) = self.hint() {
            report = report.set_hint(hint);
        }
        report.report(PgLogLevel::ERROR);
        unreachable!("an ERROR report does not return")
    }
}

/// Keeps Rust backtraces out of every error a client sees, whatever `RUST_BACKTRACE` or
/// `RUST_LIB_BACKTRACE` say in the server's environment. pgrx's panic hook captures one
/// (`Backtrace::capture`) whenever an error unwinds through Rust, a PostgreSQL error raised
/// inside a lockext call too (a cancel, an error of a statement lockext runs), and appends
/// it to the error's DETAIL: stack frames are no message for a client, and name the
/// server's files. std reads those variables once, at the process's first capture, and
/// keeps the answer: a capture made here with `RUST_LIB_BACKTRACE` (which takes
/// precedence) at 0 disables every later one. The variable is then put back as it was, for
/// the programs the server starts (archive_command and the like). Called first in
/// `_PG_init`: in the postmaster when preloaded, whose children inherit the answer.
pub fn keep_backtraces_out_of_errors() {
    const VAR: &str = "RUST_LIB_BACKTRACE";
    let saved = std::env::var_os(VAR);
    std::env::set_var(VAR, "0");
    let _ = std::backtrace::Backtrace::capture();
    match saved {
        Some(value) => std::env::set_var(VAR, value),
        None => std::env::remove_var(VAR),
    }
}

/// The last step of every SQL-callable function: a value, or the error raised in SQL.
pub trait OrReport<T> {
    fn or_report(self) -> T;
}

impl<T> OrReport<T> for Result<T, LockError> {
    fn or_report(self) -> T {
        self.unwrap_or_else(|e| e.report())
    }
}

/// A lock id, owner or resource id: present, not empty, not over-long.
pub fn identifier<'a>(arg: &'static str, value: Option<Text<'a>>) -> Result<Text<'a>, LockError> {
    let value = value.ok_or(LockError::NullArgument { arg })?;
    if value.is_empty() {
        return Err(LockError::EmptyIdentifier { arg });
    }
    if value.len() > MAX_ID_BYTES {
        return Err(LockError::IdentifierTooLong {
            arg,
            len: value.len(),
        });
    }
    Ok(value)
}

/// A lease length, normalised to plain microseconds so that expiry does not depend on the
/// session's time zone (a "1 day" interval can be 23 or 25 hours across a DST change).
pub fn ttl(value: Option<Interval>) -> Result<Interval, LockError> {
    ttl_of(value, TtlOf::Lease)
}

/// As `ttl`, for the length of what `of` says (a keep-alive's: its hint names
/// lock_keepalive_renew).
pub fn ttl_of(value: Option<Interval>, of: TtlOf) -> Result<Interval, LockError> {
    let value = value.ok_or(LockError::NullArgument { arg: "ttl" })?;
    let micros = value.as_micros();
    if micros <= 0 {
        return Err(LockError::TtlNotPositive {
            ttl: value.to_string(),
        });
    }
    if micros > i128::from(MAX_TTL_MICROS) {
        return Err(LockError::TtlTooLong {
            ttl: value.to_string(),
            of,
        });
    }
    // Both casts are in range by the checks above, and months = days = 0 cannot mismatch.
    Interval::new(0, 0, micros as i64).map_err(|_| LockError::TtlTooLong {
        ttl: value.to_string(),
        of,
    })
}

/// A wait or a lock-delay: present, from 0 to 1 day.
pub fn duration(
    arg: &'static str,
    value: Option<Interval>,
) -> Result<std::time::Duration, LockError> {
    let value = value.ok_or(LockError::NullArgument { arg })?;
    let micros = value.as_micros();
    if micros < 0 || micros > i128::from(MAX_TTL_MICROS) {
        return Err(LockError::DurationOutOfRange {
            arg,
            value: value.to_string(),
        });
    }
    Ok(std::time::Duration::from_micros(micros as u64))
}

/// A fence token the caller must give.
pub fn token(arg: &'static str, value: Option<i64>) -> Result<i64, LockError> {
    let value = value.ok_or(LockError::NullArgument { arg })?;
    optional_token(arg, Some(value)).map(|_| value)
}

/// A fence token the caller may leave NULL (meaning "whichever grant I hold").
pub fn optional_token(arg: &'static str, value: Option<i64>) -> Result<Option<i64>, LockError> {
    match value {
        Some(v) if v <= 0 => Err(LockError::TokenNotPositive { arg, value: v }),
        other => Ok(other),
    }
}
