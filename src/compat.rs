//! What older SQL versions call, and why each call is kept or refused.
//!
//! Between installing a new package (its `lockext.so`) and `ALTER EXTENSION lockext UPDATE`
//! in a database, that database's SQL objects are still an older version's, and they call
//! this library by the C symbols that *their* script named: `lock_acquire_wrapper` with
//! 0.1.0's three arguments or 0.2.0's eight, every lease and fence function SECURITY
//! DEFINER, over the older tables. (Without preload a new backend loads the new library at
//! once; with preload, every backend does at the next restart.) Like pg_stat_statements,
//! this library keeps every symbol an older script names, and gives each the meaning the
//! older SQL promised, or refuses the call with 55000 and a hint naming the command. The
//! current SQL calls symbols that no older library has (`*_0_3_wrapper`), so an old
//! library still mapped in a backend after the update (a session opened before the package
//! was installed, without preload) fails to find them (42883) instead of running old code
//! on new tables.
//!
//! | symbol (older SQL) | here | why |
//! |---|---|---|
//! | `lock_acquire` (0.1.0: 3 arguments, 0.2.0: 8), `lock_acquire_all` (0.2.0) | refused | a grant mints a token. This library mints by the token eras that 0.3.0's tables record; 0.2.0's rules (an epoch raised at each boot) are the holes 0.3.0 closed, and minting by either here would let the update's move of the epoch row (sql/lockext--0.2.0--0.3.0.sql) reason from a row that no longer says what was handed out |
//! | `lock_renew`, `lock_release` (0.1.0, 0.2.0), `lock_release_all` (0.2.0) | served | they mint nothing, and the rows are as the older version wrote them. For the session's role, as older SQL did (its SECURITY DEFINER hides the calling role); refused inside a maintenance operation, where the session's role is not the one running, and for a `lockext_admin` member acting on another role's lease (older SQL cannot tell whose code calls it, so its admin power is not lent to anyone) |
//! | `lock_check` | served | read-only, under the newest snapshot as 0.3.0 reads it; refused in parallel mode (older SQL declared it PARALLEL SAFE, and a parallel operation cannot take that snapshot) |
//! | `fenced_update`, `fence_advance`, `check_token` | served | no resource of older SQL is bound to a lock (that column comes with 0.3.0), so the mark is the whole check: a token below it is refused, as before. A token above the highest one the older versions could have issued is refused as never issued |
//! | `token_parts` | served as 0.2.0 did | its columns are named (era, raise, counter) of 0.2.0's layout: 0.3.0's answer (layout, era, counter) under those names would be wrong |
//! | `reaper_status`, `stats`, `stats_reset`, `waiters` | one symbol for every version | shared memory only, the same columns in every version |
//!
//! The reaper of a database whose SQL is older waits for the update (`reaper.rs`): its
//! statements need 0.3.0's index function, and in the window no backend of this library
//! grants a lease, so none needs a dead one cleared. No lease is ever written here in an
//! older SQL's window but by renew and release, and those touch live rows only; so the
//! renew and release below need no retry against a reaper's batch (`lease.rs`).
//!
//! The older statements below are frozen with the schemas of sql/lockext--0.1.0.sql and
//! sql/lockext--0.1.0--0.2.0.sql; they are valid on 0.3.0's tables too, for a call that
//! started before an update committed and ran on after it.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

use crate::backend;
use crate::catalog;
use crate::commit;
use crate::error::{self, LockError, OrReport};
use crate::lease;
use crate::statements::{first_named, Args, Statement};
use crate::stats::{self, Counter};
use crate::text::{Jsonb, Text, TextBuf};
use crate::wait;
use crate::xact;

/// The version of this library, and of the SQL it was built with.
pub const LIBRARY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// A released SQL version whose entry points this library serves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Older {
    V0_1,
    V0_2,
}

impl Older {
    fn name(self) -> &'static str {
        match self {
            Older::V0_1 => "0.1.0",
            Older::V0_2 => "0.2.0",
        }
    }
}

static INSTALLED: Statement = Statement {
    sql: include_str!("../sql/run/compat/installed_version.sql"),
    params: &[],
};

/// The version of lockext's SQL objects in this database, if it has any.
pub fn installed_version() -> Result<Option<String>, LockError> {
    Spi::connect_mut(|client| {
        Ok(first_named::<String>(
            INSTALLED.run(client, Args::new())?,
            "extversion",
        )?)
    })
}

