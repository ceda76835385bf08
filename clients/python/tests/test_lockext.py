"""lockext (Python client) against a real cluster:

    LOCKEXT_URL=postgresql://postgres@127.0.0.1:5499/postgres python3 -m unittest discover -s clients/python/tests -v

LOCKEXT_URL is what the library connects to (a PgBouncer in transaction pooling mode, say);
LOCKEXT_DIRECT_URL (default: LOCKEXT_URL) reaches the server itself, for what a pooler
hides: a backend to terminate, a second database. Tests import the *installed* package
(the src layout keeps the source tree off sys.path).
"""

import datetime
import os
import socket
import threading
import time
import unittest
import uuid

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.pq import TransactionStatus

import lockext

URL = os.environ.get("LOCKEXT_URL", "postgresql://postgres@127.0.0.1:5499/postgres")
DIRECT_URL = os.environ.get("LOCKEXT_DIRECT_URL", URL)
POOLED = URL != DIRECT_URL
ERA_DB = "lockext_clients_era"  # a second lockext database: its tokens carry era >= 1


def connect(url=URL):
    return psycopg.connect(url, autocommit=True, prepare_threshold=None)


def new_id(what):
    return f"py-client:{what}:{uuid.uuid4().hex[:10]}"


def warm_pool(servers=4):
    """Behind a pooler, makes it open `servers` server connections (transactions held open
    at once), so that with server_round_robin a client's next transactions go to other
    ones: state left in one (a prepared statement) is then missed in the next."""
    if not POOLED:
        return
    conns = [psycopg.connect(URL) for _ in range(servers)]
    try:
        pids = {c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in conns}
        assert len(pids) == servers, f"the pooler gave {len(pids)} server connections, not {servers}"
    finally:
        for c in conns:
            c.rollback()  # a client that leaves mid-transaction takes its server connection with it
            c.close()


