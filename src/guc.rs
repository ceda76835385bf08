//! Settings as PostgreSQL defines them, where pgrx's safe API does not reach: a setting
//! with a hook run after each change of its value, and reserving lockext's prefix.
//! `settings.rs` and `explore.rs` define their settings through pgrx's safe functions and
//! ask here for the rest.
//!
//! Why the calls are sound: pgrx makes a setting with hooks `unsafe` only because a hook
//! that raises or panics must not unwind into PostgreSQL's C frames; the one hook here
//! (`assigned`) is `#[pg_guard]`, ignores its pointer argument and calls a plain Rust
//! `fn()`. `MarkGUCPrefixReserved` takes a NUL-terminated string we own for the call.

use std::ffi::{c_void, CStr};

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::{pg_guard, pg_sys};

/// What runs after a setting's value changes (set, reset, a transaction's end that undoes
/// a SET LOCAL): a type, so that its hook is a function of its own.
pub trait OnAssign {
    fn assigned();
}

#[pg_guard]
extern "C-unwind" fn assigned_int<A: OnAssign>(_new: i32, _extra: *mut c_void) {
    A::assigned();
}

#[pg_guard]
extern "C-unwind" fn assigned_bool<A: OnAssign>(_new: bool, _extra: *mut c_void) {
    A::assigned();
}

/// An integer setting, as `GucRegistry::define_int_guc`, with `A::assigned` run after each
/// change of its value.
#[allow(clippy::too_many_arguments)]
pub fn define_int_on_assign<A: OnAssign>(
    name: &'static CStr,
    short_description: &'static CStr,
    long_description: &'static CStr,
    setting: &'static GucSetting<i32>,
    min: i32,
    max: i32,
    context: GucContext,
    flags: GucFlags,
) {
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            name,
            short_description,
            long_description,
            setting,
            min,
            max,
            context,
            flags,
            None,
            Some(assigned_int::<A>),
            None,
        );
    }
}

/// A boolean setting, as `GucRegistry::define_bool_guc`, with `A::assigned` run after each
/// change of its value.
pub fn define_bool_on_assign<A: OnAssign>(
    name: &'static CStr,
    short_description: &'static CStr,
    long_description: &'static CStr,
    setting: &'static GucSetting<bool>,
    context: GucContext,
    flags: GucFlags,
) {
    unsafe {
        GucRegistry::define_bool_guc_with_hooks(
            name,
            short_description,
            long_description,
            setting,
            context,
            flags,
            None,
            Some(assigned_bool::<A>),
            None,
        );
    }
}

/// Reserves `prefix`: a `prefix.*` value that is not a defined setting is removed (with a
/// WARNING) and can no longer be set. Call after every setting of the prefix is defined.
pub fn reserve_prefix(prefix: &CStr) {
    unsafe { pg_sys::MarkGUCPrefixReserved(prefix.as_ptr()) };
}
