"""Keep-alives (lockext.keepalive) against a real cluster: one renewal for many leases.
Run as the other tests (test_lockext.py's docstring): LOCKEXT_URL, LOCKEXT_DIRECT_URL."""

import datetime
import threading
import time
import unittest
from unittest import mock

import psycopg

import lockext

from test_lockext import POOLED, URL, Base, eventually, new_id, warm_pool


class KeepAliveBase(Base):
    def keepalive_row(self, ka):
        return self.db.execute(
            "SELECT expires_at, renewals, ended, leases FROM lockext.keepalive_holders WHERE keepalive = %s",
            (ka.id,)).fetchone()

    def attached(self, ka):
        """lock_id -> (fence_token, expires_at) of the live leases attached to `ka`."""
        return {lock_id: (token, expires) for lock_id, token, expires in self.db.execute(
            "SELECT lock_id, fence_token, expires_at FROM lockext.holders WHERE keepalive = %s", (ka.id,))}

    def rival_takes(self, lock_id):
        """A rival owner's lock_acquire, no wait: its token, or None if refused (kept held)."""
        return self.db.execute(
            "SELECT fence_token FROM lockext.lock_acquire(%s, %s, '30 seconds')",
            (lock_id, f"rival:{new_id('o')}")).fetchone()[0]

    def expire_on_the_server(self, ka):
        """Moves the keep-alive's expiry into the past, as the server's clock passing it
        would (superuser; the renewer must not run meanwhile)."""
        self.db.execute("UPDATE lockext.keepalives SET expires_at = clock_timestamp() - interval '1 second'"
                        " WHERE keepalive = %s", (ka.id,))