/// What the reaper of a database whose SQL is `version` says while it waits.
pub fn reaper_waits(version: &str) -> String {
    format!(
        "lockext's SQL objects here are at {version}, its library at {LIBRARY_VERSION}: \
         the reaper waits for ALTER EXTENSION lockext UPDATE"
    )
}

fn database_name() -> String {
    catalog::database_name(backend::database())
        .unwrap_or_else(|| format!("oid {}", backend::database().to_u32()))
}

/// Raises 55000 for `function`, called by SQL objects at `version`, with `detail`.
fn refuse(function: &str, version: &str, detail: &str) -> ! {
    let db = database_name();
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "lockext.{function} is refused until lockext is updated in database \"{db}\": its \
             SQL objects are at version {version}, its library at {LIBRARY_VERSION}"
        ),
        "lockext",
    )
    .set_detail(detail)
    .set_hint(format!(
        "Run ALTER EXTENSION lockext UPDATE in database \"{db}\", and in every other \
         database that has lockext at an older version."
    ))
    .report(PgLogLevel::ERROR);
    unreachable!("an ERROR report does not return")
}

/// Raises 55000 for `function` called by SQL objects of this library's own version that an
/// earlier build made (an unreleased version's SQL changes between builds; `ALTER
/// EXTENSION ... UPDATE` cannot help, since the version is the same).
fn refuse_earlier_build(function: &str) -> ! {
    let db = database_name();
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "lockext.{function} in database \"{db}\" was created by an earlier build of \
             lockext {LIBRARY_VERSION}"
        ),
        "lockext",
    )
    .set_detail(
        "Its SQL names an entry point that this build keeps for lockext 0.1.0 and 0.2.0 only: \
         an unreleased version's SQL changes between builds.",
    )
    .set_hint(format!(
        "Create the extension again in database \"{db}\": DROP EXTENSION lockext CASCADE; \
         CREATE EXTENSION lockext (its leases and resources are lost)."
    ))
    .report(PgLogLevel::ERROR);
    unreachable!("an ERROR report does not return")
}

/// The older SQL version that called `function` through one of these entry points. Only
/// 0.1.0's and 0.2.0's scripts name them; any other caller is refused rather than guessed.
fn older(function: &'static str) -> Older {
    match installed_version().or_report().as_deref() {
        Some("0.1.0") => Older::V0_1,
        Some("0.2.0") => Older::V0_2,
        Some(LIBRARY_VERSION) => refuse_earlier_build(function),
        other => refuse(
            function,
            other.unwrap_or("none"),
            "This entry point serves the SQL of lockext 0.1.0 and 0.2.0 only; a function of \
             another version, or made by hand, that names it cannot be served by guessing.",
        ),
    }
}

// ---- grants: refused ---------------------------------------------------------------

const MINTS_A_TOKEN: &str = "A grant mints a fencing token, and this library mints tokens \
    only from the cluster's token ledger, whose rules the older SQL does not follow; by the \
    older SQL's rules it could hand out a token that is not above every token handed out \
    before. Leases already held can still be renewed and released, and fenced writes are \
    still checked.";

/// 0.1.0: `lock_acquire(lock_id, owner, ttl)`; 0.2.0: also `wait, lock_delay, mode,
/// permits, session_bound`. The arguments are not read: the call is refused either way.
#[pg_extern(sql = false)]
fn lock_acquire() -> Option<pgrx::composite_type!('static, "lock_grant")> {
    refuse("lock_acquire", older("lock_acquire").name(), MINTS_A_TOKEN)
}

/// 0.2.0: `lock_acquire_all(lock_ids, owner, ttl, wait, mode, session_bound)`.
#[allow(clippy::type_complexity)]
#[pg_extern(sql = false)]
fn lock_acquire_all() -> TableIterator<
    'static,
    (
        name!(lock_id, String),
        name!(owner, String),
        name!(fence_token, i64),
        name!(acquired_at, TimestampWithTimeZone),
        name!(expires_at, TimestampWithTimeZone),
    ),
> {
    refuse(
        "lock_acquire_all",
        older("lock_acquire_all").name(),
        MINTS_A_TOKEN,
    )
}

// ---- renew and release: served -------------------------------------------------------

