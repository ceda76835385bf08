//! Keep-alives: one renewal for many leases (etcd's lease with many keys, a Consul or
//! ZooKeeper session).
//!
//! Wording: a **keep-alive** is a row of `lockext.keepalives`, held by the role that
//! granted it, with a time to live of its own; a lease **attached** to it (lock_acquire's
//! `keepalive`) has no expiry of its own: its row says `keepalive` and `expires_at =
//! 'infinity'`, and the lease expires when its keep-alive does (`lease_expiry`, which every
//! statement that decides whether a lease is live reads). So one renewal of one row
//! (`lock_keepalive_renew`) extends every attached lease, however many there are. Each
//! attached lease keeps its own fencing token. A keep-alive's id is a token too
//! (`token::mint`): never handed out twice, so a client holding a stale id cannot renew or
//! attach to anyone else's.
//!
//! A keep-alive is **ended** once it can never be renewed again: revoked by its holder
//! (`lock_keepalive_revoke`, which also deletes its leases), or found expired by a grant
//! or the reaper that acts on that. A grant that treats an attached lease as dead because
//! its keep-alive expired ends the keep-alive first, in the same statement that takes the
//! lease over or deletes it (`end_keepalive`, skipping a keep-alive that a renewal holds
//! locked right now): so a renewal and a conflicting grant never both succeed, as for a
//! lease's own renewal (sql/run/grant/clear_dead_exclusive.sql). The reaper ends expired
//! keep-alives, deletes their leases once free, and then the keep-alive's row.

use pgrx::pg_sys;
use pgrx::pg_sys::BuiltinOid::*;
use pgrx::prelude::*;

use crate::backend;
use crate::caller;
use crate::commit;
use crate::error::{self, LockError, OrReport, TtlOf};
use crate::statements::{first_named, Args, Statement};
use crate::stats::{self, Counter};
use crate::text::TextBuf;
use crate::token;
use crate::wait;
use crate::xact;

static GRANT: Statement = Statement {
    sql: include_str!("../sql/run/keepalive/grant.sql"),
    params: &[
        ("keepalive", INT8OID),
        ("role", OIDOID),
        ("ttl", INTERVALOID),
        ("now", TIMESTAMPTZOID),
    ],
};

static RENEW: Statement = Statement {
    sql: include_str!("../sql/run/keepalive/renew.sql"),
    params: &[
        ("keepalive", INT8OID),
        ("role", OIDOID),
        ("now", TIMESTAMPTZOID),
        ("ttl", INTERVALOID),
    ],
};

// Read under the newest snapshot (`Statement::read_latest`).
static HELD: Statement = Statement {
    sql: include_str!("../sql/run/keepalive/held.sql"),
    params: &[
        ("keepalive", INT8OID),
        ("role", OIDOID),
        ("now", TIMESTAMPTZOID),
    ],
};

static REVOKE: Statement = Statement {
    sql: include_str!("../sql/run/keepalive/revoke.sql"),
    params: &[
        ("keepalive", INT8OID),
        ("role", OIDOID),
        ("now", TIMESTAMPTZOID),
    ],
};

static REVOKE_LEASES: Statement = Statement {
    sql: include_str!("../sql/run/keepalive/revoke_leases.sql"),
    params: &[
        ("keepalive", INT8OID),
        ("live", BOOLOID),
        ("notify", BOOLOID),
    ],
};

static ATTACH: Statement = Statement {
    sql: include_str!("../sql/run/keepalive/attach.sql"),
    params: &[
        ("keepalive", INT8OID),
        ("role", OIDOID),
        ("now", TIMESTAMPTZOID),
    ],
};

// Read under the newest snapshot (`Statement::read_latest`).
static EXPIRY: Statement = Statement {
    sql: include_str!("../sql/run/keepalive/expiry.sql"),
    params: &[("keepalive", INT8OID)],
};

static END: Statement = Statement {
    sql: include_str!("../sql/run/keepalive/end.sql"),
    params: &[("keepalive", INT8OID), ("now", TIMESTAMPTZOID)],
};

static ENDED: Statement = Statement {
    sql: include_str!("../sql/run/keepalive/ended.sql"),
    params: &[("keepalive", INT8OID), ("now", TIMESTAMPTZOID)],
};

