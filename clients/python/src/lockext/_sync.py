"""lockext.lock(): a lease renewed by a background thread, and the fenced writes."""

from __future__ import annotations

import contextlib
import threading
import time

import psycopg
from psycopg.types.json import Jsonb

from ._common import (
    ACQUIRE, CAMPAIGN, DECLARE, FENCE, FENCED_UPDATE, HOLDERS, OBSERVE, RELEASE, RENEW, SET_VALUE,
    GrantBase, Holder, NotAcquired, Observed, StaleToken,
    conninfo_of, connect_kwargs, default_owner, interval, mapped_errors, renew_every_of,
)


def lock(target, lock_id: str, ttl=30, *, owner: str | None = None, wait=0, renew_every=None,
         mode: str = "exclusive", permits: int | None = None, session_bound: bool = False) -> "Grant":
    """Takes `lock_id` and returns the Grant, renewed in the background until released;
    use it as `with lockext.lock(...) as grant:`, which releases at the end.

    target: a conninfo string or a psycopg connection (only its connection parameters are
    used: the library opens one autocommit connection of its own per grant).
    ttl, wait, renew_every: seconds (int or float) or timedelta. wait=0 does not wait.
    Raises NotAcquired when the lock is taken (and still taken after `wait`)."""
    ttl = interval(ttl, "ttl", zero_ok=False)
    wait = interval(wait, "wait", zero_ok=True)
    every = renew_every_of(ttl, renew_every)
    owner = owner or default_owner()
    conninfo = conninfo_of(target)
    conn = psycopg.connect(conninfo, **connect_kwargs(conninfo))
    try:
        sent = time.monotonic()
        with mapped_errors():
            token, expires_at = conn.execute(
                ACQUIRE, (lock_id, owner, ttl, wait, mode, permits, session_bound)).fetchone()
    except BaseException:
        conn.close()
        raise
    if token is None:  # a refusal is a row of NULLs, not an empty result
        conn.close()
        raise NotAcquired(f"lock {lock_id!r} is held by another owner" + (f" (waited {wait})" if wait else ""))
    return Grant(conninfo, conn, lock_id, owner, token, expires_at, ttl, every, sent)


def campaign(target, lock_id: str, value, ttl=30, *, owner: str | None = None, wait=0,
             renew_every=None, mode: str = "exclusive", permits: int | None = None) -> "Grant":
    """lock() for a leader: takes `lock_id` with `value` (anything JSON: the leader's
    address, say) published as its grant's value, renewed in the background until
    released (resigning). Change the value with grant.proclaim(). Raises NotAcquired when
    another leader holds it (and still holds it after `wait`)."""
    ttl = interval(ttl, "ttl", zero_ok=False)
    wait = interval(wait, "wait", zero_ok=True)
    every = renew_every_of(ttl, renew_every)
    owner = owner or default_owner()
    conninfo = conninfo_of(target)
    conn = psycopg.connect(conninfo, **connect_kwargs(conninfo))
    try:
        sent = time.monotonic()
        with mapped_errors():
            token, expires_at = conn.execute(
                CAMPAIGN, (lock_id, owner, ttl, Jsonb(value), wait, mode, permits)).fetchone()
    except BaseException:
        conn.close()
        raise
    if token is None:
        conn.close()
        raise NotAcquired(f"lock {lock_id!r} is led by another owner" + (f" (waited {wait})" if wait else ""))
    return Grant(conninfo, conn, lock_id, owner, token, expires_at, ttl, every, sent)


def holders(conn, lock_id: str) -> list[Holder]:
    """Who holds `lock_id` now, oldest grant (the leader) first; [] when it is free."""
    with mapped_errors():
        return [Holder(*row) for row in conn.execute(HOLDERS, (lock_id,), prepare=False).fetchall()]


def observe(conn, lock_id: str, known: Holder | None = None, timeout=30) -> Observed:
    """Waits (in the server, holding no lock) until the leader of `lock_id`, or its value,
    is not `known` (None: no leader), or `timeout` seconds have passed. Pass the leader it
    returned as the next call's `known` to miss no change. `conn` must not be inside a
    REPEATABLE READ or SERIALIZABLE transaction (NotSupported)."""
    timeout = interval(timeout, "timeout", zero_ok=True)
    known_token, known_version = (known.token, known.version) if known else (None, None)
    with mapped_errors():
        row = conn.execute(OBSERVE, (lock_id, known_token, known_version, timeout), prepare=False).fetchone()
    changed, *leader = row
    return Observed(changed, Holder(*leader) if leader[2] is not None else None)