/// The role an older SQL's lease function acts for: the session's, as 0.1.0 and 0.2.0
/// recorded and checked it (`GetOuterUserId`). Their functions are SECURITY DEFINER, so
/// the current user is the extension's owner and the role whose code called is gone.
/// Inside a maintenance operation (ANALYZE, REINDEX, REFRESH MATERIALIZED VIEW, an index
/// expression) the code running is the table owner's, not the session's: refused there.
/// What cannot be seen from here is another role's SECURITY DEFINER function that the
/// session calls: it acts for the session, on the session's own leases only (there is no
/// administrator's path here), as it could with 0.2.0 itself; renew and release decide
/// availability, never which token is newer.
fn session_role(function: &'static str, version: Older) -> pg_sys::Oid {
    if backend::in_security_restricted_operation() {
        refuse(
            function,
            version.name(),
            "Inside a maintenance operation the code running is not the session role's, and \
             the older SQL's functions (SECURITY DEFINER) do not say whose it is.",
        );
    }
    backend::outer_user()
}

fn is_admin(role: pg_sys::Oid) -> bool {
    // Its privileges, not mere membership (caller::is_admin says why).
    catalog::has_privileges_of_named(role, c"lockext_admin")
}

const RENEW_PARAMS: &[(&str, pg_sys::PgBuiltInOids)] = &[
    ("lock_id", TEXTOID),
    ("owner", TEXTOID),
    ("role", OIDOID),
    ("ttl", INTERVALOID),
    ("now", TIMESTAMPTZOID),
    ("fence_token", INT8OID),
];
// 0.1.0 has no shared leases and counts no renewals.
static RENEW_0_1: [Statement; 1] = [Statement {
    sql: include_str!("../sql/run/compat/renew_lock_0_1.sql"),
    params: RENEW_PARAMS,
}];
static RENEW_0_2: [Statement; 2] = [
    Statement {
        sql: include_str!("../sql/run/compat/renew_lock_0_2.sql"),
        params: RENEW_PARAMS,
    },
    Statement {
        sql: include_str!("../sql/run/compat/renew_shared_lease_0_2.sql"),
        params: RENEW_PARAMS,
    },
];

// Release's parameters are today's (`lease::HELD_PARAMS`), in the same order.
const RELEASE_PARAMS: &[(&str, pg_sys::PgBuiltInOids)] = lease::HELD_PARAMS;
static RELEASE_0_1: [Statement; 1] = [Statement {
    sql: include_str!("../sql/run/compat/release_lock.sql"),
    params: RELEASE_PARAMS,
}];
static RELEASE_0_2: [Statement; 2] = [
    Statement {
        sql: include_str!("../sql/run/compat/release_lock.sql"),
        params: RELEASE_PARAMS,
    },
    Statement {
        sql: include_str!("../sql/run/compat/release_shared_lease.sql"),
        params: RELEASE_PARAMS,
    },
];

static OTHERS_0_1: Statement = Statement {
    sql: include_str!("../sql/run/compat/others_lease_0_1.sql"),
    params: &[
        ("lock_id", TEXTOID),
        ("owner", TEXTOID),
        ("role", OIDOID),
        ("fence_token", INT8OID),
    ],
};
static OTHERS_0_2: Statement = Statement {
    sql: include_str!("../sql/run/compat/others_lease_0_2.sql"),
    params: &[
        ("lock_id", TEXTOID),
        ("owner", TEXTOID),
        ("role", OIDOID),
        ("fence_token", INT8OID),
    ],
};

/// A renew or release that found no lease of the caller's: when the caller is a
/// `lockext_admin` member and the lease is another role's, refused, not answered "not
/// yours" (0.3.0's SQL lets an administrator act on it; older SQL cannot do so safely).
fn refuse_if_administering(
    function: &'static str,
    version: Older,
    role: pg_sys::Oid,
    lock_id: Text<'_>,
    owner: Text<'_>,
    fence_token: Option<i64>,
) -> Result<(), LockError> {
    if !is_admin(role) {
        return Ok(());
    }
    let statement = match version {
        Older::V0_1 => &OTHERS_0_1,
        Older::V0_2 => &OTHERS_0_2,
    };
    let args = Args::new()
        .set("lock_id", lock_id)
        .set("owner", owner)
        .set("role", role)
        .set("fence_token", fence_token);
    let others =
        Spi::connect_mut(|client| first_named::<bool>(statement.run(client, args)?, "others"))?;
    if others == Some(true) {
        refuse(
            function,
            version.name(),
            "A lockext_admin member renews and releases other roles' leases only through the \
             SQL of lockext 0.3.0, whose functions see the role whose code calls them; the \
             older SQL's functions (SECURITY DEFINER) see only the session's role.",
        );
    }
    Ok(())
}

