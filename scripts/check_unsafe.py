#!/usr/bin/env python3
"""Fails when a file of src/ that is not listed below contains `unsafe`.

Raw PostgreSQL (its globals, its C functions, its shared memory) is read in a few modules,
each named for what it wraps, behind safe functions that say why they are sound; the rest
of src/ asks them and never writes `unsafe` (`make lint` runs this). A file is listed here
with the reason it needs `unsafe`; adding one is a decision for review. `parallel_unsafe`
(a pg_extern option) is not `unsafe`. A listed file that no longer needs
it must leave the list. Exit status 1 and every `unsafe` found outside the list, or 0.
"""
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"

ALLOWED = {
    # Wrappers: what PostgreSQL offers, made safe once.
    "backend.rs": "this backend's and server's globals, the clock, latches, exit and drop hooks",
    "catalog.rs": "catalog lookups by name (schema, roles, privileges, names), pg_database",
    "locktable.rs": "the heavyweight lock table (LockAcquire, LockRelease)",
    "pgversion.rs": "what differs between major versions, raw by nature",
    "text.rs": "text and jsonb datums: pgrx's datum traits are unsafe to implement",
    "statements.rs": "SPI: plans kept per backend, runs under a chosen snapshot",
    "xact.rs": "transactions and subtransactions begun and ended by hand",
    "worker.rs": "background workers: start, stop, signals, settings, pgstat, entry points",
    "guc.rs": "settings with hooks (pgrx's define_*_with_hooks), the reserved prefix",
    "shmem.rs": "lockext's shared memory: tables under LWLocks (hooks, ShmemInitStruct), named atomics",
    # Owners of shared memory, hooks and entry points: unsafe inside, safe outside.
    "stats.rs": "the counters in shared memory (PgAtomic::new, PGRXSharedMemory)",
    "ledger.rs": "the token ledger: shared memory, custom WAL resource manager, redo",
    "fence.rs": "the fence_guard trigger's C entry points (fcinfo, trigger data)",
    # The commit machinery a grant's commit policy drives.
    "commit.rs": "commit policy: XactLastRecEnd, synchronous_commit, XLogFlush",
    "grant.rs": "a heap tuple built from datums (the lock_grant a caller gets)",
}

UNSAFE = re.compile(r"\bunsafe\b")


def offenders():
    found = []
    for path in sorted(SRC.rglob("*.rs")):
        name = path.relative_to(SRC).as_posix()
        if name in ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if UNSAFE.search(line):
                found.append(f"src/{name}:{number}: {line.strip()}")
    return found


if __name__ == "__main__":
    stale = sorted(name for name in ALLOWED if not (SRC / name).exists())
    if stale:
        print("listed but gone (remove from scripts/check_unsafe.py): " + ", ".join(stale),
              file=sys.stderr)
        sys.exit(1)
    unneeded = sorted(name for name in ALLOWED if not UNSAFE.search((SRC / name).read_text()))
    if unneeded:
        print("listed but free of unsafe (remove from scripts/check_unsafe.py): "
              + ", ".join(unneeded), file=sys.stderr)
        sys.exit(1)
    found = offenders()
    if found:
        print("`unsafe` outside the modules that wrap PostgreSQL (scripts/check_unsafe.py"
              " lists them):", file=sys.stderr)
        print("\n".join(found), file=sys.stderr)
        sys.exit(1)
    print(f"`unsafe` only in the {len(ALLOWED)} files listed")
