"""lockext.lock(): a lease renewed by a background thread, and the fenced writes."""

from __future__ import annotations

import contextlib
import threading
import time

import psycopg
from psycopg.types.json import Jsonb

from ._common import (
    ACQUIRE, ACQUIRE_ALL_ATTACHED, ACQUIRE_ATTACHED, CAMPAIGN, DECLARE, FENCE, FENCED_UPDATE, HOLDERS, KEEPALIVE_GRANT,
    KEEPALIVE_NOT_LIVE, KEEPALIVE_RENEW, KEEPALIVE_REVOKE, OBSERVE, RELEASE, RENEW, SET_VALUE,
    GrantBase, Holder, InvalidArgument, LeaseClock, alone_on, LeaseLost, NotAcquired, Observed, StaleToken,
    conninfo_of, connect_kwargs, flag, identifier, interval, token_of, lock_ids_of, mapped_errors, mode_of,
    owner_of, permits_of, renew_every_of,
)

class _DefaultTtl:
    """lock()'s ttl when not given: 30 s, or none for a lease attached to a keep-alive."""

    def __repr__(self):
        return "30"


_DEFAULT_TTL = _DefaultTtl()
_REVOKED = "revoked by its holder"  # a KeepAlive's reason after its own revoke(): not a loss


def lock(target, lock_id: str, ttl=_DEFAULT_TTL, *, owner: str | None = None, wait=0, renew_every=None,
         mode: str = "exclusive", permits: int | None = None, session_bound: bool = False,
         keepalive: "KeepAlive | int | None" = None) -> "Grant":
    """Takes `lock_id` and returns the Grant, renewed in the background until released;
    use it as `with lockext.lock(...) as grant:`, which releases at the end.

    target: a conninfo string or a psycopg connection (only its connection parameters are
    used: the library opens one autocommit connection of its own per grant).
    ttl (default 30), wait, renew_every: seconds (int or float) or timedelta. wait=0 does
    not wait. Raises NotAcquired when the lock is taken (and still taken after `wait`).

    keepalive: a KeepAlive (or the id of one of the same role that something else keeps
    alive): the lease is attached to it, has no ttl (passing one raises InvalidArgument,
    22023) and no renewer of its own, and holds no connection; it is lost when the
    keep-alive is. A keep-alive that is not live raises LeaseLost (55000)."""
    identifier(lock_id, "lock_id")
    mode_of(mode)
    permits_of(permits)
    flag(session_bound, "session_bound")
    if keepalive is not None:
        return _attach(target, lock_id, ttl, owner=owner, wait=wait, renew_every=renew_every,
                       mode=mode, permits=permits, session_bound=session_bound, keepalive=keepalive)
    ttl = interval(30 if ttl is _DEFAULT_TTL else ttl, "ttl", zero_ok=False)
    wait = interval(wait, "wait", zero_ok=True)
    every = renew_every_of(ttl, renew_every)
    owner = owner_of(owner)
    conninfo = conninfo_of(target)
    conn = psycopg.connect(conninfo, **connect_kwargs(conninfo))
    try:
        sent = time.monotonic()
        with mapped_errors():
            token, expires_at, valid_for = conn.execute(
                ACQUIRE, (lock_id, owner, ttl, wait, mode, permits, session_bound)).fetchone()
    except BaseException:
        conn.close()
        raise
    if token is None:  # a refusal is a row of NULLs, not an empty result
        conn.close()
        raise NotAcquired(f"lock {lock_id!r} is held by another owner" + (f" (waited {wait})" if wait else ""))
    return Grant(conninfo, conn, lock_id, owner, token, expires_at, ttl, every, sent, valid_for)


def campaign(target, lock_id: str, value, ttl=30, *, owner: str | None = None, wait=0,
             renew_every=None, mode: str = "exclusive", permits: int | None = None) -> "Grant":
    """lock() for a leader: takes `lock_id` with `value` (anything JSON: the leader's
    address, say) published as its grant's value, renewed in the background until
    released (resigning). Change the value with grant.proclaim(). Raises NotAcquired when
    another leader holds it (and still holds it after `wait`)."""
    identifier(lock_id, "lock_id")
    mode_of(mode)
    permits_of(permits)
    ttl = interval(ttl, "ttl", zero_ok=False)
    wait = interval(wait, "wait", zero_ok=True)
    every = renew_every_of(ttl, renew_every)
    owner = owner_of(owner)
    conninfo = conninfo_of(target)
    conn = psycopg.connect(conninfo, **connect_kwargs(conninfo))
    try:
        sent = time.monotonic()
        with mapped_errors():
            token, expires_at, valid_for = conn.execute(
                CAMPAIGN, (lock_id, owner, ttl, Jsonb(value), wait, mode, permits)).fetchone()
    except BaseException:
        conn.close()
        raise
    if token is None:
        conn.close()
        raise NotAcquired(f"lock {lock_id!r} is led by another owner" + (f" (waited {wait})" if wait else ""))
    return Grant(conninfo, conn, lock_id, owner, token, expires_at, ttl, every, sent, valid_for)