def eventually(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


class Base(unittest.TestCase):
    def setUp(self):
        self.db = connect()
        self.addCleanup(self.db.close)

    def holder(self, lock_id):
        return self.db.execute(
            "SELECT owner, fence_token, fence_token::text, pid, expires_at - acquired_at"
            " FROM lockext.holders WHERE lock_id = %s", (lock_id,)).fetchone()

    def other_owner_gets(self, lock_id):
        """Whether a rival owner's lock_acquire (no wait) is granted; releases it if so."""
        owner = f"rival:{uuid.uuid4().hex[:8]}"
        token = self.db.execute(
            "SELECT fence_token FROM lockext.lock_acquire(%s, %s, '5 seconds')", (lock_id, owner)).fetchone()[0]
        if token is not None:
            self.db.execute("SELECT lockext.lock_release(%s, %s)", (lock_id, owner))
        return token is not None


class Acquire(Base):
    def test_grant_token_owner_and_release_at_exit(self):
        lock_id = new_id("basic")
        with lockext.lock(URL, lock_id, ttl=5) as g:
            owner, token, text, _, _ = self.holder(lock_id)
            self.assertIs(type(g.token), int)
            self.assertEqual((owner, token, text), (g.owner, g.token, str(g.token)))
            host, pid, rnd = g.owner.split(":")
            self.assertEqual((host, pid), (socket.gethostname(), str(os.getpid())))
            self.assertTrue(rnd)
            self.assertFalse(g.lost)
        self.assertIsNone(self.holder(lock_id))
        self.assertIs(g.released, True)

    def test_refused_raises_not_acquired_at_once(self):
        lock_id = new_id("refused")
        with lockext.lock(URL, lock_id, ttl=5) as g:
            t0 = time.monotonic()
            # Same process, default owner: must still be refused (owners are per grant).
            with self.assertRaises(lockext.NotAcquired):
                lockext.lock(URL, lock_id, ttl=5)
            self.assertLess(time.monotonic() - t0, 2)
            self.assertEqual(self.holder(lock_id)[1], g.token)

    def test_wait_gets_the_lock_when_released(self):
        lock_id = new_id("wait")
        first = lockext.lock(URL, lock_id, ttl=10)
        releaser = threading.Timer(0.5, first.release)
        releaser.start()
        t0 = time.monotonic()
        with lockext.lock(URL, lock_id, ttl=10, wait=5) as second:
            waited = time.monotonic() - t0
            self.assertGreater(second.token, first.token)
        self.assertTrue(0.3 < waited < 4, waited)
        # The waiter's grant can be read before the releasing thread reads its answer.
        releaser.join(10)
        self.assertIs(first.released, True)

    def test_wait_runs_out(self):
        lock_id = new_id("wait-out")
        with lockext.lock(URL, lock_id, ttl=10):
            t0 = time.monotonic()
            with self.assertRaises(lockext.NotAcquired):
                lockext.lock(URL, lock_id, ttl=10, wait=0.5)
            self.assertGreater(time.monotonic() - t0, 0.4)

    def test_ttl_and_wait_as_numbers_and_timedelta(self):
        for ttl, expect in [(2, 2.0), (1.5, 1.5), (datetime.timedelta(seconds=3), 3.0)]:
            lock_id = new_id("ttl")
            with lockext.lock(URL, lock_id, ttl=ttl, wait=1):
                self.assertEqual(self.holder(lock_id)[4].total_seconds(), expect, ttl)
        for bad in [0, -1, float("nan"), "30", True, 1e300]:
            with self.assertRaises(lockext.InvalidArgument, msg=repr(bad)):
                lockext.lock(URL, new_id("bad-ttl"), ttl=bad)
        with self.assertRaises(lockext.InvalidArgument):  # the server's bound: 1 day
            lockext.lock(URL, new_id("long-ttl"), ttl=datetime.timedelta(days=2))

    def test_shared_mode_and_permits_pass_through(self):
        lock_id = new_id("shared")
        with lockext.lock(URL, lock_id, ttl=5, mode="shared") as a, lockext.lock(URL, lock_id, ttl=5, mode="shared") as b:
            self.assertNotEqual(a.token, b.token)
            with self.assertRaises(lockext.NotAcquired):
                lockext.lock(URL, lock_id, ttl=5)
        sem = new_id("sem")
        with lockext.lock(URL, sem, ttl=5, permits=1):
            with self.assertRaises(lockext.NotAcquired):
                lockext.lock(URL, sem, ttl=5, permits=1)


class Renewal(Base):
    def test_short_lease_outlives_its_ttl(self):
        lock_id = new_id("renew")
        warm_pool()
        with lockext.lock(URL, lock_id, ttl=1) as g:
            deadline = time.monotonic() + 3.2
            checks = 0
            while time.monotonic() < deadline:
                time.sleep(0.4)
                g.check()
                self.assertFalse(self.other_owner_gets(lock_id), "a rival got a lock whose holder renews it")
                checks += 1
            self.assertGreaterEqual(g.renewals, 5)  # every 1/3 s; > 5 also passes psycopg's prepare threshold
            self.assertEqual(self.holder(lock_id)[1], g.token)
        self.assertIs(g.released, True)
        self.assertTrue(self.other_owner_gets(lock_id))

    def test_implicit_transaction_connection_handed_in(self):
        """The trial's bug: a lease taken on a non-autocommit connection stayed uncommitted."""
        user = psycopg.connect(URL)  # autocommit off, as psycopg's default
        self.addCleanup(user.close)
        user.execute("SELECT 1")  # psycopg has opened a transaction
        lock_id = new_id("implicit")
        with lockext.lock(user, lock_id, ttl=1) as g:
            self.assertEqual(self.holder(lock_id)[1], g.token, "the grant is not visible (not committed)")
            time.sleep(1.6)
            g.check()
            self.assertGreaterEqual(g.renewals, 2)
            self.assertFalse(self.other_owner_gets(lock_id))
        self.assertIs(g.released, True)
        self.assertIsNone(self.holder(lock_id))
        self.assertEqual(user.info.transaction_status, TransactionStatus.INTRANS, "the caller's transaction was touched")


class Loss(Base):
    def test_released_from_outside(self):
        lock_id = new_id("lost")
        steps = 0
        with self.assertRaises(lockext.LeaseLost):
            with lockext.lock(URL, lock_id, ttl=1) as g:
                self.assertTrue(self.db.execute(
                    "SELECT lockext.lock_release(%s, %s, %s)", (lock_id, g.owner, g.token)).fetchone()[0])
                self.assertTrue(eventually(lambda: g.lost, 1.5), "renewer did not notice")
                self.assertIn("refused", g.reason)
                while True:
                    g.check()
                    steps += 1
        self.assertEqual(steps, 0)
        self.assertIs(g.released, False)

    def test_lost_lease_fails_the_block_even_without_check(self):
        lock_id = new_id("lost-unchecked")
        with self.assertRaises(lockext.LeaseLost):
            with lockext.lock(URL, lock_id, ttl=1) as g:
                self.db.execute("SELECT lockext.lock_release(%s, %s)", (lock_id, g.owner))
                time.sleep(0.1)  # the block ends before the renewer's next turn

    def test_body_exception_wins_over_lease_lost(self):
        lock_id = new_id("lost-exc")
        with self.assertRaises(KeyError):
            with lockext.lock(URL, lock_id, ttl=1) as g:
                self.db.execute("SELECT lockext.lock_release(%s, %s)", (lock_id, g.owner))
                eventually(lambda: g.lost, 1.5)
                raise KeyError("the body's own error")

    @unittest.skipIf(POOLED, "behind a pooler, a terminated server connection is replaced unseen")
    def test_connection_terminated(self):
        lock_id = new_id("terminated")
        with self.assertRaises(lockext.LeaseLost):
            with lockext.lock(URL, lock_id, ttl=2) as g:
                pid = self.holder(lock_id)[3]
                self.assertTrue(self.db.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0])
                self.assertTrue(eventually(lambda: g.lost, 1.5), "renewer did not notice")
                self.assertIn("renewal failed", g.reason)
                with self.assertRaises(lockext.LeaseLost):
                    g.fenced_update(self.db, new_id("res"), {"late": True})
        # The release went on a fresh connection: the lock is free before its TTL.
        self.assertIs(g.released, True)
        self.assertIsNone(self.holder(lock_id))

    @unittest.skipIf(POOLED, "session-bound leases mean nothing behind a transaction pooler")
    def test_session_bound_ends_with_the_connection(self):
        lock_id = new_id("session")
        with self.assertRaises(lockext.LeaseLost):
            with lockext.lock(URL, lock_id, ttl=6, session_bound=True) as g:
                self.db.execute("SELECT pg_terminate_backend(%s)", (self.holder(lock_id)[3],))
                self.assertTrue(eventually(lambda: self.holder(lock_id) is None, 2), "lease outlived its session")
                self.assertTrue(eventually(lambda: g.lost, 3))  # its next renewal, 2 s on, fails

    def test_exception_in_body_releases(self):
        lock_id = new_id("exc")
        with self.assertRaises(ZeroDivisionError):
            with lockext.lock(URL, lock_id, ttl=30) as g:
                1 / 0
        self.assertIs(g.released, True)
        self.assertTrue(self.other_owner_gets(lock_id))

    def test_local_expiry_without_renewals(self):
        """A renewer that cannot run (here: never scheduled in time) is a lost lease, with
        its reason, from the first moment `lost` says so."""
        lock_id = new_id("paused")
        g = lockext.lock(URL, lock_id, ttl=1, renew_every=0.99)
        try:
            g._stop.set()  # stands for a process paused past its lease
            self.assertTrue(eventually(lambda: g.lost, 1.5))
            self.assertEqual(g.reason, "no renewal succeeded within the TTL")
            with self.assertRaises(lockext.LeaseLost):
                g.check()
        finally:
            g.release()

    def test_lost_stays_lost(self):
        """A renewal stuck past the ttl (its connection busy) marks the grant lost, and the
        renewal that goes through afterwards does not make it held again."""
        lock_id = new_id("stuck")
        g = lockext.lock(URL, lock_id, ttl=1)
        try:
            with g._conn.lock:  # psycopg's lock of the renewer's connection: its next renewal waits
                self.assertTrue(eventually(lambda: g.lost, 3))
                self.assertEqual(g.reason, "no renewal succeeded within the TTL")
                renewals = g.renewals
            g._thread.join(5)  # the renewer ends at its next look at the lease
            self.assertFalse(g._thread.is_alive())
            self.assertTrue(g.lost)
            self.assertEqual(g.reason, "no renewal succeeded within the TTL")
            self.assertEqual(g.renewals, renewals)
        finally:
            g.release()

    def test_a_grant_that_waited_longer_than_its_ttl_is_held(self):
        """The local clock starts from the grant as the server made it: a lock that was
        granted after a wait longer than its ttl is held, and stays held."""
        lock_id = new_id("long-wait")
        self.db.execute("SELECT lockext.lock_acquire(%s, 'psql', '3 seconds')", (lock_id,))  # expires by itself
        for take in (lambda: lockext.lock(URL, lock_id, ttl=2, wait=10),
                     lambda: lockext.campaign(URL, lock_id, {"addr": "a"}, ttl=2, wait=10)):
            t0 = time.monotonic()
            with take() as g:
                self.assertGreater(time.monotonic() - t0, 2)  # it did wait longer than its ttl
                self.assertFalse(g.lost, g.reason)
                self.assertIsNone(g.reason)
                self.assertTrue(eventually(lambda: g.renewals >= 2 or g.lost, 5))
                self.assertFalse(g.lost, g.reason)
                g.check()
            self.assertIs(g.released, True)
            # the next round waits for a lease of the same length again
            self.db.execute("SELECT lockext.lock_acquire(%s, 'psql', '3 seconds')", (lock_id,))