class Attach(KeepAliveBase):
    def test_one_renewal_extends_every_attached_lease(self):
        ids = [new_id(f"part-{i}") for i in range(4)]
        with lockext.keepalive(URL, ttl=30, background=False) as ka:
            self.assertIs(type(ka.id), int)
            grants = [ka.lock(i) for i in ids[:3]]
            grants.append(lockext.lock(URL, ids[3], keepalive=ka))  # the same, by lock()
            self.assertEqual(len({g.token for g in grants}), 4)  # each its own grant and token
            self.assertTrue(all(g.keepalive is ka and not g.lost for g in grants))
            seen = self.attached(ka)
            self.assertEqual(set(seen), set(ids))
            self.assertEqual({t for t, _ in seen.values()}, {g.token for g in grants})
            self.assertEqual({e for _, e in seen.values()}, {ka.expires_at})
            self.assertEqual(self.keepalive_row(ka)[3], 4)
            for i in ids:
                self.assertIsNone(self.rival_takes(i), i)

            renewed_to = ka.renew(ttl=3600)
            self.assertGreater(renewed_to, ka.expires_at - datetime.timedelta(seconds=1))
            self.assertEqual(ka.expires_at, renewed_to)
            seen = self.attached(ka)
            self.assertEqual({e for _, e in seen.values()}, {renewed_to}, "not every lease was extended")
            self.assertGreater(renewed_to - datetime.datetime.now(datetime.timezone.utc), datetime.timedelta(minutes=59))
            self.assertEqual(self.keepalive_row(ka)[1], 1)
            # Without a ttl, by its own (30 s).
            left = ka.renew() - datetime.datetime.now(datetime.timezone.utc)
            self.assertTrue(datetime.timedelta(seconds=25) < left <= datetime.timedelta(seconds=30), left)
            self.assertEqual({e for _, e in self.attached(ka).values()}, {ka.expires_at})
        self.assertEqual(ka.revoked, 4)

    def test_one_connection_attaches_every_lease(self):
        """ka.lock opens no connection per lease: one connection (the keep-alive's for
        attaching) takes every lease and releases them."""
        ids = [new_id(f"conn-{i}") for i in range(8)]
        with lockext.keepalive(URL, ttl=30) as ka:
            with mock.patch("psycopg.connect", wraps=psycopg.connect) as connect:
                grants = [ka.lock(i) for i in ids]
                for g in grants[:4]:
                    self.assertIs(g.release(), True)
            self.assertEqual(connect.call_count, 1)
            self.assertEqual(set(self.attached(ka)), set(ids[4:]))
            if not POOLED:  # behind a pooler, one client connection uses several servers'
                pids = self.db.execute(
                    "SELECT DISTINCT pid FROM lockext.holders WHERE keepalive = %s", (ka.id,)).fetchall()
                self.assertEqual(len(pids), 1, pids)
        self.assertEqual(ka.revoked, 4)

    def test_lock_all_attaches_many_locks_in_one_call(self):
        ids = [new_id(f"all-{i}") for i in range(3)]
        with lockext.keepalive(URL, ttl=30) as ka:
            grants = ka.lock_all(reversed(ids))
            self.assertEqual([g.lock_id for g in grants], sorted(ids))
            self.assertEqual(len({g.owner for g in grants}), 1)
            self.assertTrue(all(g.keepalive is ka and not g.lost for g in grants))
            self.assertEqual({i: t for i, (t, _) in self.attached(ka).items()}, {g.lock_id: g.token for g in grants})
            # All or nothing: one lock of the set taken by a rival, and none is attached.
            taken = new_id("all-taken")
            self.assertIsNotNone(self.rival_takes(taken))
            more = [new_id("all-x"), taken]
            with self.assertRaises(lockext.NotAcquired):
                ka.lock_all(more)
            self.assertEqual(set(self.attached(ka)), set(ids))
            for bad, shown in [([], "[]"), ("abc", "'abc'"), ([b"x"], "b'x'"), (["a", ""], "''")]:
                with self.assertRaises(lockext.InvalidArgument) as cm:
                    ka.lock_all(bad)
                self.assertIn(shown, str(cm.exception))
            with grants[0]:
                pass  # released at the end of its block
            self.assertEqual(set(self.attached(ka)), {g.lock_id for g in grants[1:]})
        self.assertEqual(ka.revoked, 2)

    def test_background_renewal_keeps_short_leases_past_their_ttl(self):
        ids = [new_id(f"bg-{i}") for i in range(3)]
        warm_pool()
        with lockext.keepalive(URL, ttl=1) as ka:
            grants = [ka.lock(i) for i in ids]
            deadline = time.monotonic() + 3.2
            while time.monotonic() < deadline:
                time.sleep(0.4)
                ka.check()
                for g in grants:
                    g.check()
                self.assertIsNone(self.rival_takes(ids[0]), "a rival got a lock whose keep-alive is renewed")
            self.assertGreaterEqual(ka.renewals, 5)  # every 1/3 s; past psycopg's prepare threshold too
            expiry, renewals, ended, leases = self.keepalive_row(ka)
            self.assertEqual((ended, leases), (False, 3))
            self.assertGreaterEqual(renewals, 5)
            self.assertEqual({e for _, e in self.attached(ka).values()}, {expiry})
            self.assertEqual(set(self.attached(ka)), set(ids))
            # An attached lease may be released one by one, inside the keep-alive.
            with ka.lock(new_id("inner")) as inner:
                inner.check()
            self.assertIs(inner.released, True)
        self.assertEqual(ka.revoked, 3)
        self.assertEqual(self.attached(ka), {})

    def test_fenced_writes_of_an_attached_grant(self):
        resource = new_id("res")
        with lockext.keepalive(URL, ttl=5) as ka:
            with ka.lock(new_id("fenced")) as g:
                g.fenced_update(self.db, resource, {"n": 1})
                with g.transaction(self.db, fence=resource):
                    pass
                self.assertEqual(g.proclaim({"v": 1}), 1)
        self.assertEqual(self.db.execute("SELECT fence_token FROM lockext.resources WHERE resource_id = %s",
                                         (resource,)).fetchone()[0], g.token)


