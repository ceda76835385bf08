"""lockext.alock (asyncio) against a real cluster; see test_lockext.py for the variables."""

import asyncio
import time
import unittest

import psycopg

import lockext
from test_lockext import POOLED, URL, new_id, warm_pool


class Async(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.db = await psycopg.AsyncConnection.connect(URL, autocommit=True, prepare_threshold=None)

    async def asyncTearDown(self):
        await self.db.close()

    async def one(self, sql, *params):
        return await (await self.db.execute(sql, params)).fetchone()

    async def test_acquire_renew_refuse_release(self):
        lock_id = new_id("async")
        warm_pool()
        user = await psycopg.AsyncConnection.connect(URL)  # not autocommit, like the trial's
        await user.execute("SELECT 1")  # psycopg has opened a transaction
        async with lockext.alock(user, lock_id, ttl=1) as g:
            self.assertIs(type(g.token), int)
            self.assertEqual(await self.one("SELECT fence_token FROM lockext.holders WHERE lock_id = %s", lock_id), (g.token,))
            with self.assertRaises(lockext.NotAcquired):
                async with lockext.alock(URL, lock_id, ttl=1):
                    pass
            await asyncio.sleep(2.2)  # past two TTLs
            g.check()
            self.assertGreaterEqual(g.renewals, 4)
            await g.fenced_update(self.db, new_id("res"), {"async": True})
        self.assertIs(g.released, True)
        self.assertIsNone(await self.one("SELECT 1 FROM lockext.holders WHERE lock_id = %s", lock_id))
        self.assertEqual(user.info.transaction_status, psycopg.pq.TransactionStatus.INTRANS)
        await user.close()

    async def test_wait(self):
        lock_id = new_id("async-wait")
        first = lockext.alock(URL, lock_id, ttl=10)
        g1 = await first.__aenter__()

        async def later():
            await asyncio.sleep(0.5)
            await first.__aexit__(None, None, None)

        t0 = time.monotonic()
        releaser = asyncio.create_task(later())
        async with lockext.alock(URL, lock_id, ttl=10, wait=5) as g2:
            self.assertGreater(g2.token, g1.token)
        await releaser
        self.assertGreater(time.monotonic() - t0, 0.3)

    async def test_a_grant_that_waited_longer_than_its_ttl_is_held(self):
        lock_id = new_id("async-long-wait")
        await self.db.execute("SELECT lockext.lock_acquire(%s, 'psql', '3 seconds')", (lock_id,))  # expires by itself
        t0 = time.monotonic()
        async with lockext.alock(URL, lock_id, ttl=2, wait=10) as g:
            self.assertGreater(time.monotonic() - t0, 2)  # it did wait longer than its ttl
            self.assertFalse(g.lost, g.reason)
            await asyncio.sleep(1.5)  # two renewals
            self.assertFalse(g.lost, g.reason)
            self.assertGreaterEqual(g.renewals, 1)
        self.assertIs(g.released, True)

    async def test_loss_and_release_on_exception(self):
        lock_id = new_id("async-lost")
        with self.assertRaises(lockext.LeaseLost):
            async with lockext.alock(URL, lock_id, ttl=1) as g:
                await self.one("SELECT lockext.lock_release(%s, %s, %s)", lock_id, g.owner, g.token)
                for _ in range(30):
                    if g.lost:
                        break
                    await asyncio.sleep(0.05)
                self.assertIn("refused", g.reason or "")
                async with g.transaction(self.db, fence=new_id("res")):
                    self.fail("a lost grant opened a fenced transaction")
        self.assertIs(g.released, False)

        lock_id = new_id("async-exc")
        with self.assertRaises(ZeroDivisionError):
            async with lockext.alock(URL, lock_id, ttl=30) as g:
                1 / 0
        self.assertIs(g.released, True)
        self.assertIsNone(await self.one("SELECT 1 FROM lockext.holders WHERE lock_id = %s", lock_id))

    @unittest.skipIf(POOLED, "behind a pooler, a terminated server connection is replaced unseen")
    async def test_connection_terminated(self):
        lock_id = new_id("async-terminated")
        with self.assertRaises(lockext.LeaseLost):
            async with lockext.alock(URL, lock_id, ttl=2) as g:
                (pid,) = await self.one("SELECT pid FROM lockext.holders WHERE lock_id = %s", lock_id)
                await self.one("SELECT pg_terminate_backend(%s)", pid)
                for _ in range(30):
                    if g.lost:
                        break
                    await asyncio.sleep(0.05)
                g.check()
        self.assertIn("renewal failed", g.reason)
        self.assertIs(g.released, True)  # on a fresh connection


if __name__ == "__main__":
    unittest.main()
