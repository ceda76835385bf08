#!/usr/bin/env python3
"""Kept so that `python3 bench/bench.py ...` (bench/run.sh, make bench) still works: the
benchmarks are the package bench/lockbench."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lockbench.__main__ import entry  # noqa: E402

entry()
