#!/usr/bin/env python3
"""lockext from Python (psycopg 3), with the lockext client library: three scenarios.

    pip install ./clients/python
    python3 lockext_example.py [all|work|lost|pause]      (default: all)

Connects to $LOCKEXT_URL (default postgresql://postgres@127.0.0.1:5499/postgres) and
exits 0 only if every scenario behaved as it must:

- work:  hold a 1 s lease for ~2.5 s of work; the library renews it in the background, and
         every write goes through lockext.fence in the writing transaction.
- lost:  an operator releases the lease in the middle of the work; the next renewal fails,
         and the work stops at its next check.
- pause: holder A is frozen (SIGSTOP, like a long GC pause) past its lease; B takes the lock
         with a higher token and writes; A is resumed and writes as if nothing happened:
         the write is refused (SQLSTATE 55L01) and B's data stays.

Works behind PgBouncer in transaction pooling mode: lockext keeps no session state, the
library's own connection never prepares statements by name, and neither does this
program's (prepare_threshold=None: PgBouncer < 1.21 cannot route them).
"""

import glob
import os
import signal
import subprocess
import sys
import time
import uuid

import psycopg

try:
    import lockext
except ImportError:  # run from a checkout without `pip install ./clients/python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../clients/python/src"))
    import lockext

URL = os.environ.get("LOCKEXT_URL", "postgresql://postgres@127.0.0.1:5499/postgres")
TABLE = "example_ledger_python"


def connect():
    return psycopg.connect(URL, autocommit=True, prepare_threshold=None)


def write_account(conn, grant, account, writer, delta=1):
    """One transaction that starts with lockext.fence(account, token): if a newer token was
    fenced there, it aborts (lockext.StaleToken) and nothing is written."""
    with grant.transaction(conn, fence=f"account:{account}"):
        update(conn, grant.token, account, writer, delta)


def update(conn, token, account, writer, delta):
    conn.execute(
        f"UPDATE {TABLE} SET balance = balance + %s, last_writer = %s, last_token = %s WHERE id = %s",
        (delta, writer, token, account),
    )


def setup(conn, account):
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {TABLE} "
        "(id text PRIMARY KEY, balance bigint NOT NULL, last_writer text, last_token bigint)"
    )
    conn.execute(f"INSERT INTO {TABLE} (id, balance) VALUES (%s, 0)", (account,))


def account_row(conn, account):
    return conn.execute(f"SELECT balance, last_writer, last_token FROM {TABLE} WHERE id = %s", (account,)).fetchone()


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
        # The owner defaults to hostname:pid:random; the ttl is seconds (or a timedelta).
        with lockext.lock(URL, lock, ttl=1.0) as grant:
            for _ in range(10):  # 10 steps of 250 ms: 2.5 leases long
                grant.check()
                write_account(conn, grant, account, "worker")
                time.sleep(0.25)
        balance, _, token = account_row(conn, account)
    ok = balance == 10 and token == grant.token and grant.renewals >= 3 and grant.released
    print(f"work:  10 fenced writes committed={balance}, renewals={grant.renewals}, released={grant.released}")
    return ok


def scenario_lost():
    rid = run_id()
    account, lock = f"lost-{rid}", f"example:python:lost:{rid}"
    steps, stopped = 0, None
    with connect() as conn, connect() as operator:
        setup(conn, account)
        try:
            with lockext.lock(URL, lock, ttl=1.0) as grant:
                for i in range(40):  # would take 4 s
                    grant.check()
                    write_account(conn, grant, account, "worker")
                    steps += 1
                    if i == 2:  # an operator clears the lock (lockext_admin may do it for any holder)
                        operator.execute("SELECT lockext.lock_release(%s, %s, %s)", (lock, grant.owner, grant.token))
                    time.sleep(0.1)
        except lockext.LeaseLost as e:
            stopped = e
        balance = account_row(conn, account)[0]
    print(f"lost:  work stopped after {steps} of 40 steps ({stopped}); release returned {grant.released}")
    return stopped is not None and steps < 15 and balance == steps and grant.released is False


def pause_a(lock, account):
    """Holder A: writes once, says `ready`, blocks on stdin (it is frozen there), then writes
    again without checking the lease, like code that checked it just before the pause (the
    library's grant.transaction would check, and refuse: its clock saw the TTL pass)."""
    with connect() as conn:
        try:
            with lockext.lock(URL, lock, ttl=1.0) as grant:
                write_account(conn, grant, account, "A")
                print(f"ready {grant.token}", flush=True)
                sys.stdin.readline()  # `go` was written while we were stopped
                with conn.transaction():  # only the fence stands between this write and B's data
                    lockext.fence(conn, f"account:{account}", grant.token)
                    update(conn, grant.token, account, "A", 1)
                print("stale write ACCEPTED", flush=True)
                return 1
        except lockext.StaleToken as e:
            print(f"stale write refused: {e}", flush=True)
            return 0 if grant.released is False else 1


def pause_b(lock, account):
    """Holder B: waits for the lock, writes, releases; prints its token."""
    with connect() as conn:
        with lockext.lock(URL, lock, ttl=5.0, wait=10.0) as grant:
            write_account(conn, grant, account, "B", delta=100)
        print(f"wrote {grant.token}", flush=True)
    return 0


def wait_stopped(pid, timeout=10.0):
    """Returns once every thread of process pid is stopped (state T in /proc/PID/task/*/stat).

    os.kill(pid, SIGSTOP) is not enough: it returns once the signal is queued, and the one
    thread woken to take it stops the others only when it gets to run; until then the rest
    of a multi-threaded process (A has the library's renewer thread) goes on, and the
    thread blocked on its stdin, if it is not the one woken, could read and act on what we
    write there."""
    deadline = time.monotonic() + timeout
    while True:
        live = []
        for stat in glob.glob(f"/proc/{pid}/task/*/stat"):
            try:
                with open(stat) as f:  # "tid (comm) S ...": the state follows the last ')'
                    state = f.read().rpartition(")")[2].split()[0]
            except (OSError, IndexError):
                continue  # a thread that just exited
            if state not in ("Z", "X"):  # a dead thread will not run again
                live.append(state)
        if not live:
            raise RuntimeError(f"no live thread of process {pid} in /proc/{pid}/task: it exited (or this is not Linux)")
        if all(state == "T" for state in live):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} not stopped {timeout} s after SIGSTOP")
        time.sleep(0.005)


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
        wait_stopped(a.pid)
        a.stdin.write("go\n")  # A reads it only once resumed
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
