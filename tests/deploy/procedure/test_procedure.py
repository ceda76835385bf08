#!/usr/bin/env python3
"""Tests of examples/plpgsql/process_batches.sql, the stored procedure that acquires (and
commits), works in several transactions that each start with lockext.fence, renews, and
releases.

    LOCKEXT_URL=postgresql://postgres@127.0.0.1:5499/postgres python3 tests/deploy/procedure/test_procedure.py

Cases:
- all batches: 5 batches, each its own committed transaction, with the lease's token;
  renewed along the way; released at the end.
- taken over mid-way: the procedure stalls past its lease after batch 2; B takes the lock
  with a higher token and writes through the fence; the procedure's next transaction
  (batch 3) aborts with 55L01 in lockext.fence: batches 1-2 stay, batch 3 and later never
  happen, B's state stays.
- expired mid-way: the same stall with nobody taking over: batch 3's renewal returns NULL,
  the procedure raises and batch 3 rolls back.
- lock taken: a second CALL while the first holds the lock is refused at once (55P03).

Prints one line per case and `N passed, N failed`; exits 1 on any failure.
"""

import os
import pathlib
import sys
import threading
import time
import uuid

import psycopg

URL = os.environ.get("LOCKEXT_URL", "postgresql://postgres@127.0.0.1:5499/postgres")
ROOT = pathlib.Path(__file__).resolve().parents[3]
PROCEDURE = ROOT / "examples" / "plpgsql" / "process_batches.sql"


def connect():
    return psycopg.connect(URL, autocommit=True, prepare_threshold=None)


def run_id():
    return uuid.uuid4().hex[:8]


def call(conn, *args, **named):
    """CALL process_batches; returns None or the error (with its sqlstate)."""
    params = ", ".join(["%s"] * len(args) + [f"{k} => %s" for k in named])
    try:
        conn.execute(f"CALL public.process_batches({params})", (*args, *named.values()))
        return None
    except psycopg.Error as e:
        return e


def log_of(conn, resource):
    return conn.execute(
        "SELECT batch, owner, fence_token FROM public.batch_log WHERE resource_id = %s ORDER BY fence_token, batch",
        (resource,),
    ).fetchall()


def state_of(conn, resource):
    return conn.execute(
        "SELECT batches, owner, fence_token FROM public.batch_state WHERE resource_id = %s", (resource,)
    ).fetchone()


def mark_of(conn, resource):
    return conn.execute("SELECT fence_token FROM lockext.resources WHERE resource_id = %s", (resource,)).fetchone()[0]


def lease_of(conn, lock):
    return conn.execute("SELECT owner, fence_token, renewals FROM lockext.locks WHERE lock_id = %s", (lock,)).fetchone()


def case_all_batches(conn):
    rid = run_id()
    lock, res, owner = f"proc:{rid}", f"ledger:{rid}", f"A:{rid}"
    err = call(conn, lock, owner, res, 5, "2 seconds")
    log = log_of(conn, res)
    tokens = {t for _, _, t in log}
    ok = (
        err is None
        and [b for b, _, _ in log] == [1, 2, 3, 4, 5]
        and len(tokens) == 1
        and state_of(conn, res) == (5, owner, log[0][2])
        and mark_of(conn, res) == log[0][2]
        and lease_of(conn, lock) is None  # released
    )
    return ok, f"5 batches committed with token {min(tokens) if tokens else None}, lease released (error: {err})"


def stalled_call(lock, owner, res, out):
    """The procedure with a 1 s lease, stalling 3 s after batch 2."""
    with connect() as conn:
        out["error"] = call(conn, lock, owner, res, 5, "1 second", p_pause_after=2, p_pause="3 seconds")


def wait_for_batches(conn, res, n, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if len(log_of(conn, res)) >= n:
            return True
        time.sleep(0.02)
    return False


def case_taken_over(conn):
    rid = run_id()
    lock, res = f"proc:{rid}", f"ledger:{rid}"
    out = {}
    a = threading.Thread(target=stalled_call, args=(lock, f"A:{rid}", res, out))
    a.start()
    assert wait_for_batches(conn, res, 2), "the procedure never committed batch 2"
    a_token = log_of(conn, res)[0][2]
    # B waits for A's lease to run out (A stalls without renewing), then writes through the fence.
    b_token = conn.execute(
        "SELECT fence_token FROM lockext.lock_acquire(%s, %s, '30 seconds', wait => '10 seconds')", (lock, f"B:{rid}")
    ).fetchone()[0]
    with conn.transaction():
        conn.execute("SELECT lockext.fence(%s, %s)", (res, b_token))
        conn.execute(
            "UPDATE public.batch_state SET batches = 100, owner = %s, fence_token = %s WHERE resource_id = %s",
            (f"B:{rid}", b_token, res),
        )
    a.join(timeout=30)
    err = out.get("error")
    log = log_of(conn, res)
    state = state_of(conn, res)
    b_released = conn.execute("SELECT lockext.lock_release(%s, %s, %s)", (lock, f"B:{rid}", b_token)).fetchone()[0]
    ok = (
        not a.is_alive()
        and err is not None
        and err.sqlstate == "55L01"
        and [(b, t) for b, _, t in log] == [(1, a_token), (2, a_token)]
        and b_token is not None
        and b_token > a_token
        and state == (100, f"B:{rid}", b_token)
        and mark_of(conn, res) == b_token
        and b_released
    )
    msg = err.diag.message_primary if err is not None else "no error"
    return ok, (
        f"A (token {a_token}) committed batches {[b for b, _, _ in log]}; B took over with {b_token}; "
        f"A's batch 3 aborted with {getattr(err, 'sqlstate', None)}: {msg}; state {state[:2] if state else None}"
    )


def case_expired(conn):
    rid = run_id()
    lock, res = f"proc:{rid}", f"ledger:{rid}"
    out = {}
    a = threading.Thread(target=stalled_call, args=(lock, f"A:{rid}", res, out))
    a.start()
    a.join(timeout=30)
    err = out.get("error")
    log = log_of(conn, res)
    ok = (
        not a.is_alive()
        and err is not None
        and err.sqlstate == "55000"
        and [b for b, _, _ in log] == [1, 2]
        and state_of(conn, res)[0] == 2
    )
    msg = err.diag.message_primary if err is not None else "no error"
    return ok, f"batches {[b for b, _, _ in log]} committed; batch 3 stopped with {getattr(err, 'sqlstate', None)}: {msg}"


def case_lock_taken(conn):
    rid = run_id()
    lock, res = f"proc:{rid}", f"ledger:{rid}"
    holder = conn.execute("SELECT fence_token FROM lockext.lock_acquire(%s, 'someone else', '30 seconds')", (lock,)).fetchone()[0]
    with connect() as other:
        err = call(other, lock, f"A:{rid}", res, 3)
    conn.execute("SELECT lockext.lock_release(%s, 'someone else', %s)", (lock, holder))
    ok = err is not None and err.sqlstate == "55P03" and log_of(conn, res) == []
    return ok, f"refused with {getattr(err, 'sqlstate', None)}, nothing written"


def main():
    with connect() as conn:
        conn.execute(PROCEDURE.read_text())
        cases = [case_all_batches, case_taken_over, case_expired, case_lock_taken]
        failed = 0
        for case in cases:
            try:
                ok, detail = case(conn)
            except Exception as e:  # a broken case fails, the others still run
                ok, detail = False, f"{type(e).__name__}: {e}"
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {case.__name__[5:]}: {detail}", flush=True)
    print(f"procedure: {len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