/// 0.1.0 and 0.2.0: `lock_renew(lock_id, owner, ttl, fence_token DEFAULT NULL)`.
#[pg_extern(sql = false)]
fn lock_renew(
    lock_id: Option<Text<'_>>,
    owner: Option<Text<'_>>,
    ttl: Option<Interval>,
    fence_token: Option<i64>,
) -> Option<TimestampWithTimeZone> {
    let version = older("lock_renew");
    renew(version, lock_id, owner, ttl, fence_token).or_report()
}

fn renew(
    version: Older,
    lock_id: Option<Text<'_>>,
    owner: Option<Text<'_>>,
    ttl: Option<Interval>,
    fence_token: Option<i64>,
) -> Result<Option<TimestampWithTimeZone>, LockError> {
    let lock_id = error::identifier("lock_id", lock_id)?;
    let owner = error::identifier("owner", owner)?;
    let ttl = error::ttl(ttl)?;
    let fence_token = error::optional_token("fence_token", fence_token)?;
    backend::writable_server()?;
    let role = session_role("lock_renew", version);
    let held = lease::Held {
        lock_id,
        owner,
        role,
        now: backend::now()?,
        token: fence_token,
    };
    let args = || held.args_with_ttl(ttl);
    let statements: &'static [Statement] = match version {
        Older::V0_1 => &RENEW_0_1,
        Older::V0_2 => &RENEW_0_2,
    };
    let only_leases = commit::only_leases_so_far();
    let renewed =
        Spi::connect_mut(|client| xact::first_found(client, statements, args, lease::renewed))?;
    commit::relax_if_only_leases(only_leases);
    if renewed.is_none() {
        refuse_if_administering("lock_renew", version, role, lock_id, owner, fence_token)?;
    }
    stats::count(if renewed.is_some() {
        Counter::RenewalsOk
    } else {
        Counter::RenewalsFailed
    });
    Ok(renewed)
}

/// 0.1.0 and 0.2.0: `lock_release(lock_id, owner, fence_token DEFAULT NULL)`.
#[pg_extern(sql = false)]
fn lock_release(
    lock_id: Option<Text<'_>>,
    owner: Option<Text<'_>>,
    fence_token: Option<i64>,
) -> bool {
    let version = older("lock_release");
    (|| {
        let lock_id = error::identifier("lock_id", lock_id)?;
        let owner = error::identifier("owner", owner)?;
        let fence_token = error::optional_token("fence_token", fence_token)?;
        backend::writable_server()?;
        let role = session_role("lock_release", version);
        release(version, "lock_release", role, lock_id, owner, fence_token)
    })()
    .or_report()
}

/// 0.2.0: `lock_release_all(lock_ids, owner)`: how many of the leases the caller held.
#[pg_extern(sql = false)]
fn lock_release_all(lock_ids: Option<Vec<Option<TextBuf>>>, owner: Option<Text<'_>>) -> i32 {
    let version = older("lock_release_all");
    (|| {
        let lock_ids = lock_ids.ok_or(LockError::NullArgument { arg: "lock_ids" })?;
        if lock_ids.is_empty() {
            return Err(LockError::EmptyLockSet { arg: "lock_ids" });
        }
        let mut ids = Vec::with_capacity(lock_ids.len());
        for id in &lock_ids {
            ids.push(error::identifier(
                "lock_ids element",
                id.as_ref().map(TextBuf::as_text),
            )?);
        }
        ids.sort_unstable();
        ids.dedup();
        let owner = error::identifier("owner", owner)?;
        backend::writable_server()?;
        let role = session_role("lock_release_all", version);
        let mut released = 0;
        for id in ids {
            if release(version, "lock_release_all", role, id, owner, None)? {
                released += 1;
            }
        }
        Ok(released)
    })()
    .or_report()
}

