"""Running outside programs and saying what happens: BenchError, log, run.

Every module reports failure the same way (BenchError, which the entry point prints as one
line and exit status 1) and logs to stderr with the time, so that a run's progress and its
first failure read alike whichever part of the bench they come from.
"""
import subprocess
import sys
import time


class BenchError(Exception):
    pass


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, env=None, check=True, timeout=900, **kw):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p