class Arguments(Base):
    def test_bad_arguments_raise_invalid_argument_showing_what_was_passed(self):
        """Refused before anything is sent, with the value passed (its repr) in the message."""
        lock_id = new_id("args")
        calls = [
            (lambda: lockext.lock(URL, b"bytes"), "b'bytes'"),
            (lambda: lockext.lock(URL, {"a": 1}), "{'a': 1}"),
            (lambda: lockext.lock(URL, ""), "''"),
            (lambda: lockext.lock(URL, lock_id, owner=""), "''"),
            (lambda: lockext.lock(URL, lock_id, owner=7), "7"),
            (lambda: lockext.lock(URL, lock_id, ttl=1e300), "1e+300"),
            (lambda: lockext.lock(URL, lock_id, ttl="30"), "'30'"),
            (lambda: lockext.lock(URL, lock_id, ttl=True), "True"),
            (lambda: lockext.lock(URL, lock_id, wait=-1), "-1"),
            (lambda: lockext.lock(URL, lock_id, wait=float("inf")), "inf"),
            (lambda: lockext.lock(URL, lock_id, renew_every=1e300), "1e+300"),
            (lambda: lockext.lock(URL, lock_id, mode="exclusiv"), "'exclusiv'"),
            (lambda: lockext.lock(URL, lock_id, permits="3"), "'3'"),
            (lambda: lockext.lock(URL, lock_id, session_bound="yes"), "'yes'"),
            (lambda: lockext.lock(URL, lock_id, keepalive="1"), "'1'"),
            (lambda: lockext.lock(42, lock_id), "42"),
            (lambda: lockext.campaign(URL, lock_id, {}, ttl=1e300), "1e+300"),
            (lambda: lockext.campaign(URL, b"x", {}), "b'x'"),
            (lambda: lockext.holders(self.db, b"x"), "b'x'"),
            (lambda: lockext.observe(self.db, lock_id, timeout="1"), "'1'"),
            (lambda: lockext.keepalive(URL, ttl=1e300), "1e+300"),
            (lambda: lockext.keepalive(URL, on_lost="print"), "'print'"),
            (lambda: lockext.fenced_update(self.db, "", 5, {}), "''"),
            (lambda: lockext.fenced_update(self.db, "r", 0, {}), "0"),
            (lambda: lockext.fence(self.db, "r", "5"), "'5'"),
            (lambda: lockext.declare_token(self.db, True), "True"),
            (lambda: lockext.alock(URL, b"x"), "b'x'"),
            (lambda: lockext.alock(URL, lock_id, owner=""), "''"),
        ]
        for call, shown in calls:
            with self.assertRaises(lockext.InvalidArgument, msg=shown) as cm:
                call()
            self.assertIn(f"got {shown}", str(cm.exception))
            self.assertIsNone(cm.exception.sqlstate)  # the client's own: nothing was sent
        self.assertIsNone(self.holder(lock_id))
        self.assertIsNone(self.holder("\\x6279746573"))