def holders(conn, lock_id: str) -> list[Holder]:
    """Who holds `lock_id` now, oldest grant (the leader) first; [] when it is free."""
    identifier(lock_id, "lock_id")
    with mapped_errors():
        return [Holder(*row) for row in conn.execute(HOLDERS, (lock_id,), prepare=False).fetchall()]


def observe(conn, lock_id: str, known: Holder | None = None, timeout=30) -> Observed:
    """Waits (in the server, holding no lock) until the leader of `lock_id`, or its value,
    is not `known` (None: no leader), or `timeout` seconds have passed. Pass the leader it
    returned as the next call's `known` to miss no change. `conn` must not be inside a
    REPEATABLE READ or SERIALIZABLE transaction (NotSupported)."""
    identifier(lock_id, "lock_id")
    if known is not None and not isinstance(known, Holder):
        raise InvalidArgument(f"known must be a Holder (or None), got {known!r}")
    timeout = interval(timeout, "timeout", zero_ok=True)
    known_token, known_version = (known.token, known.version) if known else (None, None)
    with mapped_errors():
        row = conn.execute(OBSERVE, (lock_id, known_token, known_version, timeout), prepare=False).fetchone()
    changed, *leader = row
    return Observed(changed, Holder(*leader) if leader[2] is not None else None)


def _attach(target, lock_id, ttl, *, owner, wait, renew_every, mode, permits, session_bound, keepalive):
    """lock() for a lease attached to `keepalive`: acquired on the KeepAlive's connection
    for attaching (one for all its leases), or for a keep-alive given by id, on a short
    connection of its own, closed at once (release() opens another)."""
    if isinstance(keepalive, KeepAlive):
        keepalive.check()
        keepalive_id = keepalive.id
    elif isinstance(keepalive, int) and not isinstance(keepalive, bool):
        keepalive_id = keepalive
    else:
        raise InvalidArgument(f"keepalive must be a KeepAlive or its id (int), got {keepalive!r}")
    if renew_every is not None:
        raise InvalidArgument(
            f"renew_every: a lease attached to a keep-alive is renewed by the keep-alive, got {renew_every!r}")
    # A ttl is sent as given, for the server to refuse (22023): it has no meaning here.
    ttl = None if ttl is _DEFAULT_TTL or ttl is None else interval(ttl, "ttl", zero_ok=False)
    wait = interval(wait, "wait", zero_ok=True)
    owner = owner_of(owner)
    args = (lock_id, owner, ttl, wait, mode, permits, session_bound, keepalive_id)
    if isinstance(keepalive, KeepAlive):
        conninfo = keepalive._conninfo
        token, expires_at, _ = keepalive._attaching(ACQUIRE_ATTACHED, args)
    else:
        conninfo = conninfo_of(target)
        with psycopg.connect(conninfo, **connect_kwargs(conninfo)) as conn:
            with mapped_errors(extra=KEEPALIVE_NOT_LIVE):
                token, expires_at, _ = conn.execute(ACQUIRE_ATTACHED, args).fetchone()
    if token is None:
        raise NotAcquired(f"lock {lock_id!r} is held by another owner" + (f" (waited {wait})" if wait else ""))
    # No clock of its own: its life is the keep-alive's (or, by id, another program's).
    return Grant(conninfo, None, lock_id, owner, token, expires_at, None, None, time.monotonic(), keepalive=keepalive)


def _report(exc: BaseException) -> None:
    """An on_lost callback's exception: reported as a thread's uncaught exception would
    be (threading.excepthook), not raised into whatever found the loss."""
    threading.excepthook(threading.ExceptHookArgs((type(exc), exc, exc.__traceback__, threading.current_thread())))


