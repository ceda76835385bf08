//! The cluster's own record of token eras: a small file in the data directory.
//!
//! lockext's tables cannot tell a restored or reinstalled lockext which tokens were already
//! handed out: `pg_restore` brings back the state of the dump, not of the moment before the
//! restore, and `DROP EXTENSION` takes the tables with it. This file stays with the cluster
//! (pg_dump never copies it, DROP EXTENSION and DROP DATABASE never remove it) and is
//! written, and flushed, before the first token of a new era is handed out. It says:
//!
//! - `max LAYOUT ERA`: the highest era each token layout (`token.rs`) has used in this
//!   cluster, in any database;
//! - `db OID LAYOUT SYSTEM TIMELINE SEQUENCE ERA`: for each database, the era in force and
//!   the history it belongs to (system identifier, WAL timeline, the oid of the token
//!   sequence). Only the newest history of a database is kept: an older one never comes
//!   back, and if it seemed to (an oid used again), forgetting it only costs a new era.
//!
//! It changes only when an era does (a failover, a restore, a reinstall), so it is
//! rewritten whole: a temporary file, fsync, rename, fsync of the directory, under an
//! exclusive `flock` held for that moment only. A file copied with the data directory (a
//! base backup, a standby) is older than the cluster it lands in, which only makes that
//! cluster's eras start from a lower known maximum; `token.rs` says why that is safe.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::PathBuf;

use std::sync::atomic::{AtomicU64, Ordering};

use pgrx::pg_sys;
use pgrx::{pg_guard, pg_shmem_init, PgAtomic};

use crate::error::LockError;
use crate::settings;

const DIR: &str = "pg_lockext";
const FILE: &str = "eras";
const HEADER: &str = "lockext-eras 1";

/// The era in force in one database, and the history it belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Current {
    pub layout: u8,
    pub system: u64,
    pub timeline: u32,
    pub sequence: u32,
    pub era: i64,
}

#[derive(Clone, Default, PartialEq, Eq, Debug)]
pub struct Record {
    /// Highest era used, by layout.
    pub max: BTreeMap<u8, i64>,
    /// Era in force, by database oid.
    pub current: BTreeMap<u32, Current>,
}

impl Record {
    pub fn parse(text: &str) -> Result<Record, String> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(format!("the first line is not \"{HEADER}\""));
        }
        let mut record = Record::default();
        for (n, line) in lines.enumerate() {
            let bad = || format!("line {} is not understood: {line:?}", n + 2);
            let words: Vec<&str> = line.split_ascii_whitespace().collect();
            let num = |i: usize| -> Result<i64, String> {
                words
                    .get(i)
                    .and_then(|w| w.parse::<i64>().ok())
                    .ok_or_else(bad)
            };
            match words.first() {
                Some(&"max") if words.len() == 3 => {
                    let layout = u8::try_from(num(1)?).map_err(|_| bad())?;
                    record.max.insert(layout, num(2)?);
                }
                Some(&"db") if words.len() == 7 => {
                    let database = u32::try_from(num(1)?).map_err(|_| bad())?;
                    let current = Current {
                        layout: u8::try_from(num(2)?).map_err(|_| bad())?,
                        system: words[3].parse::<u64>().map_err(|_| bad())?,
                        timeline: u32::try_from(num(4)?).map_err(|_| bad())?,
                        sequence: u32::try_from(num(5)?).map_err(|_| bad())?,
                        era: num(6)?,
                    };
                    record.current.insert(database, current);
                }
                None => {}
                _ => return Err(bad()),
            }
        }
        Ok(record)
    }

    pub fn render(&self) -> String {
        let mut text = format!("{HEADER}\n");
        for (layout, era) in &self.max {
            text.push_str(&format!("max {layout} {era}\n"));
        }
        for (db, c) in &self.current {
            text.push_str(&format!(
                "db {db} {} {} {} {} {}\n",
                c.layout, c.system, c.timeline, c.sequence, c.era
            ));
        }
        text
    }
}

fn dir() -> PathBuf {
    // Backends run in the data directory; DataDir says so explicitly.
    let data = unsafe { CStr::from_ptr(pg_sys::DataDir) };
    PathBuf::from(data.to_string_lossy().into_owned()).join(DIR)
}

fn failed(what: &str, e: impl std::fmt::Display) -> LockError {
    LockError::EraRecord {
        detail: format!("{what}: {e}"),
    }
}

fn read_at(path: &PathBuf) -> Result<Record, LockError> {
    match fs::read_to_string(path) {
        Ok(text) => Record::parse(&text).map_err(|e| failed(&path.display().to_string(), e)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Record::default()),
        Err(e) => Err(failed(&format!("cannot read {}", path.display()), e)),
    }
}

/// The record as it is on disk; empty if there is none yet.
pub fn read() -> Result<Record, LockError> {
    read_at(&dir().join(FILE))
}

/// How many times this server rewrote the record: only `update` writes it, so when lockext
/// is preloaded a backend learns of a rewrite from this counter in shared memory instead of
/// a `stat` of the file on every grant. A new server starts with new shared memory, and its
/// backends with nothing cached.
static REWRITES: PgAtomic<AtomicU64> = unsafe { PgAtomic::new(c"lockext_era_rewrites") };

pub fn init_shared_memory() {
    pg_shmem_init!(REWRITES);
}

/// Which version of the record is on disk: a backend that cached what it read compares
/// this on every grant, and reads the record again when another backend has rewritten it
/// (always by rename). Preloaded, the number of rewrites since the server started; else
/// the file's inode and change time (one `stat`; None when there is no file).
pub fn version() -> Option<(u64, i64, i64)> {
    if settings::preloaded() {
        return Some((0, REWRITES.get().load(Ordering::Acquire) as i64, 0));
    }
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(dir().join(FILE)).ok()?;
    Some((meta.ino(), meta.ctime(), meta.ctime_nsec()))
}

/// Reads the record under an exclusive lock, lets `change` decide, and writes the record
/// back durably if `change` changed it, before returning what `change` returned.
pub fn update<T>(change: impl FnOnce(&mut Record) -> Result<T, LockError>) -> Result<T, LockError> {
    let dir = dir();
    fs::create_dir_all(&dir).map_err(|e| failed(&format!("cannot create {}", dir.display()), e))?;
    let lock_path = dir.join("lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| failed(&format!("cannot open {}", lock_path.display()), e))?;
    lock.lock()
        .map_err(|e| failed(&format!("cannot lock {}", lock_path.display()), e))?;
    let path = dir.join(FILE);
    let before = read_at(&path)?;
    let mut after = before.clone();
    let result = change(&mut after)?;
    if after != before {
        write_durably(&dir, &path, &after.render())?;
        if settings::preloaded() {
            // Only once the new record is in place: a backend that sees the new count
            // reads the new record.
            REWRITES.get().fetch_add(1, Ordering::Release);
        }
    }
    drop(lock); // closing the file releases the lock
    Ok(result)
}

fn write_durably(dir: &PathBuf, path: &PathBuf, text: &str) -> Result<(), LockError> {
    let tmp = dir.join(format!("{FILE}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    };
    write().map_err(|e| failed(&format!("cannot write {}", path.display()), e))
}