class Fencing(Base):
    def newer_token_writes(self, resource):
        """Another holder, with a newer token, writes `resource`."""
        with lockext.lock(URL, new_id("newer"), ttl=5) as newer:
            newer.fenced_update(self.db, resource, {"writer": "newer"})
        return newer.token

    def test_fenced_update_and_stale_token(self):
        resource = new_id("res")
        with lockext.lock(URL, new_id("fenced"), ttl=5) as g:
            g.fenced_update(self.db, resource, {"writer": "old", "n": 1})
            newer = self.newer_token_writes(resource)
            with self.assertRaises(lockext.StaleToken):
                g.fenced_update(self.db, resource, {"writer": "old", "n": 2})
        token, data = self.db.execute(
            "SELECT fence_token, data FROM lockext.resources WHERE resource_id = %s", (resource,)).fetchone()
        self.assertEqual((token, data), (newer, {"writer": "newer"}))

    def test_transaction_with_fence_rolls_back_a_stale_write(self):
        table = "py_client_ledger"
        self.db.execute(f"CREATE TABLE IF NOT EXISTS {table} (id text PRIMARY KEY, n int NOT NULL)")
        row, resource = new_id("row"), new_id("res")
        self.db.execute(f"INSERT INTO {table} VALUES (%s, 0)", (row,))
        user = psycopg.connect(URL)  # non-autocommit: the block must still commit
        self.addCleanup(user.close)
        with lockext.lock(URL, new_id("txn"), ttl=5) as g:
            with g.transaction(user, fence=resource):
                user.execute(f"UPDATE {table} SET n = n + 1 WHERE id = %s", (row,))
            self.newer_token_writes(resource)
            with self.assertRaises(lockext.StaleToken):
                with g.transaction(user, fence=resource):
                    user.execute(f"UPDATE {table} SET n = n + 100 WHERE id = %s", (row,))
        self.assertEqual(self.db.execute(f"SELECT n FROM {table} WHERE id = %s", (row,)).fetchone()[0], 1)

    def test_fence_guard_with_token_column_and_declare_token(self):
        table = "py_client_jobs"
        self.db.execute(f"CREATE TABLE IF NOT EXISTS {table} (id text PRIMARY KEY, state text, fence_token bigint)")
        self.db.execute(f"DROP TRIGGER IF EXISTS fence ON {table}")
        self.db.execute(f"CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON {table}"
                        " FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token')")
        job = new_id("job")
        old = lockext.lock(URL, new_id("guard-old"), ttl=5)
        with old:
            with old.transaction(self.db):  # the token carried in the column
                self.db.execute(f"INSERT INTO {table} VALUES (%s, 'new', %s)", (job, old.token))
            with old.transaction(self.db, declare=True):  # a write that leaves the column: declared
                self.db.execute(f"UPDATE {table} SET state = 'running' WHERE id = %s", (job,))
            with lockext.lock(URL, new_id("guard-new"), ttl=5) as new:
                with new.transaction(self.db):
                    self.db.execute(f"UPDATE {table} SET state = 'taken', fence_token = %s WHERE id = %s", (new.token, job))
            with self.assertRaises(lockext.StaleToken):
                with old.transaction(self.db, declare=True):
                    self.db.execute(f"UPDATE {table} SET state = 'done' WHERE id = %s", (job,))
            with self.assertRaises(psycopg.errors.NullValueNotAllowed):  # 22004: no token declared, psycopg's own
                with old.transaction(self.db):
                    self.db.execute(f"DELETE FROM {table} WHERE id = %s", (job,))
        self.assertEqual(self.db.execute(f"SELECT state, fence_token FROM {table} WHERE id = %s", (job,)).fetchone(),
                         ("taken", new.token))


