#!/usr/bin/env python3
"""lockext from Python (psycopg 3): a `with_lock` helper and three scenarios.

    python3 lockext_example.py [all|work|lost|pause]      (default: all)

Connects to $LOCKEXT_URL (default postgresql://postgres@127.0.0.1:5499/postgres) and
exits 0 only if every scenario behaved as it must:

- work:  hold a 1 s lease for ~2.5 s of work; the background renewer keeps it, and every
         write goes through lockext.fence in the writing transaction.
- lost:  an operator releases the lease in the middle of the work; the next renewal fails,
         and the work stops at its next check.
- pause: holder A is frozen (SIGSTOP, like a long GC pause) past its lease; B takes the lock
         with a higher token and writes; A is resumed and writes as if nothing happened:
         the write is refused (SQLSTATE 55L01) and B's data stays.

Works behind PgBouncer in transaction pooling mode: lockext keeps no session state, and
prepare_threshold=None keeps psycopg from preparing named statements (PgBouncer < 1.21
cannot route them).
"""

import contextlib
import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import psycopg

URL = os.environ.get("LOCKEXT_URL", "postgresql://postgres@127.0.0.1:5499/postgres")
TABLE = "example_ledger_python"
STALE = "55L01"  # lockext: stale fence token


class LeaseLost(Exception):
    """The lease ended (renewal refused or impossible): stop working."""


class StaleToken(Exception):
    """lockext.fence refused our token (55L01): a newer holder has written."""


def connect():
    return psycopg.connect(URL, autocommit=True, prepare_threshold=None)


def secs(s):
    return datetime.timedelta(seconds=s)


class Lease:
    def __init__(self, lock_id, owner, token, ttl):
        self.lock_id, self.owner, self.token, self.ttl = lock_id, owner, token, ttl
        self.lost = threading.Event()
        self.reason = None
        self.renewals = 0
        self.released = None  # lock_release's answer, set when with_lock ends

    def check(self):
        """Call before each step of work: raises LeaseLost once the renewer gave up."""
        if self.lost.is_set():
            raise LeaseLost(f"lease on {self.lock_id} lost: {self.reason}")


def _renewer(lease, stop, every):
    """Renews the lease every `every` seconds on its own connection until `stop` is set.
    A refused renewal ends the lease at once; failing calls are retried until the lease
    would have expired anyway (by our own clock, counted from the last successful call)."""
    conn = None
    valid_until = time.monotonic() + lease.ttl
    while not stop.wait(every):
        sent = time.monotonic()
        try:
            if conn is None or conn.closed:
                conn = connect()
            expiry = conn.execute(
                "SELECT lockext.lock_renew(%s, %s, %s, %s)",
                (lease.lock_id, lease.owner, secs(lease.ttl), lease.token),
            ).fetchone()[0]
        except psycopg.Error as e:
            if time.monotonic() >= valid_until:
                lease.reason = f"could not renew before expiry: {e}"
                lease.lost.set()
                break
            with contextlib.suppress(Exception):
                conn.close()
            conn = None
            continue
        if expiry is None:
            lease.reason = "renewal refused (expired, released or taken over)"
            lease.lost.set()
            break
        lease.renewals += 1
        valid_until = sent + lease.ttl
    if conn is not None:
        conn.close()


@contextlib.contextmanager
def with_lock(lock_id, owner, ttl=10.0, wait=30.0, renew_fraction=1 / 3):
    """Acquires `lock_id` for `owner` (unique per holder), renews it in the background
    every ttl*renew_fraction, yields the Lease, and releases it at the end. Raises
    TimeoutError when the lock stays taken for `wait` seconds."""
    with connect() as conn:
        token = conn.execute(
            "SELECT fence_token FROM lockext.lock_acquire(%s, %s, %s, wait => %s)",
            (lock_id, owner, secs(ttl), secs(wait)),
        ).fetchone()[0]
        if token is None:
            raise TimeoutError(f"lock {lock_id} still taken after {wait} s")
        lease = Lease(lock_id, owner, token, ttl)
        stop = threading.Event()
        renewer = threading.Thread(target=_renewer, args=(lease, stop, ttl * renew_fraction), daemon=True)
        renewer.start()
        try:
            yield lease
        finally:
            stop.set()
            renewer.join()
            with contextlib.suppress(psycopg.Error):
                lease.released = conn.execute(
                    "SELECT lockext.lock_release(%s, %s, %s)", (lock_id, owner, token)
                ).fetchone()[0]


def fenced_write(conn, lease, resource, sql, params):
    """Runs `sql` in one transaction that starts with lockext.fence(resource, token): if a
    newer token was fenced on `resource`, the transaction aborts and nothing is written."""
    try:
        with conn.transaction():
            conn.execute("SELECT lockext.fence(%s, %s)", (resource, lease.token))
            conn.execute(sql, params)
    except psycopg.Error as e:
        if e.sqlstate == STALE:
            raise StaleToken(e.diag.message_primary) from e
        raise


def write_account(conn, lease, account, writer, delta=1):
    fenced_write(
        conn,
        lease,
        f"account:{account}",
        f"UPDATE {TABLE} SET balance = balance + %s, last_writer = %s, last_token = %s WHERE id = %s",
        (delta, writer, lease.token, account),
    )


