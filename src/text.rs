//! Text and jsonb values as PostgreSQL keeps them, passed through lockext untouched.
//!
//! pgrx's `&str` and `String` are UTF-8, and its conversions of `text` panic when the bytes
//! are not (every non-ASCII character of a LATIN1 database, any byte above 127 in a
//! SQL_ASCII one); its `JsonB` goes through serde_json, which cannot read a LATIN1 document
//! and rounds numbers to doubles. lockext never needs the characters of an id: it checks,
//! compares, sorts and hashes bytes, and hands them back to SQL. So lock ids, owners,
//! resource ids and modes stay bytes in the database's encoding from the argument to the
//! table and back to the caller, as PostgreSQL's own text functions keep them, and a jsonb
//! document is handed to SQL as it came. Only an error message shows an id as characters
//! (`Display`, which must make a UTF-8 Rust string of it).

use std::fmt;

use pgrx::callconv::{Arg, ArgAbi, BoxRet, FcInfo};
use pgrx::datum::{Datum, UnboxDatum};
use pgrx::nullable::Nullable;
use pgrx::{pg_sys, FromDatum, IntoDatum};

/// A `text` argument: its bytes, in the database's encoding, borrowed for the call. (Read
/// values from SPI as `TextBuf`: a borrowed one would point into memory SPI frees.)
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Text<'a>(&'a [u8]);

impl<'a> Text<'a> {
    pub const fn new(bytes: &'a [u8]) -> Text<'a> {
        Text(bytes)
    }

    pub fn bytes(self) -> &'a [u8] {
        self.0
    }

    /// Length in bytes, as `octet_length` counts it (what index keys are limited by).
    pub fn len(self) -> usize {
        self.0.len()
    }

    pub fn is_empty(self) -> bool {
        self.0.is_empty()
    }

    pub fn to_buf(self) -> TextBuf {
        TextBuf(self.0.to_vec())
    }

    /// The same text in ASCII alone, each other byte written `\xNN`: it reads the same in
    /// every encoding, for bytes whose encoding is not the reader's.
    pub fn ascii_escaped(self) -> TextBuf {
        let mut out = Vec::with_capacity(self.0.len());
        for &b in self.0 {
            if b.is_ascii() {
                out.push(b);
            } else {
                out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
            }
        }
        TextBuf(out)
    }
}

/// A `text` value of lockext's own: read back from its tables or shared memory, returned
/// to the caller.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct TextBuf(Vec<u8>);

impl TextBuf {
    pub fn from_bytes(bytes: Vec<u8>) -> TextBuf {
        TextBuf(bytes)
    }

    pub fn as_text(&self) -> Text<'_> {
        Text(&self.0)
    }
}

/// Shows the bytes as they are when they are UTF-8 (the database's encoding reads them as
/// the same characters: a message is sent in the database's encoding), and otherwise each
/// non-ASCII byte as `\xNN`: a Rust string cannot hold them, and ASCII reads the same in
/// every server encoding.
impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(self.0) {
            Ok(s) => f.write_str(s),
            // ASCII: valid UTF-8.
            Err(_) => f.write_str(&String::from_utf8_lossy(&self.ascii_escaped().0)),
        }
    }
}

impl fmt::Display for TextBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_text().fmt(f)
    }
}

impl fmt::Debug for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

impl fmt::Debug for TextBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_text().fmt(f)
    }
}

/// The bytes of a `text` datum, detoasted (a copy in the current memory context when it was
/// compressed or out of line, else the datum's own memory).
///
/// # Safety
/// `datum` is a non-null `text` (or `varchar`) datum that outlives `'a`.
unsafe fn text_bytes<'a>(datum: pg_sys::Datum) -> &'a [u8] {
    unsafe {
        let varlena = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
        pgrx::varlena::varlena_to_byte_slice(varlena)
    }
}

impl<'a> FromDatum for Text<'a> {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Text<'a>> {
        (!is_null && !datum.is_null()).then(|| Text(unsafe { text_bytes(datum) }))
    }
}

