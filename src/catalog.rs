//! Names looked up in PostgreSQL's catalogs, in one place: the lockext schema and its
//! relations, types and columns, roles and their privileges, a role's and a database's name, and pg_database read by a background
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

/// The oid of relation `lockext.<name>`, if the schema and the relation exist.
pub fn lockext_relation(name: &CStr) -> Option<pg_sys::Oid> {
    let schema = lockext_schema();
    if schema == pg_sys::InvalidOid {
        return None;
    }
    let oid = unsafe { pg_sys::get_relname_relid(name.as_ptr(), schema) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// The schema of relation `relation`; InvalidOid when there is no such relation.
pub fn relation_namespace(relation: pg_sys::Oid) -> pg_sys::Oid {
    unsafe { pg_sys::get_rel_namespace(relation) }
}

/// Whether relation `pg_catalog.<name>` exists (a catalog-cache lookup): Citus's catalogs
/// (`pg_dist_partition`) exist only in a database with the citus extension.
pub fn has_catalog_relation(name: &CStr) -> bool {
    let oid =
        unsafe { pg_sys::get_relname_relid(name.as_ptr(), pg_sys::PG_CATALOG_NAMESPACE.into()) };
    oid != pg_sys::InvalidOid
}

/// The oid of type `lockext.<name>`, if it exists: a catalog-cache lookup, as
/// `TypenameNspGetTypid` makes it (the name is passed as a C string, as PostgreSQL's own
/// lookups by name pass it).
pub fn lockext_type(name: &CStr) -> Option<pg_sys::Oid> {
    let schema = lockext_schema();
    if schema == pg_sys::InvalidOid {
        return None;
    }
    let oid = unsafe {
        pg_sys::GetSysCacheOid(
            pg_sys::SysCacheIdentifier::TYPENAMENSP as i32,
            pg_sys::Anum_pg_type_oid as pg_sys::AttrNumber,
            pg_sys::Datum::from(name.as_ptr()),
            pg_sys::Datum::from(schema),
            pg_sys::Datum::from(0usize),
            pg_sys::Datum::from(0usize),
        )
    };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// Whether relation `relation` has a column named `column` (a dropped one does not count).
pub fn has_column(relation: pg_sys::Oid, column: &CStr) -> bool {
    unsafe { pg_sys::get_attnum(relation, column.as_ptr()) > 0 }
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

/// One row of pg_database, as much of it as the launcher needs.
pub struct Database {
    pub oid: u32,
    pub name: String,
    pub owner: u32,
    pub allows_connections: bool,
    pub template: bool,
    /// `datconnlimit = -2`: a DROP DATABASE that was interrupted; nobody may connect.
    pub invalid: bool,
}

/// pg_database, read with a plain scan: a process connected to no database cannot use
/// catalog indexes until some backend has cached them. In a transaction. Sound: the
/// relation is opened and locked (AccessShareLock) for the scan; each tuple returned is a
/// valid pg_database row until the next `heap_getnext`, and its fixed part (up to
/// `datname`, `datdba`, `datallowconn`, `datistemplate`, `datconnlimit`, all before the
/// first nullable column) is read and copied before that.
pub fn databases() -> Vec<Database> {
    let mut rows = Vec::new();
    unsafe {
        let rel = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as _);
        let scan = pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut());
        loop {
            let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tuple.is_null() {
                break;
            }
            let header = (*tuple).t_data;
            let row = &*((header as *const u8).add((*header).t_hoff as usize)
                as *const pg_sys::FormData_pg_database);
            rows.push(Database {
                oid: row.oid.to_u32(),
                name: CStr::from_ptr(row.datname.data.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
                owner: row.datdba.to_u32(),
                allows_connections: row.datallowconn,
                template: row.datistemplate,
                invalid: row.datconnlimit == -2,
            });
        }
        pg_sys::table_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as _);
    }
    rows
}

/// Holds `relation` in ROW EXCLUSIVE mode (what its writers take) to the end of the
/// transaction: DDL that takes a conflicting lock (Citus's create_distributed_table takes
/// EXCLUSIVE) waits until then.
pub fn hold_as_writer(relation: pg_sys::Oid) {
    unsafe { pg_sys::LockRelationOid(relation, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) };
}