def setup(conn, account):
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {TABLE} "
        "(id text PRIMARY KEY, balance bigint NOT NULL, last_writer text, last_token bigint)"
    )
    conn.execute(f"INSERT INTO {TABLE} (id, balance) VALUES (%s, 0)", (account,))


def account_row(conn, account):
    return conn.execute(f"SELECT balance, last_writer, last_token FROM {TABLE} WHERE id = %s", (account,)).fetchone()


def new_owner(role):
    return f"{socket.gethostname()}:{os.getpid()}:{role}:{uuid.uuid4().hex[:8]}"


def run_id():
    return f"{os.getpid()}-{uuid.uuid4().hex[:6]}"


# ---------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------


def scenario_work():
    rid = run_id()
    account, lock = f"work-{rid}", f"example:python:work:{rid}"
    with connect() as conn:
        setup(conn, account)
        with with_lock(lock, new_owner("worker"), ttl=1.0) as lease:
            for _ in range(10):  # 10 steps of 250 ms: 2.5 leases long
                lease.check()
                write_account(conn, lease, account, "worker")
                time.sleep(0.25)
        balance, _, token = account_row(conn, account)
    ok = balance == 10 and token == lease.token and lease.renewals >= 3 and lease.released
    print(f"work:  10 fenced writes committed={balance}, renewals={lease.renewals}, released={lease.released}")
    return ok


def scenario_lost():
    rid = run_id()
    account, lock = f"lost-{rid}", f"example:python:lost:{rid}"
    steps, stopped = 0, None
    with connect() as conn, connect() as operator:
        setup(conn, account)
        try:
            with with_lock(lock, new_owner("worker"), ttl=1.0) as lease:
                for i in range(40):  # would take 4 s
                    lease.check()
                    write_account(conn, lease, account, "worker")
                    steps += 1
                    if i == 2:  # an operator clears the lock (lockext_admin may do it for any holder)
                        operator.execute("SELECT lockext.lock_release(%s, %s, %s)", (lock, lease.owner, lease.token))
                    time.sleep(0.1)
        except LeaseLost as e:
            stopped = e
        balance = account_row(conn, account)[0]
    print(f"lost:  work stopped after {steps} of 40 steps ({stopped}); release returned {lease.released}")
    return stopped is not None and steps < 15 and balance == steps and lease.released is False


def pause_a(lock, account):
    """Holder A: writes once, says `ready`, blocks on stdin (it is frozen there), then writes
    again without checking the lease, like code that checked it just before the pause."""
    with connect() as conn:
        try:
            with with_lock(lock, new_owner("A"), ttl=1.0) as lease:
                lease.check()
                write_account(conn, lease, account, "A")
                print(f"ready {lease.token}", flush=True)
                sys.stdin.readline()  # `go` was written while we were stopped
                write_account(conn, lease, account, "A")
                print("stale write ACCEPTED", flush=True)
                return 1
        except StaleToken as e:
            print(f"stale write refused: {e}", flush=True)
            return 0 if lease.released is False else 1


def pause_b(lock, account):
    """Holder B: waits for the lock, writes, releases; prints its token."""
    with connect() as conn:
        with with_lock(lock, new_owner("B"), ttl=5.0, wait=10.0) as lease:
            write_account(conn, lease, account, "B", delta=100)
        print(f"wrote {lease.token}", flush=True)
    return 0


def scenario_pause():
    rid = run_id()
    account, lock = f"pause-{rid}", f"example:python:pause:{rid}"
    with connect() as conn:
        setup(conn, account)
    me = [sys.executable, os.path.abspath(__file__)]
    a = subprocess.Popen(me + ["pause-a", lock, account], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        a_token = int(a.stdout.readline().split()[1])
        os.kill(a.pid, signal.SIGSTOP)  # A, renewer included, is frozen past its 1 s lease
        a.stdin.write("go\n")
        a.stdin.flush()
        b = subprocess.run(me + ["pause-b", lock, account], capture_output=True, text=True, timeout=30)
        b_token = int(b.stdout.split()[1]) if b.returncode == 0 else None
        os.kill(a.pid, signal.SIGCONT)
        a_said = a.stdout.readline().strip()
        a_rc = a.wait(timeout=30)
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
    with connect() as conn:
        balance, writer, token = account_row(conn, account)
    print(f"pause: A token {a_token}; B token {b_token}; A after resuming: {a_said}")
    print(f"       account: balance={balance} last_writer={writer} last_token={token}")
    return a_rc == 0 and b.returncode == 0 and b_token > a_token and (balance, writer, token) == (101, "B", b_token)


SCENARIOS = {"work": scenario_work, "lost": scenario_lost, "pause": scenario_pause}


def main(argv):
    mode = argv[1] if len(argv) > 1 else "all"
    if mode == "pause-a":
        return pause_a(argv[2], argv[3])
    if mode == "pause-b":
        return pause_b(argv[2], argv[3])
    names = list(SCENARIOS) if mode == "all" else [mode]
    failed = [n for n in names if not SCENARIOS[n]()]
    print(f"python: {len(names) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
