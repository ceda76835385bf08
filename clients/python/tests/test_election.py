"""Leader election as the README shows it (lockext.campaign with a wait longer than the
ttl), with three candidate processes and the leader killed with SIGKILL: after the
take-over the new leader keeps its lease. Run as the other tests (test_lockext.py's
docstring): LOCKEXT_URL, LOCKEXT_DIRECT_URL."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import unittest

import lockext

from test_lockext import URL, Base, new_id

TTL = 2  # the README's example has ttl=10, wait=30: what matters is a wait longer than the ttl
WAIT = 30

# One candidate, the README's "Leader election" example: campaign, then lead, checking the
# grant, until killed. Prints what happens, one line each, for the test to read.
CANDIDATE = r"""
import sys, time, lockext
url, lock_id, name, ttl, wait = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
while True:
    try:
        with lockext.campaign(url, lock_id, {"addr": name}, ttl=ttl, wait=wait) as grant:
            print("leader", name, grant.token, flush=True)
            seen = 0
            while True:
                grant.check()  # LeaseLost once the lease is lost
                if grant.renewals != seen:
                    seen = grant.renewals
                    print("renewed", name, grant.token, seen, flush=True)
                time.sleep(0.02)
    except lockext.NotAcquired:
        print("waited", name, flush=True)
    except lockext.LeaseLost as e:
        print("lost", name, str(e).replace(" ", "_"), flush=True)
        sys.exit(1)
"""


class Election(Base):
    def start(self, lock_id):
        events = queue.Queue()
        procs = {}

        def read(proc):
            for line in proc.stdout:
                events.put(line.split())
            events.put(["exited", str(proc.pid)])

        for name in ("node-1", "node-2", "node-3"):
            procs[name] = subprocess.Popen(
                [sys.executable, "-c", CANDIDATE, URL, lock_id, name, str(TTL), str(WAIT)],
                stdout=subprocess.PIPE, text=True)
            threading.Thread(target=read, args=(procs[name],), daemon=True).start()

        def stop():
            for proc in procs.values():
                proc.kill()
                proc.wait()
                proc.stdout.close()
        self.addCleanup(stop)
        return procs, events

    def next_event(self, events, what, timeout=30):
        try:
            words = events.get(timeout=timeout)
        except queue.Empty:
            self.fail(f"{what}: nothing happened within {timeout} s")
        self.assertNotEqual(words[0], "lost", f"{what}: a leader lost its lease: {words}")
        return words

    def test_a_leader_at_all_times_past_the_take_over(self):
        lock_id = new_id("election")
        procs, events = self.start(lock_id)

        # 1. One leader; it renews twice, while the others wait in campaign (wait > ttl).
        while (words := self.next_event(events, "the first election"))[0] != "leader":
            pass
        first, first_token = words[1], int(words[2])
        while not (words[0] == "renewed" and words[1] == first and int(words[3]) >= 2):
            words = self.next_event(events, "the leader's renewals")

        # 2. SIGKILL the leader: its lease runs out after the ttl and a follower, which has
        #    waited longer than the ttl by then, is granted the lock.
        procs[first].send_signal(signal.SIGKILL)
        while not (words[0] == "leader" and words[1] != first):
            words = self.next_event(events, "the take-over")
        second, second_token = words[1], int(words[2])
        self.assertGreater(second_token, first_token)

        # 3. The new leader keeps leading past its own ttl (three renewals), and the server
        #    shows it as the leader all along.
        while not (words[0] == "renewed" and words[1] == second and int(words[3]) >= 3):
            leaders = lockext.holders(self.db, lock_id)
            self.assertEqual([h.token for h in leaders], [second_token], f"not the new leader alone: {leaders}")
            words = self.next_event(events, "the new leader's renewals")
        self.assertIsNone(procs[second].poll())
        leaders = lockext.holders(self.db, lock_id)
        self.assertEqual([(h.token, h.value) for h in leaders], [(second_token, {"addr": second})])


if __name__ == "__main__":
    unittest.main()