class Lapse(KeepAliveBase):
    def test_lapsed_keepalive_frees_every_lock_at_once(self):
        ids = [new_id(f"lapse-{i}") for i in range(3)]
        resource = new_id("lapse-res")
        lost = []
        ka = lockext.keepalive(URL, ttl=1, on_lost=lost.append)
        try:
            grants = [ka.lock(i) for i in ids]
            grants[0].fenced_update(self.db, resource, {"writer": "old"})
            self.assertTrue(eventually(lambda: ka.renewals >= 2, 2))
            ka._stop.set()  # stands for a renewer that stopped (a paused process)
            ka._thread.join()
            self.assertTrue(eventually(lambda: not self.attached(ka), 2), "the keep-alive did not lapse")
            self.assertTrue(ka.lost)  # by the local clock, whatever the server says
            for g in grants:
                self.assertTrue(g.lost)
                with self.assertRaises(lockext.LeaseLost):
                    g.check()
            # Another client takes each lock at once (no wait), with a newer token.
            for g in grants:
                token = self.rival_takes(g.lock_id)
                self.assertIsNotNone(token, g.lock_id)
                self.assertGreater(token, g.token)
            with lockext.lock(URL, new_id("newer"), ttl=5) as newer:
                newer.fenced_update(self.db, resource, {"writer": "newer"})
            with self.assertRaises(lockext.StaleToken):
                lockext.fenced_update(self.db, resource, grants[0].token, {"writer": "old again"})
            # The grants ended it (or the reaper did, and may have deleted it since):
            # renewing is refused, and the loss was reported once, with its first reason.
            self.assertIn(self.keepalive_row(ka), [None] + [(mock.ANY, mock.ANY, True, n) for n in range(4)])
            with self.assertRaises(lockext.LeaseLost):
                ka.renew()
            self.assertEqual(lost, [ka])
            self.assertEqual(ka.reason, "no renewal succeeded within the TTL")
            self.assertIsNone(ka._renew_once(), "the server renewed a keep-alive the grants ended")
            with self.assertRaises(lockext.LeaseLost) as cm:
                lockext.lock(URL, new_id("late"), keepalive=ka.id)  # attaching: the server says 55000
            self.assertEqual(cm.exception.sqlstate, "55000")
        finally:
            ka.revoke()
        for g in grants:  # the rivals' leases are left alone
            self.assertIs(g.release(), False)
            self.assertIsNotNone(self.db.execute("SELECT 1 FROM lockext.holders WHERE lock_id = %s",
                                                 (g.lock_id,)).fetchone())

    def test_lost_keepalive_fails_the_block(self):
        with self.assertRaises(lockext.LeaseLost):
            with lockext.keepalive(URL, ttl=1) as ka:
                ka.lock(new_id("block"))
                self.db.execute("SELECT lockext.lock_keepalive_revoke(%s)", (ka.id,))
                self.assertTrue(eventually(lambda: ka.lost, 1.5))


class Revoke(KeepAliveBase):
    def test_revoke_ends_every_attached_lease(self):
        ids = [new_id(f"rev-{i}") for i in range(3)]
        lost = []
        with lockext.keepalive(URL, ttl=30, on_lost=lost.append) as ka:
            grants = [ka.lock(ids[0]), ka.lock(ids[1], mode="shared"), ka.lock(ids[2], permits=2)]
            self.assertEqual(set(self.attached(ka)), set(ids))
            self.assertEqual(ka.revoke(), 3)
            self.assertEqual(self.attached(ka), {})
            for i in ids:
                self.assertIsNotNone(self.rival_takes(i), f"{i} not free after the revoke")
            self.assertTrue(all(g.lost for g in grants))
            self.assertEqual(ka.revoke(), 3)  # twice: the first answer
            with self.assertRaises(lockext.LeaseLost):
                ka.lock(new_id("after"))
            with self.assertRaises(lockext.LeaseLost):
                ka.renew()
        self.assertEqual(lost, [], "on_lost is for losses, not for the holder's own revoke")
        self.assertIs(grants[0].release(), False)


