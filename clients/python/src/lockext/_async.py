"""lockext.alock(): the asyncio twin of lockext.lock(), renewed by a task."""

from __future__ import annotations

import asyncio
import contextlib
import time

import psycopg
from psycopg.types.json import Jsonb

from ._common import (
    ACQUIRE, DECLARE, FENCE, FENCED_UPDATE, RELEASE, RENEW,
    GrantBase, NotAcquired, StaleToken, alone_on,
    conninfo_of, connect_kwargs, flag, identifier, interval, mapped_errors, mode_of, owner_of,
    permits_of, renew_every_of,
)


class alock:
    """`async with lockext.alock(target, lock_id, ttl=30, ...) as grant:` takes the lock on
    entry (NotAcquired if refused), renews it in a task, releases it on exit. The same
    arguments as lockext.lock(); target may be a psycopg AsyncConnection."""

    def __init__(self, target, lock_id: str, ttl=30, *, owner: str | None = None, wait=0,
                 renew_every=None, mode: str = "exclusive", permits: int | None = None,
                 session_bound: bool = False):
        identifier(lock_id, "lock_id")
        mode_of(mode)
        permits_of(permits)
        flag(session_bound, "session_bound")
        self._ttl = interval(ttl, "ttl", zero_ok=False)
        self._wait = interval(wait, "wait", zero_ok=True)
        self._every = renew_every_of(self._ttl, renew_every)
        self._conninfo = conninfo_of(target)
        self._args = (lock_id, owner_of(owner), self._ttl, self._wait, mode, permits, session_bound)
        self._grant = None

    async def __aenter__(self) -> "AsyncGrant":
        conn = await psycopg.AsyncConnection.connect(self._conninfo, **connect_kwargs(self._conninfo))
        try:
            sent = time.monotonic()
            with mapped_errors():
                cur = await conn.execute(ACQUIRE, self._args)
                token, expires_at, valid_for = await cur.fetchone()
        except BaseException:
            await conn.close()
            raise
        lock_id, owner = self._args[:2]
        if token is None:
            await conn.close()
            raise NotAcquired(f"lock {lock_id!r} is held by another owner" + (f" (waited {self._wait})" if self._wait else ""))
        self._grant = AsyncGrant(self._conninfo, conn, lock_id, owner, token, expires_at, self._ttl, self._every, sent,
                                   valid_for)
        return self._grant

    async def __aexit__(self, exc_type, exc, tb):
        grant = self._grant
        lost_before = grant.lost
        await grant.release()
        err = grant._after_release(lost_before)
        if err is not None and exc_type is None:
            raise err
        return False


class AsyncGrant(GrantBase):
    def __init__(self, conninfo, conn, *args):
        super().__init__(*args)
        self._conninfo, self._conn = conninfo, conn
        self._stop = asyncio.Event()
        self._done = False
        self._task = asyncio.create_task(self._renew_loop(), name=f"lockext-renew:{self.lock_id}")

    async def _renew_loop(self):
        """As the thread of lockext.lock(): the first failure marks the grant lost."""
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.renew_every)
                return
            if self.lost:  # its time ran out while this task slept (a paused process)
                return
            sent = time.monotonic()
            try:
                cur = await self._conn.execute(RENEW, (self.lock_id, self.owner, self.ttl, self.token))
                expires_at = (await cur.fetchone())[0]
            except Exception as e:
                self._lose(f"renewal failed: {e}")
                return
            if expires_at is None:
                self._lose("renewal refused: the lease expired, was released or taken over")
                return
            self._renewed(sent, expires_at)

    async def release(self) -> bool | None:
        """Stops renewing and releases this grant; returns (and keeps in `released`)
        lock_release's answer."""
        if self._done:
            return self.released
        self._done = True
        self._stop.set()
        # A renewal stuck in the network is given as long as the lease could last, then
        # cancelled, and the release goes on a fresh connection.
        done, _ = await asyncio.wait({self._task}, timeout=self.ttl.total_seconds())
        stuck = not done
        if stuck:
            self._task.cancel()
        conn = None if stuck or self._conn.broken else self._conn
        try:
            if conn is None:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, **connect_kwargs(self._conninfo))
            cur = await conn.execute(RELEASE, (self.lock_id, self.owner, self.token))
            self.released = (await cur.fetchone())[0]
        except Exception:
            self.released = None  # the lease ends by itself at its expiry
        finally:
            for c in {conn, self._conn} - {None}:
                with contextlib.suppress(Exception):
                    await c.close()
        return self.released

    async def fenced_update(self, conn, resource_id: str, data) -> None:
        self.check()
        await afenced_update(conn, resource_id, self.token, data)

    @contextlib.asynccontextmanager
    async def transaction(self, conn, fence: str | None = None, declare: bool = False):
        """As Grant.transaction, on a psycopg AsyncConnection."""
        self.check()
        with mapped_errors(only=("55L01",)):
            async with conn.transaction():
                if fence is not None:
                    await afence(conn, fence, self.token)
                if declare:
                    await adeclare_token(conn, self.token)
                yield conn

    async def declare_token(self, conn) -> None:
        await adeclare_token(conn, self.token)


async def afenced_update(conn, resource_id: str, token: int, data) -> None:
    """lockext.fenced_update() on a psycopg AsyncConnection."""
    with mapped_errors():
        if alone_on(conn):  # as fenced_update: the call alone, in autocommit
            cur = await conn.execute(FENCED_UPDATE, (resource_id, token, Jsonb(data)), prepare=False)
            ok = (await cur.fetchone())[0]
        else:
            async with conn.transaction():
                cur = await conn.execute(FENCED_UPDATE, (resource_id, token, Jsonb(data)), prepare=False)
                ok = (await cur.fetchone())[0]
    if not ok:
        raise StaleToken(f"fenced_update of {resource_id!r} refused token {token}: a newer holder has written", "55L01")


async def afence(conn, resource_id: str, token: int) -> None:
    with mapped_errors():
        await conn.execute(FENCE, (resource_id, token), prepare=False)


async def adeclare_token(conn, token: int) -> None:
    with mapped_errors():
        await conn.execute(DECLARE, (token,), prepare=False)