impl FromDatum for TextBuf {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<TextBuf> {
        (!is_null && !datum.is_null()).then(|| TextBuf(unsafe { text_bytes(datum) }.to_vec()))
    }
}

impl IntoDatum for Text<'_> {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        self.0.into_datum()
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::TEXTOID
    }

    fn is_compatible_with(other: pg_sys::Oid) -> bool {
        other == pg_sys::TEXTOID || other == pg_sys::VARCHAROID
    }
}

impl IntoDatum for TextBuf {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        self.0.as_slice().into_datum()
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::TEXTOID
    }

    fn is_compatible_with(other: pg_sys::Oid) -> bool {
        other == pg_sys::TEXTOID || other == pg_sys::VARCHAROID
    }
}

// The elements of a `text[]` argument (a set of lock ids), each copied out of the array.
unsafe impl UnboxDatum for TextBuf {
    type As<'src> = TextBuf;
    unsafe fn unbox<'src>(datum: Datum<'src>) -> TextBuf
    where
        Self: 'src,
    {
        TextBuf(
            unsafe { pgrx::varlena::varlena_to_byte_slice(datum.sans_lifetime().cast_mut_ptr()) }
                .to_vec(),
        )
    }
}

unsafe impl<'fcx> ArgAbi<'fcx> for Text<'fcx> {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        // Only a STRICT function takes a non-Option argument: PostgreSQL never passes it NULL.
        unsafe { arg.unbox_arg_using_from_datum() }
            .unwrap_or_else(|| panic!("argument {index} must not be null"))
    }

    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> Nullable<Self> {
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

unsafe impl BoxRet for TextBuf {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        match self.into_datum() {
            Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
            None => fcinfo.return_null(),
        }
    }
}

pgrx::impl_sql_translatable!(Text<'_>, "TEXT");
pgrx::impl_sql_translatable!(TextBuf, "TEXT");

/// A `jsonb` argument, handed on to SQL as the datum it came as: never parsed, so never
/// re-encoded or rounded.
#[derive(Clone, Copy)]
pub struct Jsonb(pg_sys::Datum);

impl FromDatum for Jsonb {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Jsonb> {
        // Detoasted, so that what SQL is handed is a value in memory, not a pointer into
        // another table's toast.
        (!is_null && !datum.is_null()).then(|| {
            Jsonb(pg_sys::Datum::from(unsafe {
                pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr())
            }))
        })
    }
}

impl IntoDatum for Jsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

unsafe impl<'fcx> ArgAbi<'fcx> for Jsonb {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        unsafe { arg.unbox_arg_using_from_datum() }
            .unwrap_or_else(|| panic!("argument {index} must not be null"))
    }

    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> Nullable<Self> {
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

unsafe impl BoxRet for Jsonb {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        unsafe { fcinfo.return_raw_datum(self.0) }
    }
}

impl Jsonb {
    /// Its size in bytes, as PostgreSQL stores it (without the varlena header).
    pub fn len(&self) -> usize {
        unsafe { pgrx::varlena::varsize_any_exhdr(self.0.cast_mut_ptr()) }
    }

    /// A jsonb column of a row SPI returned, detoasted and copied into the memory of SPI's
    /// caller, where it outlives `SPI_finish`: a `Jsonb` read with `FromDatum` there would
    /// point into the tuple table SPI frees. Call only while connected to SPI.
    ///
    /// # Safety
    /// `datum` must be a jsonb datum of a row of the current SPI tuple table.
    pub unsafe fn transferred(datum: pg_sys::Datum) -> Jsonb {
        unsafe {
            let flat = pg_sys::pg_detoast_datum(datum.cast_mut_ptr());
            Jsonb(pg_sys::SPI_datumTransfer(
                pg_sys::Datum::from(flat),
                false,
                -1,
            ))
        }
    }
}

pgrx::impl_sql_translatable!(Jsonb, "jsonb");