class _Renewer:
    """The background renewal of a Grant and of a KeepAlive: a daemon thread that renews
    every renew_every (_renew_once). The first failure ends it for us: a renewal that errs
    or returns NULL marks it lost and stops, rather than retrying while the body goes on."""

    _refused = "renewal refused: the lease expired, was released or taken over"
    _thread = None

    def _start_renewing(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name=name, daemon=True)
        self._thread.start()

    def _renew_loop(self):
        while not self._stop.wait(self.renew_every):
            if self.lost:  # found lost meanwhile, or its time ran out while this thread slept
                return
            sent = time.monotonic()
            try:
                expires_at = self._renew_once()
            except Exception as e:  # connection dropped, server gone, failover to a standby...
                self._lose(f"renewal failed: {e}")
                return
            if expires_at is None:
                self._lose(self._refused)
                return
            self._renewed(sent, expires_at)

    def _stop_renewing(self):
        """Stops the renewer; the connection to finish on (ours), or None when there is
        none, it broke, or a renewal is stuck in the network: that must not hold up the end
        for longer than the lease could last anyway; a fresh connection is used then."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join(self.ttl.total_seconds())
        return self._conn if not self._thread.is_alive() and not self._conn.broken else None

    def _finish(self, sql, args):
        """Runs the last statement (release, revoke) after the renewer stopped; its answer,
        and whether it was sent (False: the connection failed)."""
        conn = self._stop_renewing()
        fresh = None
        try:
            if conn is None:
                conn = fresh = psycopg.connect(self._conninfo, **connect_kwargs(self._conninfo))
            return conn.execute(sql, args).fetchone()[0], True
        except Exception:
            return None, False
        finally:
            if fresh is not None:
                fresh.close()
            if self._conn is not None and (self._thread is None or not self._thread.is_alive()):
                self._conn.close()


class Grant(_Renewer, GrantBase):
    """A lease: renewed by its own thread, or (`keepalive` set) attached to a keep-alive,
    which renews it, with no thread or connection of its own."""

    def __init__(self, conninfo, conn, *args, keepalive=None):
        super().__init__(*args)
        self._conninfo, self._conn = conninfo, conn
        self.keepalive = keepalive  # the KeepAlive (or its id) that renews this lease, or None
        self._done = False
        if conn is not None:
            self._start_renewing(f"lockext-renew:{self.lock_id}")

    def _renew_once(self):
        return self._conn.execute(RENEW, (self.lock_id, self.owner, self.ttl, self.token)).fetchone()[0]

    @property
    def lost(self) -> bool:
        if isinstance(self.keepalive, KeepAlive):
            if self.reason is None and self.keepalive.lost:
                self._lose(f"its keep-alive {self.keepalive.id} was lost: {self.keepalive._why()}")
            return self.reason is not None
        return super().lost

    def release(self) -> bool | None:
        """Stops renewing and releases the lease (only this grant: by owner and token).
        Returns lock_release's answer, also kept in `released`. Safe to call twice."""
        if self._done:
            return self.released
        self._done = True
        args = (self.lock_id, self.owner, self.token)
        if self._conn is None and isinstance(self.keepalive, KeepAlive):
            try:
                self.released = self.keepalive._attaching(RELEASE, args)[0]
            except Exception:
                self.released = None
        else:
            self.released, _ = self._finish(RELEASE, args)
        return self.released  # None: not sent, the lease ends by itself at its expiry

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
        args = (self.lock_id, self.owner, self.token, Jsonb(value))
        with mapped_errors():
            if self._conn is None and isinstance(self.keepalive, KeepAlive):
                return self.keepalive._attaching(SET_VALUE, args)[0]
            if self._conn is None:  # attached to a keep-alive by id: no connection of its own
                with psycopg.connect(self._conninfo, **connect_kwargs(self._conninfo)) as conn:
                    return conn.execute(SET_VALUE, args).fetchone()[0]
            return self._conn.execute(SET_VALUE, args).fetchone()[0]

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
    else raises StaleToken. In its own transaction, or a savepoint of the one open on conn.
    On an autocommit connection with no transaction open, the call alone (a transaction of
    its own too): on a Citus cluster, lockext serves a call only so."""
    identifier(resource_id, "resource_id")
    token_of(token)
    own = contextlib.nullcontext() if alone_on(conn) else conn.transaction()
    with mapped_errors(), own:
        ok = conn.execute(FENCED_UPDATE, (resource_id, token, Jsonb(data)), prepare=False).fetchone()[0]
    if not ok:
        raise StaleToken(f"fenced_update of {resource_id!r} refused token {token}: a newer holder has written", "55L01")


def fence(conn, resource_id: str, token: int) -> None:
    """lockext.fence in the transaction open on `conn`: StaleToken (and that transaction
    aborts) when a newer token was fenced on `resource_id`."""
    identifier(resource_id, "resource_id")
    token_of(token)
    with mapped_errors():
        conn.execute(FENCE, (resource_id, token), prepare=False)


_fence = fence  # Grant.transaction's `fence` argument hides the function


def declare_token(conn, token: int) -> None:
    """lockext.declare_token: names the writer's token for fence_guard, for the UPDATEs
    that leave the token column as it is and the DELETEs of the transaction open on conn."""
    token_of(token)
    with mapped_errors():
        conn.execute(DECLARE, (token,), prepare=False)


# -- keep-alives -------------------------------------------------------------------------

def keepalive(target, ttl=30, *, renew_every=None, background: bool = True, on_lost=None) -> "KeepAlive":
    """Grants a keep-alive (lockext.lock_keepalive_grant) and returns it, renewed in the
    background (a daemon thread, every third of the ttl) until revoked; use it as
    `with lockext.keepalive(...) as ka:`, which revokes it at the end, releasing every lease
    attached to it. Attach leases with ka.lock(lock_id, ...) (or lock(..., keepalive=ka)):
    one renewal extends them all.

    target: a conninfo string or a psycopg connection (only its parameters are used: the
    keep-alive has one autocommit connection of its own). ttl, renew_every: seconds or
    timedelta. background=False: no thread; call ka.renew() yourself within each ttl.
    on_lost(ka): called once, from the thread that finds the keep-alive lost (the
    renewer's: a renewal failed or returned NULL), not for a revoke of yours."""
    ttl = interval(ttl, "ttl", zero_ok=False)
    every = renew_every_of(ttl, renew_every)
    flag(background, "background")
    if on_lost is not None and not callable(on_lost):
        raise InvalidArgument(f"on_lost must be callable, got {on_lost!r}")
    conninfo = conninfo_of(target)
    conn = psycopg.connect(conninfo, **connect_kwargs(conninfo))
    try:
        sent = time.monotonic()
        with mapped_errors():
            keepalive_id, expires_at, valid_for = conn.execute(KEEPALIVE_GRANT, (ttl,)).fetchone()
    except BaseException:
        conn.close()
        raise
    return KeepAlive(conninfo, conn, keepalive_id, expires_at, ttl, every, sent, valid_for, background, on_lost)


class KeepAlive(_Renewer, LeaseClock):
    """A keep-alive this process holds: one renewal for every lease attached to it.
    Attributes: id (int, what lock_acquire's keepalive takes), ttl, expires_at (server time
    of the grant or last renewal: every attached lease's expiry), renewals, reason (why it
    was lost, or None), revoked (lock_keepalive_revoke's answer once revoked: the number of
    leases it ended; None if it could not be sent or found no such keep-alive)."""

    _refused = "renewal refused: the keep-alive expired, was revoked or ended by a grant over its leases"

    def __init__(self, conninfo, conn, keepalive_id, expires_at, ttl, renew_every, sent, valid_for,
                 background, on_lost):
        super().__init__(expires_at, ttl, renew_every, sent, valid_for)
        self._conninfo, self._conn = conninfo, conn
        # The connection that attaches and releases its leases: one for all of them, opened
        # at the first attach, apart from the renewals' (an attach may wait for its lock,
        # and a renewal must not wait behind it).
        self._attach_conn = None
        self._attach_lock = threading.Lock()
        self.id = keepalive_id
        self.revoked = None
        self._on_lost = on_lost
        self._done = False
        if background:
            self._start_renewing(f"lockext-keepalive:{self.id}")

    def _renew_once(self, ttl=None):
        return self._conn.execute(KEEPALIVE_RENEW, (self.id, ttl)).fetchone()[0]

    def _lose(self, reason: str) -> bool:
        first = super()._lose(reason)
        if first and self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception as e:
                _report(e)
        return first

    def check(self) -> None:
        """Raises LeaseLost once the keep-alive is lost (or revoked): its leases may be
        someone else's."""
        if self.lost:
            raise LeaseLost(f"keep-alive {self.id} lost: {self._why()}")

    def renew(self, ttl=None):
        """Renews it now (lockext.lock_keepalive_renew), for `ttl` this once (default: its
        own), extending every attached lease; returns the new expiry. Raises LeaseLost, and
        marks it lost (on_lost), when the server refuses: it expired, or was revoked or
        ended."""
        if self._done:
            raise LeaseLost(f"keep-alive {self.id} was revoked")
        self.check()  # once lost, for good: its grants were told so (on_lost)
        ttl = None if ttl is None else interval(ttl, "ttl", zero_ok=False)
        sent = time.monotonic()
        try:
            with mapped_errors():
                expires_at = self._renew_once(ttl)
        except InvalidArgument:
            raise  # a bad ttl: refused, nothing renewed, nothing lost
        except Exception as e:  # as for the renewer: the first failure ends it for us
            self._lose(f"renewal failed: {e}")
            raise
        if expires_at is None:
            self._lose(self._refused)
        self._renewed(sent, expires_at, ttl)
        self.check()  # refused, or too late by our clock: lost for good
        return expires_at

    def _attaching(self, sql, args, rows=False):
        """Runs `sql` on the connection for attaching (opened the first time; once more
        if it broke) and returns its row (`rows`: all of them); lockext's errors mapped,
        55000 as LeaseLost. Once revoked, on a short connection of its own (a release of
        an attached grant after the revoke)."""

        def run(conn):
            with mapped_errors(extra=KEEPALIVE_NOT_LIVE):
                cur = conn.execute(sql, args)
                return cur.fetchall() if rows else cur.fetchone()

        with self._attach_lock:
            if self._done:
                with psycopg.connect(self._conninfo, **connect_kwargs(self._conninfo)) as conn:
                    return run(conn)
            if self._attach_conn is None or self._attach_conn.closed:
                self._attach_conn = psycopg.connect(self._conninfo, **connect_kwargs(self._conninfo))
            return run(self._attach_conn)

    def lock_all(self, lock_ids, *, owner: str | None = None, wait=0, mode: str = "exclusive") -> list[Grant]:
        """Takes every lock of `lock_ids` attached to this keep-alive, in one call
        (lockext.lock_acquire_all: all or none, in the order of the ids' bytes): a list of
        Grants, one per distinct id, sorted so, all with the same owner. NotAcquired if one
        is taken (and still taken after `wait`): then none is taken."""
        ids = lock_ids_of(lock_ids)
        wait = interval(wait, "wait", zero_ok=True)
        mode_of(mode)
        owner = owner_of(owner)
        self.check()
        rows = self._attaching(ACQUIRE_ALL_ATTACHED, (ids, owner, wait, mode, self.id), rows=True)
        if not rows:
            raise NotAcquired(f"one of the locks {ids!r} is held by another owner" + (f" (waited {wait})" if wait else ""))
        return [Grant(self._conninfo, None, lock_id, owner, token, expires_at, None, None, time.monotonic(), keepalive=self)
                for lock_id, token, expires_at in rows]

    def lock(self, lock_id: str, *, owner: str | None = None, wait=0, mode: str = "exclusive",
             permits: int | None = None) -> Grant:
        """lockext.lock() attached to this keep-alive: a Grant with no ttl, renewer or
        connection of its own (acquired on a short connection); lost when the keep-alive
        is; `with ka.lock(...) as grant:` releases it at the end. LeaseLost (55000) if the
        keep-alive is not live."""
        return lock(self._conninfo, lock_id, owner=owner, wait=wait, mode=mode, permits=permits, keepalive=self)

    def revoke(self) -> int | None:
        """Stops renewing and revokes it (lockext.lock_keepalive_revoke): every lease attached
        to it is released at once. Returns the number of leases ended, also kept in
        `revoked`; None if it could not be sent (the keep-alive then expires by itself) or
        the server knows no such keep-alive of this role (it is marked lost). Safe to call
        twice."""
        if self._done:
            return self.revoked
        self._done = True
        self.revoked, sent = self._finish(KEEPALIVE_REVOKE, (self.id,))
        with self._attach_lock:
            if self._attach_conn is not None:
                self._attach_conn.close()
                self._attach_conn = None
        if sent and self.revoked is None:
            self._lose("lock_keepalive_revoke found no such keep-alive (revoked by another, or ended and deleted)")
        if self.reason is None:
            self.reason = _REVOKED  # not a loss: on_lost is not called
        return self.revoked

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        lost_before = self.lost and self.reason != _REVOKED  # a revoke() in the block is no loss
        self.revoke()
        if (lost_before or self.reason != _REVOKED) and exc_type is None:
            # the body finished, but its leases may have been someone else's for a while
            raise LeaseLost(f"keep-alive {self.id} was lost before the end: {self._why()}")
        return False

    def __repr__(self):
        state = "revoked" if self._done else "lost" if self.lost else "live"
        return f"<KeepAlive {self.id} ttl={self.ttl} {state}>"
