//! Kinds of lease: what each provides (`LeaseKind`), which there are (`KINDS`, the one
//! place a kind is registered), and what an acquire asks for (`Request`).
//!
//! A kind says how its acquire passes the gate (its mode, and any claim of its own), how far
//! back in the wait queue a waiter may try, where its leases live (its `Store`), which look
//! it reads, and what it decides from the look. It decides only: the route of an acquire
//! (`lease.rs`) runs the steps, the same for every kind, and the store step (`grant::store`)
//! carries out the decision. No kind knows another.
//!
//! - `exclusive.rs`: one holder at a time, a row of `lockext.locks`.
//! - `shared.rs`: shared (read) leases, side by side, rows of `lockext.shared_leases`.
//! - `semaphore.rs`: the n permits of a semaphore, rows of `lockext.shared_leases`.
//! - `many.rs`: what the last two share: their table and how they read their look.

mod exclusive;
mod many;
mod request;
mod semaphore;
mod shared;

pub use request::Request;

use pgrx::spi::SpiClient;

use crate::claims::{self, Gate};
use crate::error::{self, LockError};
use crate::grant::{Attachments, Decision, Granted, Params, Seen, Store};
use crate::statements::Statement;
use crate::text::Text;

/// What a kind of lease provides. Each kind implements it once, in a module of its own.
pub trait LeaseKind: Sync {
    /// lock_acquire's `mode` for this kind, and whether it is a semaphore's (`permits`
    /// given): the two together choose the kind (`parse`).
    fn mode(&self) -> &'static str;
    fn counts_permits(&self) -> bool {
        false
    }

    /// The gate's mode (`claims.rs`): an acquire of an exclusive mode goes alone, one of a
    /// shared mode side by side with the others.
    fn gate_mode(&self) -> claims::Mode;

    /// A claim of the kind's own, taken right after the gate as part of it: false when an
    /// acquire that conflicts with this one is in flight.
    fn pass_after_gate(&self, _lock_id: Text<'_>) -> Result<bool, LockError> {
        Ok(true)
    }

    /// How far back in the wait queue a waiter may try (`wait.rs`): 1, the head alone,
    /// unless the kind can hand several leases over at once.
    fn queue_window(&self, _request: &Request<'_>) -> usize {
        1
    }

    /// Whether a lock id has many holders of this kind at once: a grant then wakes the next
    /// in line at commit, who may be free to take one too.
    fn many_holders(&self) -> bool;

    /// The statements that store a lease of this kind (its table's).
    fn store(&self) -> &'static Store;

    /// Before the look, a grant in one statement when the lock id has no lease at all;
    /// None: not granted that way (then the look follows).
    fn store_if_free(
        &self,
        _client: &mut SpiClient<'_>,
        _params: &Params<'_>,
        _attached: &Attachments,
    ) -> Result<Option<Granted>, LockError> {
        Ok(None)
    }

    /// The statement of the look (`grant::look_at`).
    fn look(&self) -> &'static Statement;

    /// What to do, from the look: refuse, or a plan for the store step. A claim taken
    /// here that the try must give back if it grants nothing goes into `taken`.
    fn decide(
        &self,
        request: &Request<'_>,
        leases: &[Seen],
        now: i64,
        params: &mut Params<'_>,
        taken: &mut Taken,
    ) -> Result<Decision, LockError>;
}

/// Every kind of lease, in the order `parse` tries them.
static KINDS: &[&dyn LeaseKind] = &[
    &exclusive::Exclusive,
    &shared::Shared,
    &semaphore::Semaphore,
];

/// The kind lock_acquire's `mode` and `permits` ask for; NULL means the default, as for
/// `wait`.
pub fn parse(
    mode: Option<Text<'_>>,
    permits: Option<i32>,
) -> Result<&'static dyn LeaseKind, LockError> {
    let asked = mode.map_or(&b"exclusive"[..], Text::bytes);
    let of_mode = |kind: &dyn LeaseKind| kind.mode().as_bytes() == asked;
    if !KINDS.iter().any(|kind| of_mode(*kind)) {
        return Err(LockError::UnknownMode {
            mode: mode.map(|m| m.to_string()).unwrap_or_default(),
        });
    }
    if let Some(permits) = permits {
        if !(1..=error::MAX_PERMITS).contains(&permits) {
            return Err(LockError::PermitsOutOfRange { permits });
        }
    }
    KINDS
        .iter()
        .find(|kind| of_mode(**kind) && kind.counts_permits() == permits.is_some())
        .copied()
        .ok_or(LockError::SharedPermits)
}

/// The claims a try took in its decision beyond the gate, given back when the try grants
/// nothing (`give_back`), kept with the grant otherwise.
#[derive(Default)]
pub struct Taken {
    gate: Option<Gate>,
}

impl Taken {
    pub fn gate(&mut self, gate: Gate) {
        self.gate = Some(gate);
    }

    pub fn give_back(self) {
        if let Some(gate) = self.gate {
            gate.reopen();
        }
    }
}