class Election(Base):
    def test_campaign_publishes_the_value_and_holders_show_it(self):
        lock_id = new_id("campaign")
        with lockext.campaign(URL, lock_id, {"addr": "10.0.0.1:80"}, ttl=5) as g:
            [leader] = lockext.holders(self.db, lock_id)
            self.assertEqual((leader.owner, leader.kind, leader.token), (g.owner, "exclusive", g.token))
            self.assertEqual((leader.value, leader.version), ({"addr": "10.0.0.1:80"}, 1))
            with self.assertRaises(lockext.NotAcquired):
                lockext.campaign(URL, lock_id, {"addr": "10.0.0.2:80"}, ttl=5)
            self.assertEqual(g.proclaim({"addr": "10.0.0.1:81"}), 2)
            self.assertEqual(lockext.holders(self.db, lock_id)[0].value, {"addr": "10.0.0.1:81"})
        self.assertEqual(lockext.holders(self.db, lock_id), [])

    def test_observe_returns_on_a_change_and_at_the_timeout(self):
        lock_id = new_id("observe")
        seen = lockext.observe(self.db, lock_id, None, timeout=0)
        self.assertEqual(seen, lockext.Observed(False, None))
        with lockext.campaign(URL, lock_id, "v1", ttl=5) as g:
            seen = lockext.observe(self.db, lock_id, None, timeout=5)
            self.assertTrue(seen.changed)
            self.assertEqual((seen.leader.token, seen.leader.value), (g.token, "v1"))
            started = time.monotonic()
            self.assertFalse(lockext.observe(self.db, lock_id, seen.leader, timeout=0.2).changed)
            self.assertGreaterEqual(time.monotonic() - started, 0.2)
            threading.Timer(0.3, g.proclaim, args=("v2",)).start()
            later = lockext.observe(self.db, lock_id, seen.leader, timeout=10)
            self.assertEqual((later.changed, later.leader.value, later.leader.version), (True, "v2", 2))
        resigned = lockext.observe(self.db, lock_id, later.leader, timeout=10)
        self.assertEqual(resigned, lockext.Observed(True, None))

    def test_stale_leader_cannot_proclaim(self):
        lock_id = new_id("stale")
        g = lockext.campaign(URL, lock_id, "old", ttl=30)  # its renewer does not notice first
        try:
            # An operator ends the old leader's lease; a new leader takes over.
            self.db.execute("SELECT lockext.lock_release(%s, %s)", (lock_id, g.owner))
            with lockext.campaign(URL, lock_id, "new", ttl=5) as new:
                with self.assertRaises(lockext.StaleToken) as cm:
                    g.proclaim("old again")
                self.assertEqual(cm.exception.sqlstate, "55L01")
                self.assertEqual([(h.token, h.value) for h in lockext.holders(self.db, lock_id)],
                                 [(new.token, "new")])
        finally:
            g.release()