fn release(
    version: Older,
    function: &'static str,
    role: pg_sys::Oid,
    lock_id: Text<'_>,
    owner: Text<'_>,
    fence_token: Option<i64>,
) -> Result<bool, LockError> {
    let held = lease::Held {
        lock_id,
        owner,
        role,
        now: backend::now()?,
        token: fence_token,
    };
    let args = || held.args();
    let statements: &'static [Statement] = match version {
        Older::V0_1 => &RELEASE_0_1,
        Older::V0_2 => &RELEASE_0_2,
    };
    let only_leases = commit::only_leases_so_far();
    let deleted =
        Spi::connect_mut(|client| xact::first_found(client, statements, args, lease::released))?;
    commit::relax_if_only_leases(only_leases);
    if deleted.is_none() {
        refuse_if_administering(function, version, role, lock_id, owner, fence_token)?;
    } else {
        wait::wake_head_at_commit(lock_id);
    }
    let released = deleted.is_some_and(|ended| ended.live);
    stats::count(if released {
        Counter::ReleasesOk
    } else {
        Counter::ReleasesFailed
    });
    // 0.2.0 announced releases (lockext.notify); 0.1.0 had no events.
    if let (
        Older::V0_2,
        Some(lease::Ended {
            live: true, token, ..
        }),
    ) = (version, deleted)
    {
        lease::notify("released", lock_id, token, None)?;
    }
    Ok(released)
}

// ---- lock_check: served ------------------------------------------------------------

static LIVE_0_1: Statement = Statement {
    sql: include_str!("../sql/run/compat/lock_check_0_1.sql"),
    params: &[("lock_id", TEXTOID), ("fence_token", INT8OID)],
};
static LIVE_0_2: Statement = Statement {
    sql: include_str!("../sql/run/compat/lock_check_0_2.sql"),
    params: &[("lock_id", TEXTOID), ("fence_token", INT8OID)],
};

/// 0.1.0 and 0.2.0: `lock_check(lock_id, fence_token)`: whether that grant is live now, by
/// the server's clock and the newest snapshot (not a REPEATABLE READ transaction's, which
/// would still show a grant released since it began).
#[pg_extern(sql = false)]
fn lock_check(lock_id: Option<Text<'_>>, fence_token: Option<i64>) -> bool {
    let version = older("lock_check");
    let lock_id = error::identifier("lock_id", lock_id).or_report();
    let fence_token = error::token("fence_token", fence_token).or_report();
    if backend::in_parallel_mode() {
        refuse(
            "lock_check",
            version.name(),
            "lock_check reads the newest snapshot, which a parallel operation cannot take; \
             the older SQL declares it PARALLEL SAFE, the update declares it PARALLEL UNSAFE.",
        );
    }
    let statement = match version {
        Older::V0_1 => &LIVE_0_1,
        Older::V0_2 => &LIVE_0_2,
    };
    let args = Args::new()
        .set("lock_id", lock_id)
        .set("fence_token", fence_token);
    Spi::connect_mut(|_| {
        statement
            .read_latest(args)
            .and_then(|row| row.get::<bool>("live"))
    }) == Some(true)
}

// ---- fencing: served ----------------------------------------------------------------

static ADVANCE_OLDER: Statement = Statement {
    sql: include_str!("../sql/run/compat/advance_mark.sql"),
    params: &[
        ("resource_id", TEXTOID),
        ("fence_token", INT8OID),
        ("data", JSONBOID),
        ("replace", BOOLOID),
    ],
};

static MARK: Statement = Statement {
    sql: include_str!("../sql/run/compat/read_mark.sql"),
    params: &[("resource_id", TEXTOID)],
};

/// 0.1.0 and 0.2.0: `fenced_update(resource_id, fence_token, data)`.
#[pg_extern(sql = false)]
fn fenced_update(
    resource_id: Option<Text<'_>>,
    fence_token: Option<i64>,
    data: Option<Jsonb>,
) -> bool {
    older("fenced_update");
    (|| {
        let resource_id = error::identifier("resource_id", resource_id)?;
        let fence_token = error::token("fence_token", fence_token)?;
        let data = data.ok_or(LockError::NullArgument { arg: "data" })?;
        advance(resource_id, fence_token, Some(data))
    })()
    .or_report()
}

/// 0.1.0 and 0.2.0: `fence_advance(resource_id, fence_token)`: NULL when accepted, else
/// the newer token that makes it stale (`lockext.fence`, in SQL, raises 55L01 with it).
#[pg_extern(sql = false)]
fn fence_advance(resource_id: Option<Text<'_>>, fence_token: Option<i64>) -> Option<i64> {
    older("fence_advance");
    (|| {
        let resource_id = error::identifier("resource_id", resource_id)?;
        let fence_token = error::token("fence_token", fence_token)?;
        if advance(resource_id, fence_token, None)? {
            return Ok(None);
        }
        Spi::connect_mut(|client| {
            let args = Args::new().set("resource_id", resource_id);
            Ok(first_named::<i64>(MARK.run(client, args)?, "fence_token")?)
        })
    })()
    .or_report()
}

