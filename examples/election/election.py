#!/usr/bin/env python3
"""Leader election with lockext: three processes campaign for one lock; the leader
publishes its address as its grant's value, and the followers learn it, and learn the next
one, with lockext.lock_observe (no polling on their side). The leader is then killed with
SIGKILL: nothing releases its lease, a follower takes over once its ttl has run out, and the
remaining follower learns the new leader's address.

    LOCKEXT_URL=postgresql://postgres@127.0.0.1:5499/postgres python3 election.py

Needs psycopg 3 and a database with lockext installed, reached directly or through
PgBouncer in transaction pooling mode (every call is one statement). Exits non-zero if the
election does not go as described within its deadlines.

`election.py node NAME ADDRESS` is one candidate (the script starts three of itself): it
prints `leader NAME TOKEN ADDRESS` when it wins and `follower NAME sees TOKEN ADDRESS` each
time it learns of a leader, one line each, for the coordinator to read.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import psycopg

LOCK = "example:election:primary"
TTL = "2 seconds"  # how long a dead leader keeps the lock: the take-over's delay
RENEW_EVERY = 0.5


def say(*words):
    print(*words, flush=True)


def node(url, name, address):
    """One candidate: campaign; lead (renewing) while it can; else follow, observing."""
    conn = psycopg.connect(url, autocommit=True, prepare_threshold=None)
    value = json.dumps({"addr": address})
    known_token, known_version = None, None
    while True:
        # Campaign: take the lock with our address as its value, waiting up to a second.
        row = conn.execute(
            "SELECT fence_token FROM lockext.lock_campaign(%s, %s, %s, %s::jsonb, wait => '1 second')",
            (LOCK, name, TTL, value),
        ).fetchone()
        if row[0] is not None:
            token = row[0]
            say("leader", name, token, address)
            # Lead: renew with our token until a renewal is refused (our lease is gone).
            while conn.execute(
                "SELECT lockext.lock_renew(%s, %s, %s, %s)", (LOCK, name, TTL, token)
            ).fetchone()[0] is not None:
                time.sleep(RENEW_EVERY)
            say("lost", name, token)
            continue
        # Follow: wait until the leader, or its value, is not the one we know.
        changed, owner, token, value_now, version = conn.execute(
            "SELECT changed, owner, fence_token, value, version"
            "  FROM lockext.lock_observe(%s, %s, %s, '1 second')",
            (LOCK, known_token, known_version),
        ).fetchone()
        if changed:
            known_token, known_version = token, version
            if token is not None and value_now is not None:
                say("follower", name, "sees", token, value_now["addr"])


def coordinator(url):
    me = os.path.abspath(__file__)
    names = {"node-1": "10.0.0.1:5432", "node-2": "10.0.0.2:5432", "node-3": "10.0.0.3:5432"}
    events = queue.Queue()
    procs = {}

    def read(name, proc):
        for line in proc.stdout:
            events.put((time.monotonic(), line.split()))
        events.put((time.monotonic(), ["exited", name]))

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT lockext.lock_release(%s, owner) FROM lockext.lock_holders(%s)", (LOCK, LOCK))
    for name, address in names.items():
        procs[name] = subprocess.Popen([sys.executable, me, "node", name, address],
                                       stdout=subprocess.PIPE, text=True, env={**os.environ, "LOCKEXT_URL": url})
        threading.Thread(target=read, args=(name, procs[name]), daemon=True).start()

    def until(what, deadline, done):
        """Reads events until done(state) says it is over; fails at the deadline."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"FAILED: {what} did not happen in time")
            try:
                at, words = events.get(timeout=left)
            except queue.Empty:
                continue
            print("   ", " ".join(words))
            result = done(words)
            if result is not None:
                return at, result

    try:
        # 1. One leader; both followers learn its address.
        state = {"leader": None, "seen": {}}

        def elected(words):
            if words[0] == "leader":
                state["leader"] = (words[1], int(words[2]), words[3])
            elif words[0] == "follower":
                state["seen"][words[1]] = (int(words[3]), words[4])
            leader = state["leader"]
            if leader and sum(1 for n, s in state["seen"].items()
                              if n != leader[0] and s == (leader[1], leader[2])) == 2:
                return leader
            return None

        _, (first, first_token, first_address) = until("the first election", time.monotonic() + 20, elected)
        print(f"elected {first} ({first_address}); both followers know it")

        # 2. SIGKILL the leader: its lease runs out after the ttl, a follower takes over, and
        #    the other follower learns the new address.
        killed_at = time.monotonic()
        procs[first].send_signal(signal.SIGKILL)
        state = {"leader": None, "seen": {}}

        def re_elected(words):
            if words[0] == "leader" and words[1] != first:
                state["leader"] = (words[1], int(words[2]), words[3])
            elif words[0] == "follower":
                state["seen"][words[1]] = (int(words[3]), words[4])
            leader = state["leader"]
            if leader:
                others = [n for n in names if n not in (first, leader[0])]
                if all(state["seen"].get(n) == (leader[1], leader[2]) for n in others):
                    return leader
            return None

        at, (second, second_token, second_address) = until(
            "the take-over", time.monotonic() + 20, re_elected)
        assert second_token > first_token, (first_token, second_token)
        assert second_address == names[second]
        print(f"{first} killed; {second} ({second_address}) took over with token {second_token} "
              f"{at - killed_at:.1f} s later (ttl {TTL}); the other follower knows it")
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute("SELECT owner, fence_token, value FROM lockext.lock_holders(%s)", (LOCK,)).fetchall()
        assert rows == [(second, second_token, {"addr": second_address})], rows
        print("OK")
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT lockext.lock_release(%s, owner) FROM lockext.lock_holders(%s)", (LOCK, LOCK))


if __name__ == "__main__":
    URL = os.environ.get("LOCKEXT_URL", "postgresql://postgres@127.0.0.1:5499/postgres")
    if len(sys.argv) == 4 and sys.argv[1] == "node":
        node(URL, sys.argv[2], sys.argv[3])
    else:
        coordinator(URL)
