"""What the sync and async grants share: errors, argument checks, SQL, the local lease clock."""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import secrets
import socket
import time
from typing import NamedTuple

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo


class Error(Exception):
    """A lockext error. `sqlstate` is the server's code when the server raised it."""

    def __init__(self, message: str, sqlstate: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate


class NotAcquired(Error):
    """lock_acquire refused the lock: a live lease holds it (and `wait` ran out)."""


class LeaseLost(Error):
    """The lease ended while you believed you held it: stop working."""


class StaleToken(LeaseLost):
    """A fenced write was refused (SQLSTATE 55L01, or fenced_update said false): a holder
    with a newer token has written. A retry with the same token can never succeed."""


class InvalidArgument(Error, ValueError):
    """An argument was refused: by the client before anything was sent (sqlstate None;
    the message shows the value passed, as repr), or by the server (22023, 22004, 22001,
    42809)."""


class ReadOnlyServer(Error):
    """Connected to a hot standby (25006): connect to the primary."""


class PermissionDenied(Error):
    """The role is not a member of lockext_user (42501)."""


class NotSupported(Error):
    """0A000: e.g. session_bound where lockext.session_leases is off (behind PgBouncer)."""


# lockext's errors (docs/errors.md in its repository), where a distinct exception helps the
# caller decide what to do.
# Other SQLSTATEs (and connection failures) stay psycopg's own exceptions.
_BY_SQLSTATE = {
    "55L01": StaleToken,
    "22023": InvalidArgument,
    "22004": InvalidArgument,
    "22001": InvalidArgument,
    "42809": InvalidArgument,
    "25006": ReadOnlyServer,
    "42501": PermissionDenied,
    "0A000": NotSupported,
    "2200H": Error,
    "58030": Error,
}


# 55000 where the call named a keep-alive: it is not live (expired, revoked, ended by a
# grant over its leases, or another role's). Elsewhere 55000 means other things (an older
# SQL script calling a newer library), so it is mapped only there.
KEEPALIVE_NOT_LIVE = {"55000": LeaseLost}


@contextlib.contextmanager
def mapped_errors(only=None, extra=None):
    """Re-raises a psycopg error whose SQLSTATE lockext documents (or one of `only`), or
    one of `extra` (SQLSTATE: class), as lockext's exception."""
    try:
        yield
    except psycopg.Error as e:
        cls = (extra or {}).get(e.sqlstate or "") or _BY_SQLSTATE.get(e.sqlstate or "")
        if cls is None or (only is not None and e.sqlstate not in only):
            raise
        raise cls(e.diag.message_primary or str(e), e.sqlstate) from e


def interval(value, name: str, *, zero_ok: bool) -> datetime.timedelta:
    """Seconds (int or float) or a timedelta, as a timedelta, which psycopg sends as an
    interval: a bare number would make PostgreSQL look for lock_acquire(text, text,
    integer), which does not exist (42883). Anything else raises InvalidArgument."""
    if isinstance(value, datetime.timedelta):
        td = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise InvalidArgument(f"{name} must be a finite number of seconds, got {value!r}")
        try:
            td = datetime.timedelta(seconds=value)
        except OverflowError:  # beyond timedelta's range (about 2.7 million years)
            raise InvalidArgument(f"{name} is out of range, got {value!r}") from None
    else:
        raise InvalidArgument(f"{name} must be seconds (int or float) or a timedelta, got {value!r}")
    if td < datetime.timedelta(0) or (td == datetime.timedelta(0) and not zero_ok):
        raise InvalidArgument(f"{name} must be {'>= 0' if zero_ok else '> 0'}, got {value!r}")
    return td


def identifier(value, name: str) -> str:
    """A lock id or owner: a non-empty str (the server bounds its length: 22001). bytes
    are refused rather than sent as bytea, which would name another lock."""
    if not isinstance(value, str) or value == "":
        raise InvalidArgument(f"{name} must be a non-empty str, got {value!r}")
    return value


def owner_of(owner) -> str:
    """The owner given, or a new default one when None (never for an empty string)."""
    return default_owner() if owner is None else identifier(owner, "owner")


def lock_ids_of(lock_ids) -> list:
    """A list (or other iterable, not a str) of lock ids, at least one."""
    if isinstance(lock_ids, (str, bytes)) or not hasattr(lock_ids, "__iter__"):
        raise InvalidArgument(f"lock_ids must be a list of lock ids, got {lock_ids!r}")
    ids = list(lock_ids)
    if not ids:
        raise InvalidArgument(f"lock_ids must not be empty, got {lock_ids!r}")
    return [identifier(i, "lock id") for i in ids]


def mode_of(mode) -> str:
    if mode not in ("exclusive", "shared"):
        raise InvalidArgument(f"mode must be 'exclusive' or 'shared', got {mode!r}")
    return mode


def permits_of(permits):
    if permits is not None and (not isinstance(permits, int) or isinstance(permits, bool)):
        raise InvalidArgument(f"permits must be an int or None, got {permits!r}")
    return permits


def token_of(value, name: str = "token") -> int:
    """A fence token (or keep-alive id): a positive int."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidArgument(f"{name} must be a positive int, got {value!r}")
    return value


def flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be True or False, got {value!r}")
    return value


def default_owner() -> str:
    """host:pid:random. Random per grant, not per process: two grants of one process with
    the same owner on one lock id would be one lease (lock_acquire gives an owner its own
    live grant back), so both would run."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"


def conninfo_of(target) -> str:
    """The conninfo of a connection string, or of a psycopg (Async)Connection: the library
    opens a connection of its own with it instead of using the caller's (see connect_kwargs)."""
    if isinstance(target, str):
        return target
    info = getattr(target, "info", None)
    if isinstance(info, psycopg.ConnectionInfo):
        # info.dsn leaves the password out on purpose; libpq still knows it.
        return make_conninfo(info.dsn, password=info.password) if info.password else info.dsn
    raise InvalidArgument(f"expected a conninfo string or a psycopg connection, got {target!r}")


def connect_kwargs(conninfo: str) -> dict:
    """How the library's own connection is made, and why:
    - autocommit: a grant must be committed to exist for anyone else. On a psycopg
      connection that is not in autocommit, lock_acquire opens an implicit transaction,
      the lease stays invisible and locked, renewals see nothing to renew (NULL), and
      nobody else can take the lock until that transaction ends.
    - prepare_threshold=None: psycopg otherwise prepares a statement by name after 5 runs
      (every renewal is the same statement), and a transaction-pooling PgBouncer sends the
      next run to a server connection that never saw it."""
    kwargs = {"autocommit": True, "prepare_threshold": None}
    if "application_name" not in conninfo_to_dict(conninfo) and "PGAPPNAME" not in os.environ:
        kwargs["application_name"] = "lockext-python"  # shows in lockext.holders
    return kwargs


# valid_for: the grant's expiry less the time the server received the statement
# (statement_timestamp), in seconds. The statement was sent before it arrived, so the
# lease is live until at least `sent + valid_for` by our own clock, however long the call
# waited in the server (a waiting acquire is granted at the end of its wait, not at its
# start).
VALID_FOR = "extract(epoch FROM expires_at - statement_timestamp())::float8"
ACQUIRE = (
    f"SELECT fence_token, expires_at, {VALID_FOR} FROM lockext.lock_acquire(%s::text, %s::text, %s::interval,"
    " wait => %s::interval, mode => %s::text, permits => %s::integer, session_bound => %s::boolean)"
)
# A lease attached to a keep-alive: sent only then, so that plain leases work with a server
# whose lock_acquire has no keepalive argument.
ACQUIRE_ATTACHED = (
    f"SELECT fence_token, expires_at, {VALID_FOR} FROM lockext.lock_acquire(%s::text, %s::text, %s::interval,"
    " wait => %s::interval, mode => %s::text, permits => %s::integer, session_bound => %s::boolean,"
    " keepalive => %s::bigint)"
)
KEEPALIVE_GRANT = f"SELECT keepalive, expires_at, {VALID_FOR} FROM lockext.lock_keepalive_grant(%s::interval)"
KEEPALIVE_RENEW = "SELECT lockext.lock_keepalive_renew(%s::bigint, %s::interval)"
KEEPALIVE_REVOKE = "SELECT lockext.lock_keepalive_revoke(%s::bigint)"
CAMPAIGN = (
    f"SELECT fence_token, expires_at, {VALID_FOR} FROM lockext.lock_campaign(%s::text, %s::text, %s::interval,"
    " %s::jsonb, wait => %s::interval, mode => %s::text, permits => %s::integer)"
)
SET_VALUE = "SELECT lockext.lock_set_value(%s::text, %s::text, %s::bigint, %s::jsonb)"
HOLDERS = (
    "SELECT owner, kind, fence_token, value, version, acquired_at, expires_at"
    " FROM lockext.lock_holders(%s::text)"
)
OBSERVE = (
    "SELECT changed, owner, kind, fence_token, value, version, acquired_at, expires_at"
    " FROM lockext.lock_observe(%s::text, %s::bigint, %s::bigint, %s::interval)"
)
# Every lock of the set, attached to a keep-alive (lock_acquire_all: all or none).
ACQUIRE_ALL_ATTACHED = (
    "SELECT lock_id, fence_token, expires_at FROM lockext.lock_acquire_all(%s::text[], %s::text, NULL,"
    " wait => %s::interval, mode => %s::text, keepalive => %s::bigint)"
)
RENEW = "SELECT lockext.lock_renew(%s::text, %s::text, %s::interval, %s::bigint)"
RELEASE = "SELECT lockext.lock_release(%s::text, %s::text, %s::bigint)"
FENCED_UPDATE = "SELECT lockext.fenced_update(%s::text, %s::bigint, %s::jsonb)"
FENCE = "SELECT lockext.fence(%s::text, %s::bigint)"
DECLARE = "SELECT lockext.declare_token(%s::bigint)"


class Holder(NamedTuple):
    """A live grant of a lock as lock_holders and lock_observe show it: value is the
    decoded JSON (None when the grant has none, version 0)."""
    owner: str
    kind: str
    token: int
    value: object
    version: int
    acquired_at: datetime.datetime
    expires_at: datetime.datetime


class Observed(NamedTuple):
    """What observe() returns: whether the leader (or its value) changed from what the
    caller knew, and the leader now (None when the lock is free)."""
    changed: bool
    leader: Holder | None


class LeaseClock:
    """What a lease and a keep-alive share: a ttl, renewed every renew_every, the server's
    expiry as last seen (expires_at), renewals, and `reason` once lost. The local clock:
    lost once no renewal succeeded in time by our own clock, whatever the server says.
    Lost is one state: once `lost` is true, `reason` says why and it stays so."""

    _expired = "no renewal succeeded within the TTL"

    def __init__(self, expires_at, ttl, renew_every, sent, valid_for=None):
        self.ttl, self.renew_every, self.expires_at = ttl, renew_every, expires_at
        self.renewals = 0
        self.reason = None
        # By our own clock: `valid_for` (the server's expiry less the time the statement
        # reached it) after the call was *sent*; without it, the ttl after that. A lease
        # attached to a keep-alive that another program keeps alive has no ttl of its own
        # here: no local clock.
        if valid_for is not None:
            self._valid_until = sent + valid_for
        else:
            self._valid_until = sent + ttl.total_seconds() if ttl is not None else math.inf

    @property
    def lost(self) -> bool:
        """True once a renewal failed or was refused, or no renewal succeeded in time by
        our own clock (the process was paused, the renewer stuck): the lease may be
        someone else's. Stays true; `reason` is set from the first moment it is."""
        if self.reason is None and time.monotonic() >= self._valid_until:
            self._lose(self._expired)
        return self.reason is not None

    def _why(self) -> str:
        return self.reason or self._expired

    def _lose(self, reason: str) -> bool:
        """Records why it was lost; True the first time."""
        if self.reason is None:
            self.reason = reason
            return True
        return False

    def _renewed(self, sent: float, expires_at, ttl=None) -> None:
        """A renewal sent at `sent` succeeded. Too late if the lease was found lost (or
        its time ran out) meanwhile: lost stays lost."""
        if self.lost:
            return
        self._valid_until = sent + (ttl or self.ttl).total_seconds()
        self.expires_at = expires_at
        self.renewals += 1


class GrantBase(LeaseClock):
    """A lease this process holds, as the renewer last saw it. Attributes: lock_id, owner,
    token (int, exact), ttl (timedelta), expires_at (server time of the last grant or
    renewal), renewals, released (lock_release's answer once released: True, False when
    the lease had already ended, None if the release could not be sent), reason (why the
    lease was lost, or None)."""

    def __init__(self, lock_id, owner, token, expires_at, ttl, renew_every, sent, valid_for=None):
        super().__init__(expires_at, ttl, renew_every, sent, valid_for)
        self.lock_id, self.owner, self.token = lock_id, owner, token
        self.released = None

    def check(self) -> None:
        """Call before each step of work: raises LeaseLost once the lease is lost."""
        if self.lost:
            raise LeaseLost(f"lease on {self.lock_id!r} (token {self.token}) lost: {self._why()}")

    def _after_release(self, lost_before: bool):
        """What leaving the `with` block without an exception raises, if anything."""
        if self.released is False:
            self._lose("lock_release found no live lease (it had expired, been released or taken over)")
        if lost_before or self.released is False:
            return LeaseLost(f"lease on {self.lock_id!r} (token {self.token}) was lost before the end: {self._why()}")
        return None

    def __repr__(self):
        state = "lost" if self.lost else "held"
        return f"<{type(self).__name__} {self.lock_id!r} token={self.token} owner={self.owner!r} {state}>"


def renew_every_of(ttl: datetime.timedelta, renew_every) -> float:
    """A third of the TTL by default: two renewals can fail to arrive in time before the
    lease runs out. Must be below the TTL."""
    every = ttl / 3 if renew_every is None else interval(renew_every, "renew_every", zero_ok=False)
    if every >= ttl:
        raise InvalidArgument(f"renew_every ({every}) must be shorter than the ttl ({ttl})")
    return every.total_seconds()


def alone_on(conn) -> bool:
    """Whether a statement on `conn` runs alone, as a transaction of its own: an autocommit
    connection with no transaction open (what a Citus cluster requires of lockext's calls)."""
    return conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
