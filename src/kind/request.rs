//! What an acquire asks for, validated: every argument is checked once, before anything is
//! written, so that a set of locks (`sets.rs`) shares it.

use std::time::Duration;

use pgrx::prelude::*;

use super::{parse, LeaseKind};
use crate::backend;
use crate::error::{self, LockError};
use crate::grant::Attachments;
use crate::session;
use crate::settings;
use crate::text::Text;

/// A validated acquire.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    pub lock_id: Text<'a>,
    pub owner: Text<'a>,
    pub ttl: Interval,
    pub wait: Duration,
    pub lock_delay: Duration,
    pub kind: &'static dyn LeaseKind,
    /// A semaphore's n (`permits`), or none.
    pub permits: Option<i32>,
    /// The session the lease ends with and the keep-alive that renews it (its `ttl` is then
    /// unused): given to the store step.
    pub attachments: Attachments,
}

impl<'a> Request<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn validate(
        lock_id: Text<'a>,
        owner: Option<Text<'a>>,
        ttl: Option<Interval>,
        wait: Option<Interval>,
        lock_delay: Option<Interval>,
        mode: Option<Text<'_>>,
        permits: Option<i32>,
        session_bound: Option<bool>,
        keepalive: Option<i64>,
    ) -> Result<Request<'a>, LockError> {
        let owner = error::identifier("owner", owner)?;
        let keepalive = error::optional_token("keepalive", keepalive)?;
        let ttl = match (keepalive, ttl) {
            (None, ttl) => error::ttl(ttl)?,
            // Unused: the statements store 'infinity' as an attached lease's own expiry
            // (its keep-alive's is the one in force: `keepalive::lease_expiry`). new()
            // fails only out of range, which one microsecond is not.
            (Some(_), None) => Interval::new(0, 0, 1).map_err(|_| LockError::KeepaliveWithTtl)?,
            (Some(_), Some(_)) => return Err(LockError::KeepaliveWithTtl),
        };
        // NULL waits no more than the default does: not at all.
        let wait = match wait {
            None => Duration::ZERO,
            some => error::duration("wait", some)?,
        };
        let lock_delay = match lock_delay {
            None => Duration::from_millis(settings::LOCK_DELAY_MS.get() as u64),
            some => error::duration("lock_delay", some)?,
        };
        let kind = parse(mode, permits)?;
        backend::writable_server()?;
        if !wait.is_zero() && backend::snapshot_per_transaction() {
            return Err(LockError::WaitNeedsReadCommitted);
        }
        if keepalive.is_some() {
            if session_bound == Some(true) {
                return Err(LockError::KeepaliveWithSession);
            }
            if backend::snapshot_per_transaction() {
                return Err(LockError::KeepaliveNeedsReadCommitted);
            }
        }
        let session = match session_bound {
            Some(true) => Some(session::this_session()?),
            _ => None,
        };
        Ok(Request {
            lock_id,
            owner,
            ttl,
            wait,
            lock_delay,
            kind,
            permits: permits.filter(|_| kind.counts_permits()),
            attachments: Attachments { session, keepalive },
        })
    }
}