/// A new keep-alive of the calling role, live for `ttl` (default 30 seconds, the most a
/// day); its id is what lock_acquire's `keepalive` and the other keep-alive functions take.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn lock_keepalive_grant(
    ttl: default!(Option<Interval>, "'30 seconds'"),
) -> TableIterator<
    'static,
    (
        name!(keepalive, i64),
        name!(expires_at, TimestampWithTimeZone),
    ),
> {
    crate::citus::refuse(
        "a keep-alive renews leases of many lock ids at once, which a Citus cluster keeps on \
         different nodes",
        crate::citus::RENEW_EACH,
    )
    .or_report();
    caller::as_member(|| {
        let ttl = error::ttl_of(ttl, TtlOf::Keepalive)?;
        backend::writable_server()?;
        let now = backend::now()?;
        let role = caller::role();
        Spi::connect_mut(|client| {
            let id = token::mint(client)?;
            commit::after_minting();
            let args = Args::new()
                .set("keepalive", id)
                .set("role", role)
                .set("ttl", ttl)
                .set("now", now);
            let rows = GRANT.run(client, args)?;
            let row = rows.first();
            let expires_at = row
                .get_by_name::<TimestampWithTimeZone, _>("expires_at")?
                .ok_or(LockError::MissingColumn { name: "expires_at" })?;
            crate::status::due_by(expires_at);
            Ok(TableIterator::once((id, expires_at)))
        })
    })
    .or_report()
}

/// Extends the keep-alive, and every lease attached to it, to now + `ttl` (NULL: the
/// keep-alive's own); NULL when the caller holds no such live keep-alive (it expired, was
/// revoked or ended, or is another role's).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn lock_keepalive_renew(
    keepalive: Option<i64>,
    ttl: default!(Option<Interval>, "NULL"),
) -> Option<TimestampWithTimeZone> {
    crate::citus::refuse(
        "a keep-alive renews leases of many lock ids at once, which a Citus cluster keeps on \
         different nodes",
        crate::citus::RENEW_EACH,
    )
    .or_report();
    caller::as_member(|| {
        let keepalive = error::token("keepalive", keepalive)?;
        let ttl = ttl
            .map(|t| error::ttl_of(Some(t), TtlOf::Keepalive))
            .transpose()?;
        backend::writable_server()?;
        let (role, now) = (caller::role(), backend::now()?);
        // A renewal, as lock_renew's: losing it in a crash only ends leases early.
        let only_leases = commit::only_leases_so_far();
        let renewed = xact::while_briefly_locked(
            || {
                Spi::connect_mut(|client| {
                    let args = Args::new()
                        .set("keepalive", keepalive)
                        .set("role", role)
                        .set("now", now)
                        .set("ttl", ttl);
                    xact::kept_if_found(|| Ok(first_named(RENEW.run(client, args)?, "expires_at")?))
                })
            },
            || still_held(keepalive, role, now),
        )?;
        commit::relax_if_only_leases(only_leases);
        // A renewal with a shorter time to live brings its leases' end nearer.
        if let Some(expires_at) = renewed {
            crate::status::due_by(expires_at);
        }
        stats::count(if renewed.is_some() {
            Counter::KeepaliveRenewalsOk
        } else {
            Counter::KeepaliveRenewalsFailed
        });
        Ok(renewed)
    })
    .or_report()
}

/// Ends the keep-alive for good and releases every lease attached to it; the number of
/// leases ended, NULL when the caller holds no such keep-alive (or a lockext_admin member
/// names another role's). An expired keep-alive may be revoked too (its leases are then
/// cleared at once, not by the reaper).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn lock_keepalive_revoke(keepalive: Option<i64>) -> Option<i64> {
    crate::citus::refuse(
        "a keep-alive renews leases of many lock ids at once, which a Citus cluster keeps on \
         different nodes",
        crate::citus::RENEW_EACH,
    )
    .or_report();
    caller::as_member(|| {
        let keepalive = error::token("keepalive", keepalive)?;
        backend::writable_server()?;
        let (role, now) = (caller::role(), backend::now()?);
        let notify = crate::events::enabled();
        // A release, as lock_release's: losing it in a crash only ends leases later.
        let only_leases = commit::only_leases_so_far();
        // Two statements: the keep-alive is ended first, once every grant that was attaching
        // a lease to it has committed or not (revoke.sql waits for them), and the leases are
        // deleted under a snapshot taken after that, which sees each of those leases.
        let ended = xact::kept_if_found(|| {
            Spi::connect_mut(|client| {
                let args = Args::new()
                    .set("keepalive", keepalive)
                    .set("role", role)
                    .set("now", now);
                let Some(live) = first_named::<bool>(REVOKE.run(client, args)?, "live")? else {
                    return Ok(None);
                };
                let args = Args::new()
                    .set("keepalive", keepalive)
                    .set("live", live)
                    .set("notify", notify);
                let mut ended = 0i64;
                for row in REVOKE_LEASES.run(client, args)? {
                    if let Some(lock_id) = row.get_by_name::<TextBuf, _>("lock_id")? {
                        wait::wake_head_at_commit(lock_id.as_text());
                        ended += 1;
                    }
                }
                Ok(Some(ended))
            })
        })?;
        commit::relax_if_only_leases(only_leases);
        Ok(ended)
    })
    .or_report()
}