/// 0.1.0 and 0.2.0: `check_token(fence_token)`, which their `fence_guard` and `fence_read`
/// call: an error unless the token is one the older versions could have issued.
#[pg_extern(sql = false)]
fn check_token(fence_token: Option<i64>) {
    older("check_token");
    (|| require_issued(error::token("fence_token", fence_token)?))().or_report()
}

fn advance(
    resource_id: Text<'_>,
    fence_token: i64,
    data: Option<Jsonb>,
) -> Result<bool, LockError> {
    backend::writable_server()?;
    require_issued(fence_token)?;
    let replace = data.is_some();
    let args = Args::new()
        .set("resource_id", resource_id)
        .set("fence_token", fence_token)
        .set("data", data)
        .set("replace", replace);
    // A refused upsert still holds the resource's row (ON CONFLICT locks it before its
    // WHERE says no): undone, so that a refused writer whose transaction stays open holds
    // up no one.
    let accepted = Spi::connect_mut(|client| {
        xact::kept_if_found(|| Ok((!ADVANCE_OLDER.run(client, args)?.is_empty()).then_some(())))
    })?
    .is_some();
    if !accepted {
        stats::count(Counter::FenceStale);
    }
    Ok(accepted)
}

// Read under the newest snapshot (`read_latest`): why, in the file's header.
static ISSUED: Statement = Statement {
    sql: include_str!("../sql/run/compat/issued.sql"),
    params: &[],
};

/// 0.1.0's and 0.2.0's layout: a 20-bit epoch (an 8-bit era, a 12-bit raise) over a 43-bit
/// counter.
const COUNTER_BITS: u32 = 43;
const RAISE_BITS: u32 = 12;
const EPOCH_LIMIT: i64 = 1 << 20;

/// The highest token the older versions can have handed out, given the recorded epoch
/// (`None`: no row), the counter's last value (`None`: never used) and the WAL timeline.
/// 0.2.0 could mint in the epoch after the recorded one, or in the next era, before (or
/// without) that epoch's row committing; so the bound is the last raise of the era after
/// the recorded one, or of the timeline's era: the same epoch that the update to 0.3.0
/// moves the row to (sql/lockext--0.2.0--0.3.0.sql), above which 0.3.0 starts. A forged
/// token up to it can fence out only holders of older grants, as 0.2.0's own check let it;
/// never a grant made after the update.
fn highest_of(epoch: Option<i64>, counter: Option<i64>, timeline: i64) -> i64 {
    let Some(counter) = counter else {
        return 0; // no token was ever handed out
    };
    let era = match epoch {
        Some(epoch) => ((epoch >> RAISE_BITS) + 1).max(timeline),
        None => timeline.max(1),
    };
    let last_epoch = ((era << RAISE_BITS) | ((1 << RAISE_BITS) - 1)).min(EPOCH_LIMIT - 1);
    (last_epoch << COUNTER_BITS) | counter.clamp(0, (1 << COUNTER_BITS) - 1)
}

/// Refuses a token the older versions never issued: a forged one would raise a resource's
/// mark past every real holder.
fn require_issued(token: i64) -> Result<(), LockError> {
    let row = Spi::connect_mut(|_| ISSUED.read_latest(Args::new()));
    let (epoch, counter) = match row {
        Some(row) => (
            row.get::<i64>("epoch"),
            (row.get::<bool>("is_called") == Some(true))
                .then(|| row.get::<i64>("last_value").unwrap_or(0)),
        ),
        None => (None, None),
    };
    let timeline = i64::from(backend::wal_timeline());
    let highest = highest_of(epoch, counter, timeline);
    if token > highest {
        stats::count(Counter::FenceForged);
        return Err(LockError::TokenNeverIssued { token, highest });
    }
    Ok(())
}

// ---- token_parts: served with 0.2.0's meaning ----------------------------------------

/// 0.1.0 and 0.2.0: `token_parts(fence_token) -> TABLE (era, raise, counter)`, in their
/// layout, as they computed it: every token they handed out is in it.
#[pg_extern(sql = false)]
fn token_parts(
    fence_token: i64,
) -> TableIterator<'static, (name!(era, i32), name!(raise, i32), name!(counter, i64))> {
    let epoch = fence_token >> COUNTER_BITS;
    let era = (epoch >> RAISE_BITS) as i32;
    let raise = (epoch & ((1 << RAISE_BITS) - 1)) as i32;
    let counter = fence_token & ((1 << COUNTER_BITS) - 1);
    TableIterator::once((era, raise, counter))
}