# As a superuser, a row as a dump from another cluster (system identifier 1) in era 1
# would bring: the next grant adopts it (docs/failover.md).
ADOPT_ERA_1 = """
INSERT INTO lockext.token_epoch AS t (singleton, epoch, layout, system_identifier, timeline, database, raised_at)
SELECT true, 1, 2, 1, 1, oid, now() FROM pg_database WHERE datname = current_database()
ON CONFLICT (singleton) DO UPDATE SET system_identifier = 1, layout = 2, epoch = GREATEST(t.epoch, 1)
"""


class BigTokens(unittest.TestCase):
    """Tokens carry an era in their high bits (docs/tokens.md). A database whose epoch row
    says it came from another cluster in era 1 makes the cluster adopt that history: its
    era goes above it, so tokens are above 2^41."""

    @classmethod
    def setUpClass(cls):
        with connect(DIRECT_URL) as admin:
            if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (ERA_DB,)).fetchone() is None:
                admin.execute(f"CREATE DATABASE {ERA_DB}")
        cls.url = make_conninfo(DIRECT_URL, dbname=ERA_DB)
        with connect(cls.url) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS lockext")
            c.execute(ADOPT_ERA_1)

    def test_token_above_2_31_is_exact(self):
        lock_id, resource = new_id("big"), new_id("big-res")
        with connect(self.url) as db, lockext.lock(self.url, lock_id, ttl=1) as g:
            self.assertGreater(g.token, 2**41)
            text, era = db.execute(
                "SELECT l.fence_token::text, (lockext.token_parts(l.fence_token)).era"
                " FROM lockext.locks l WHERE lock_id = %s", (lock_id,)).fetchone()
            self.assertEqual(str(g.token), text)
            self.assertGreaterEqual(era, 1)
            time.sleep(1.5)  # renewals name the grant by its token: they only match it exactly
            g.check()
            g.fenced_update(db, resource, {"ok": 1})
            self.assertEqual(db.execute("SELECT fence_token::text FROM lockext.resources WHERE resource_id = %s",
                                        (resource,)).fetchone()[0], text)
        self.assertIs(g.released, True)


if __name__ == "__main__":
    unittest.main()