/// Whether the caller's keep-alive is live and not ended, under the newest snapshot: what
/// a renewal that found nothing tries again for (`xact::while_briefly_locked`).
fn still_held(keepalive: i64, role: pg_sys::Oid, now: TimestampWithTimeZone) -> bool {
    let args = Args::new()
        .set("keepalive", keepalive)
        .set("role", role)
        .set("now", now);
    Spi::connect_mut(|_| {
        HELD.read_latest(args)
            .and_then(|row| row.get::<bool>("held"))
            == Some(true)
    })
}

/// Before a grant attached to `keepalive`: the keep-alive must be the calling role's, live
/// by the grant's clock and not ended. Its row stays share-locked to the end of the
/// transaction (sql/run/keepalive/attach.sql).
pub fn attach(
    keepalive: i64,
    role: pg_sys::Oid,
    now: TimestampWithTimeZone,
) -> Result<(), LockError> {
    let found = Spi::connect_mut(|client| {
        let args = Args::new()
            .set("keepalive", keepalive)
            .set("role", role)
            .set("now", now);
        Ok::<_, LockError>(first_named::<TimestampWithTimeZone>(
            ATTACH.run(client, args)?,
            "expires_at",
        )?)
    })?;
    match found {
        Some(_) => Ok(()),
        None => Err(LockError::KeepaliveNotLive { keepalive }),
    }
}

/// When a lease expires: its own `expires_at`, or for a lease attached to a keep-alive,
/// the keep-alive's (-infinity if the keep-alive is gone, which lockext never lets happen
/// while a lease is attached). Every statement that decides whether a lease is live or
/// free reads this; a lease without a keep-alive costs only the call.
///
/// Read under the newest snapshot, as the looks and the fence checks read the leases: a
/// REPEATABLE READ caller's snapshot may be older than the keep-alive, or than its last
/// renewal, and would show a live lease dead (a conflicting grant then went ahead beside
/// it: tests/isolation/specs/keepalive_snapshot.spec). A keep-alive's expiry only grows
/// but by its revocation, which ends it for good.
#[pg_extern(stable, parallel_restricted)]
fn lease_expiry(
    expires_at: Option<TimestampWithTimeZone>,
    keepalive: Option<i64>,
) -> Option<TimestampWithTimeZone> {
    let Some(keepalive) = keepalive else {
        return expires_at;
    };
    let found = Spi::connect_mut(|_| {
        EXPIRY
            .read_latest(Args::new().set("keepalive", keepalive))
            .and_then(|row| row.get::<TimestampWithTimeZone>("expires_at"))
    });
    Some(found.unwrap_or(TimestampWithTimeZone::negative_infinity()))
}

/// Ends `keepalive` if it has expired by `now` (sql/run/keepalive/end.sql): whether it is
/// ended now, for good. Called by the statements that take over or delete a lease that is
/// dead because its keep-alive expired, before they do.
#[pg_extern(volatile, parallel_unsafe)]
fn end_keepalive(keepalive: Option<i64>, now: Option<TimestampWithTimeZone>) -> bool {
    let (Some(keepalive), Some(now)) = (keepalive, now) else {
        return false;
    };
    Spi::connect_mut(|client| {
        let args = || Args::new().set("keepalive", keepalive).set("now", now);
        if first_named::<bool>(END.run(client, args())?, "ended")? == Some(true) {
            return Ok::<_, LockError>(true);
        }
        Ok(first_named::<bool>(ENDED.run(client, args())?, "ended")? == Some(true))
    })
    .or_report()
}
