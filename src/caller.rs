//! Who is calling: the one role a lease function acts for.
//!
//! A lease belongs to the database role that took it (`holder_role`), and only that role
//! (or a member of `lockext_admin`) may renew or release it. So the role must be the one
//! whose code is running, as PostgreSQL itself decides it: the current user when the
//! function is called. Inside a SECURITY DEFINER function that role is gone (the current
//! user is the definer), and the "outer" user that 0.2.0 used instead is only the
//! session's role: inside `ANALYZE`, autovacuum's analyze, `REFRESH MATERIALIZED VIEW`,
//! `REINDEX`, an index expression, or another role's SECURITY DEFINER function, the outer
//! user is whoever started it while the code that runs is another role's. A member could
//! then have an administrator's maintenance release a victim's lease.
//!
//! So the lease functions are SECURITY INVOKER, and `as_owner` does what SECURITY DEFINER
//! would, keeping the caller: it records the current user as the caller, becomes the owner
//! of lockext's schema (who owns its tables) for the body, and restores both afterwards,
//! on an error too.
//!
//! Who may call: every function that needs `lockext_user` (or `lockext_admin`) is
//! executable by PUBLIC and checks the caller's privileges itself, first (`require`):
//! PostgreSQL's own EXECUTE check would refuse a non-member before any of lockext's code
//! ran, with "permission denied for function <name>", naming an internal function when a
//! wrapper or the fence_guard trigger called it, and never the role to grant. The check
//! is the one PostgreSQL makes for a grant to a role: the privileges of that role
//! (membership with INHERIT; superusers have them).

use std::cell::Cell;

use pgrx::pg_sys;

use crate::backend;
use crate::catalog;
use crate::error::LockError;
use crate::statements::{first_named, Args, Statement};

static SCHEMA_OWNER: Statement = Statement {
    sql: include_str!("../sql/run/caller/schema_owner.sql"),
    params: &[("schema", pg_sys::BuiltinOid::OIDOID)],
};

thread_local! {
    static CALLER: Cell<Option<pg_sys::Oid>> = const { Cell::new(None) };
    /// (schema oid, its owner): looked up once per backend and schema.
    static OWNER: Cell<Option<(pg_sys::Oid, pg_sys::Oid)>> = const { Cell::new(None) };
}

/// The role the running lease function acts for. Only inside `as_owner`.
pub fn role() -> pg_sys::Oid {
    CALLER
        .with(|c| c.get())
        .unwrap_or_else(backend::current_user)
}

/// Restores the caller's user and security context, and the previous caller, when dropped:
/// on return, and on an error unwinding through it.
struct Restore {
    user: pg_sys::Oid,
    context: i32,
    caller: Option<pg_sys::Oid>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        backend::set_user_and_context(self.user, self.context);
        CALLER.with(|c| c.set(self.caller));
    }
}

/// Runs `body` for the current user, as the owner of lockext's tables.
pub fn as_owner<R>(body: impl FnOnce() -> Result<R, LockError>) -> Result<R, LockError> {
    let (user, context) = backend::user_and_context();
    let owner = owner()?;
    let _restore = Restore {
        user,
        context,
        caller: CALLER.with(|c| c.replace(Some(user))),
    };
    backend::set_user_and_context(owner, context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32);
    body()
}

fn owner() -> Result<pg_sys::Oid, LockError> {
    let schema = catalog::lockext_schema();
    if let Some((cached, owner)) = OWNER.with(|o| o.get()) {
        if cached == schema {
            return Ok(owner);
        }
    }
    // Through a prepared read (`Statement`), which assigns no transaction id: on a hot
    // standby the function must still get as far as saying "connect to the primary".
    let owner = pgrx::Spi::connect_mut(|client| {
        first_named::<pg_sys::Oid>(
            SCHEMA_OWNER.run(client, Args::new().set("schema", schema))?,
            "nspowner",
        )
    })?
    .ok_or(LockError::MissingColumn { name: "nspowner" })?;
    OWNER.with(|o| o.set(Some((schema, owner))));
    Ok(owner)
}

/// Whether the calling role has the privileges of `lockext_admin` (superusers do): as
/// PostgreSQL grants them, through memberships that are inherited. Not mere membership
/// (`is_member_of_role`): a member through a NOINHERIT role, or from 16 on through a grant
/// `WITH INHERIT FALSE` (even `SET FALSE`, which cannot become the role at all), has none
/// of the role's privileges, and had lockext's administrator power all the same. The
/// statements that let an administrator renew or release another role's lease ask the
/// same (`pg_has_role(..., 'USAGE')`).
pub fn is_admin() -> bool {
    catalog::has_privileges_of_named(role(), c"lockext_admin")
}

/// The role whose privileges a function needs.
#[derive(Clone, Copy)]
pub enum Needs {
    /// `lockext_user`: the lease and fence functions.
    User,
    /// `lockext_admin`, to do `action` (an operator's decision).
    Admin { action: &'static str },
}

/// Refuses the current user unless it has the privileges of the role `needs` (42501, with
/// the GRANT that would give them). Runs before anything else a function does.
pub fn require(needs: Needs) -> Result<(), LockError> {
    let (role, role_name, action) = match needs {
        Needs::User => (c"lockext_user", "lockext_user", "use lockext"),
        Needs::Admin { action } => (c"lockext_admin", "lockext_admin", action),
    };
    let user = backend::current_user();
    if catalog::has_privileges_of_named(user, role) {
        return Ok(());
    }
    let (name, grantee) = catalog::role_name(user)
        .unwrap_or_else(|| (user.to_u32().to_string(), user.to_u32().to_string()));
    Err(LockError::NotPermitted {
        action,
        role: name,
        grantee,
        needs: role_name,
    })
}

/// `as_owner`, for a caller with the privileges of `lockext_user`.
pub fn as_member<R>(body: impl FnOnce() -> Result<R, LockError>) -> Result<R, LockError> {
    require(Needs::User)?;
    as_owner(body)
}