class OnLost(KeepAliveBase):
    def test_on_lost_fires_when_the_keepalive_is_revoked_elsewhere(self):
        fired = threading.Event()
        seen = []

        def on_lost(k):
            seen.append((k, threading.current_thread().name))
            fired.set()

        ka = lockext.keepalive(URL, ttl=1.5, on_lost=on_lost)
        try:
            g = ka.lock(new_id("fires"))
            self.assertFalse(fired.wait(0.7), "fired while the keep-alive was live")
            self.assertEqual(self.db.execute("SELECT lockext.lock_keepalive_revoke(%s)", (ka.id,)).fetchone()[0], 1)
            self.assertTrue(fired.wait(1.5), "on_lost did not fire")
            self.assertEqual(seen, [(ka, f"lockext-keepalive:{ka.id}")])
            self.assertIn("refused", ka.reason)
            self.assertTrue(g.lost)
            with self.assertRaises(lockext.LeaseLost):
                g.fenced_update(self.db, new_id("res"), {"late": True})
        finally:
            ka.revoke()
        self.assertEqual(len(seen), 1)

    def test_on_lost_fires_when_a_grant_ends_the_expired_keepalive(self):
        fired = threading.Event()
        lock_id = new_id("ended")
        ka = lockext.keepalive(URL, ttl=3, on_lost=lambda k: fired.set())
        try:
            ka.lock(lock_id)
            self.expire_on_the_server(ka)
            self.assertIsNotNone(self.rival_takes(lock_id))  # ends the keep-alive, then takes over
            self.assertTrue(fired.wait(2), "on_lost did not fire")  # the next renewal, 1 s on
            self.assertTrue(ka.lost)
        finally:
            ka.revoke()

    def test_a_failing_callback_is_reported_not_raised(self):
        reported = []
        old, threading.excepthook = threading.excepthook, reported.append
        self.addCleanup(setattr, threading, "excepthook", old)
        ka = lockext.keepalive(URL, ttl=30, background=False, on_lost=lambda k: 1 / 0)
        self.db.execute("SELECT lockext.lock_keepalive_revoke(%s)", (ka.id,))
        with self.assertRaises(lockext.LeaseLost):
            ka.renew()
        self.assertEqual([r.exc_type for r in reported], [ZeroDivisionError])
        ka.revoke()


class Errors(KeepAliveBase):
    def test_bad_input_is_refused_and_changes_nothing(self):
        lock_id = new_id("bad")
        with lockext.keepalive(URL, ttl=30) as ka:
            with self.assertRaises(lockext.InvalidArgument) as cm:  # a ttl with a keep-alive
                lockext.lock(URL, lock_id, ttl=5, keepalive=ka)
            self.assertEqual(cm.exception.sqlstate, "22023")
            with self.assertRaises(lockext.InvalidArgument) as cm:  # session-bound and attached
                lockext.lock(URL, lock_id, session_bound=True, keepalive=ka)
            self.assertEqual(cm.exception.sqlstate, "22023")
            with self.assertRaises(lockext.LeaseLost) as cm:  # no such keep-alive
                lockext.lock(URL, lock_id, keepalive=ka.id + 1_000_000_000)
            self.assertEqual(cm.exception.sqlstate, "55000")
            with self.assertRaises(lockext.InvalidArgument):
                lockext.lock(URL, lock_id, keepalive="1")
            with self.assertRaises(lockext.InvalidArgument):
                lockext.lock(URL, lock_id, keepalive=ka, renew_every=1)
            with self.assertRaises(lockext.InvalidArgument):
                ka.renew(ttl=datetime.timedelta(days=2))
            self.assertFalse(ka.lost, "a refused argument is not a loss")
            self.assertIsNone(self.holder(lock_id))
            self.assertEqual(self.keepalive_row(ka)[3], 0)
        with self.assertRaises(lockext.InvalidArgument) as cm:
            lockext.keepalive(URL, ttl=datetime.timedelta(days=2))
        self.assertEqual(cm.exception.sqlstate, "22023")
        for bad in [0, "30", 1e300]:
            with self.assertRaises(lockext.InvalidArgument):
                lockext.keepalive(URL, ttl=bad)
        with self.assertRaises(lockext.InvalidArgument):
            lockext.keepalive(URL, ttl=1, renew_every=1)


if __name__ == "__main__":
    unittest.main()