class Grant(GrantBase):
    def __init__(self, conninfo, conn, *args):
        super().__init__(*args)
        self._conninfo, self._conn = conninfo, conn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name=f"lockext-renew:{self.lock_id}", daemon=True)
        self._done = False
        self._thread.start()

    def _renew_loop(self):
        """The first failure ends the lease for us: a renewal that errs or returns NULL
        marks the grant lost and stops, rather than retrying while the body goes on."""
        while not self._stop.wait(self.renew_every):
            sent = time.monotonic()
            try:
                expires_at = self._conn.execute(
                    RENEW, (self.lock_id, self.owner, self.ttl, self.token)).fetchone()[0]
            except Exception as e:  # connection dropped, server gone, failover to a standby...
                self._lose(f"renewal failed: {e}")
                return
            if expires_at is None:
                self._lose("renewal refused: the lease expired, was released or taken over")
                return
            self._renewed(sent, expires_at)

    def release(self) -> bool | None:
        """Stops renewing and releases the lease (only this grant: by owner and token).
        Returns lock_release's answer, also kept in `released`. Safe to call twice."""
        if self._done:
            return self.released
        self._done = True
        self._stop.set()
        # A renewal stuck in the network must not hold up the release for longer than
        # the lease could last anyway; then the release goes on a fresh connection.
        self._thread.join(self.ttl.total_seconds())
        conn = self._conn if not self._thread.is_alive() and not self._conn.broken else None
        fresh = None
        try:
            if conn is None:
                conn = fresh = psycopg.connect(self._conninfo, **connect_kwargs(self._conninfo))
            self.released = conn.execute(RELEASE, (self.lock_id, self.owner, self.token)).fetchone()[0]
        except Exception:
            self.released = None  # the lease ends by itself at its expiry
        finally:
            if fresh is not None:
                fresh.close()
            if not self._thread.is_alive():
                self._conn.close()
        return self.released

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        lost_before = self.lost
        self.release()
        err = self._after_release(lost_before)
        if err is not None and exc_type is None:
            raise err  # the body finished, but not under the lease it thought it had
        return False

    def proclaim(self, value) -> int:
        """Sets this grant's value (lockext.lock_set_value) and returns its version. Raises
        StaleToken, and nothing changes, once the grant is no longer live."""
        self.check()
        with mapped_errors():
            return self._conn.execute(SET_VALUE, (self.lock_id, self.owner, self.token, Jsonb(value))).fetchone()[0]

    # -- fenced writes (on the caller's connection) --------------------------------------

    def fenced_update(self, conn, resource_id: str, data) -> None:
        """lockext.fenced_update with this grant's token: raises LeaseLost if the lease is
        already lost, StaleToken if a newer token wrote `resource_id`."""
        self.check()
        fenced_update(conn, resource_id, self.token, data)

    @contextlib.contextmanager
    def transaction(self, conn, fence: str | None = None, declare: bool = False):
        """A transaction on `conn` (a savepoint if one is already open) that first checks
        the lease, then fences `fence` (lockext.fence) and/or declares the token for
        fence_guard tables (lockext.declare_token); commits at the end. A stale token
        raises StaleToken and rolls back every write of the block."""
        self.check()
        # Only 55L01 is translated for the body's own statements (a fence_guard trigger
        # refusing a row): other errors of the caller's SQL stay psycopg's.
        with mapped_errors(only=("55L01",)), conn.transaction():
            if fence is not None:
                _fence(conn, fence, self.token)
            if declare:
                declare_token(conn, self.token)
            yield conn

    def declare_token(self, conn) -> None:
        declare_token(conn, self.token)


def fenced_update(conn, resource_id: str, token: int, data) -> None:
    """Stores `data` (anything JSON) for `resource_id` if `token` is the newest seen there,
    else raises StaleToken. In its own transaction, or a savepoint of the one open on conn."""
    with mapped_errors(), conn.transaction():
        ok = conn.execute(FENCED_UPDATE, (resource_id, token, Jsonb(data)), prepare=False).fetchone()[0]
    if not ok:
        raise StaleToken(f"fenced_update of {resource_id!r} refused token {token}: a newer holder has written", "55L01")


def fence(conn, resource_id: str, token: int) -> None:
    """lockext.fence in the transaction open on `conn`: StaleToken (and that transaction
    aborts) when a newer token was fenced on `resource_id`."""
    with mapped_errors():
        conn.execute(FENCE, (resource_id, token), prepare=False)


_fence = fence  # Grant.transaction's `fence` argument hides the function


def declare_token(conn, token: int) -> None:
    """lockext.declare_token: names the writer's token for fence_guard, for the UPDATEs
    that leave the token column as it is and the DELETEs of the transaction open on conn."""
    with mapped_errors():
        conn.execute(DECLARE, (token,), prepare=False)
