"""`python3 -m lockbench` (from bench/) and bench/bench.py: runs cli.main, and prints a
BenchError as one line and exit status 1 instead of a traceback."""
import sys

from .cli import main
from .shell import BenchError, log


def entry():
    try:
        main()
    except BenchError as e:
        log("FAILED: " + str(e))
        sys.exit(1)


if __name__ == "__main__":
    entry()
