//! Names looked up in PostgreSQL's catalogs, in one place: the lockext schema, roles and
//! their privileges, a role's and a database's name, and pg_database read by a background
//! worker. Everything else asks here instead of calling the catalog functions itself.
//!
//! Why the calls are sound: each takes a NUL-terminated name we own (a C string literal)
//! or an oid, and returns an oid, a flag, or a string palloc'd in the current memory
//! context, which is copied into Rust before anything else runs; a null is handled (the
//! `missing_ok` forms return InvalidOid or null instead of raising).

use std::ffi::CStr;

use pgrx::pg_sys;

use crate::text::Text;

/// The oid of the lockext schema, or InvalidOid when it does not exist (yet).
pub fn lockext_schema() -> pg_sys::Oid {
    unsafe { pg_sys::get_namespace_oid(c"lockext".as_ptr(), true) }
}

/// The oid of the role named `name`, if it exists.
pub fn role(name: &CStr) -> Option<pg_sys::Oid> {
    let oid = unsafe { pg_sys::get_role_oid(name.as_ptr(), true) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// Whether `member` has the privileges of `role`: through memberships that are inherited,
/// as PostgreSQL grants them (superusers have every role's).
pub fn has_privileges_of(member: pg_sys::Oid, role: pg_sys::Oid) -> bool {
    unsafe { pg_sys::has_privs_of_role(member, role) }
}

/// Whether `member` has the privileges of the role named `name` (false if there is none).
pub fn has_privileges_of_named(member: pg_sys::Oid, name: &CStr) -> bool {
    role(name).is_some_and(|role| has_privileges_of(member, role))
}

/// A role's name and the same quoted as an identifier (for a GRANT), as text in the
/// database's encoding; None when the role is gone.
pub fn role_name(role: pg_sys::Oid) -> Option<(String, String)> {
    unsafe {
        let name = pg_sys::GetUserNameFromId(role, true);
        if name.is_null() {
            return None;
        }
        // A role name is text in the encoding of the database that created it.
        let quoted = CStr::from_ptr(pg_sys::quote_identifier(name));
        Some((
            Text::new(CStr::from_ptr(name).to_bytes()).to_string(),
            Text::new(quoted.to_bytes()).to_string(),
        ))
    }
}

/// The name of the database `database`, None when it is gone.
pub fn database_name(database: pg_sys::Oid) -> Option<String> {
    let name = unsafe { pg_sys::get_database_name(database) };
    if name.is_null() {
        return None;
    }
    Some(
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    )
}
