#!/usr/bin/env python3
"""Fails when a statement lockext runs is not one of named parameters and named columns.

Every statement is a `statements::Statement`: its parameters given by name (`Args`), its
columns read by name (`first_named`, `get_by_name`, `LatestRow::get`). This checks what the
compiler does not (`make lint` runs it):
  - src/ has no list of parameter types by position (`&[PgBuiltInOids]`, `params: &[TEXTOID`)
    and reads no column by position (`get_one`, `get_two`, `get_three`, `first_value`,
    `get::<T>(N)`, `get_datum_by_ordinal(N)`); src/tests.rs, whose ad-hoc queries are
    not lockext's statements, excepted;
  - every file of sql/run/ names, in its `--` header, each `$N` its SQL uses as `$N name`
    (what `Statement::check_header` then compares with the Rust static's `params` when the
    statement is first prepared).
Exit status 1 and every finding, or 0.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BY_POSITION = re.compile(
    r"\b(get_one|get_two|get_three|first_value)\b"
    r"|\.get::<[^>]*>\(\s*\d"
    r"|get_datum_by_ordinal\(\s*\d"
)
POSITIONAL = re.compile(
    r"&(?:'static )?\[(?:pg_sys::)?PgBuiltInOids\]"
    r"|params:\s*&\[\s*[A-Z0-9_]*OID\b"
)
NAMED = re.compile(r"\$(\d+) ([A-Za-z_][A-Za-z0-9_]*)")
USED = re.compile(r"\$(\d+)")


def main() -> int:
    found = []
    for path in sorted((ROOT / "src").rglob("*.rs")):
        if path.name == "tests.rs":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("//"):
                continue
            rel = path.relative_to(ROOT)
            if BY_POSITION.search(line):
                found.append(f"{rel}:{number}: a column read by position: {line.strip()}")
            if POSITIONAL.search(line):
                found.append(f"{rel}:{number}: parameters by position: {line.strip()}")
    for path in sorted((ROOT / "sql" / "run").rglob("*.sql")):
        lines = path.read_text().splitlines()
        header = []
        for line in lines:
            if not line.startswith("--"):
                break
            header.append(line)
        body = "\n".join(lines[len(header):])
        named = {int(n) for n, _ in NAMED.findall("\n".join(header))}
        for n in sorted({int(n) for n in USED.findall(body)} - named):
            rel = path.relative_to(ROOT)
            found.append(f"{rel}: the header does not name ${n} (`-- ${n} name`)")
    for finding in found:
        print(finding, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
