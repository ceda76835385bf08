#!/usr/bin/env python3
"""The import graph of src/, and ARCHITECTURE.md's account of it (`make lint` runs this).

Fails (exit status 1, each finding on stderr) when:
- two modules of src/ import each other, directly or around a circle;
- ARCHITECTURE.md's table "Which module may use which" lists a module that does not exist,
  leaves one out, or gives a module other imports than its code has;
- ARCHITECTURE.md's module map leaves out a file of src/ (or a SQL file of sql/ outside
  sql/run/), or names one that does not exist.

A module is a file `src/<name>.rs` or a folder `src/<name>/` (its files, `mod.rs` and
below, are that one module: what they use of each other is the folder's own business).
Its imports are the `crate::<module>` paths its files name, `use crate::{a, b::c}` groups
included. `lib.rs` (the module list) and `tests.rs` (unit tests, which may use anything)
are not modules of the graph.

    python3 scripts/check_imports.py            check
    python3 scripts/check_imports.py --table    print the table ARCHITECTURE.md must hold
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
SQL = ROOT / "sql"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
NOT_MODULES = ("lib", "tests")
TABLE_HEADING = "## Which module may use which"
MAP_HEADING = "## Module map"


def module_files():
    """Module name -> the files that make it up."""
    modules = {}
    for path in sorted(SRC.iterdir()):
        if path.is_file() and path.suffix == ".rs" and path.stem not in NOT_MODULES:
            modules.setdefault(path.stem, []).append(path)
        elif path.is_dir():
            files = sorted(path.rglob("*.rs"))
            if files:
                modules.setdefault(path.name, []).extend(files)
    return modules


def crate_paths(text):
    """The first segment of every `crate::` path in `text`, groups expanded."""
    found = set()
    for match in re.finditer(r"crate::", text):
        rest = text[match.end():].lstrip()
        if rest.startswith("{"):
            # `crate::{a::X, b, c::{d, e}}`: the top-level names of the group.
            depth, name, names = 0, "", []
            for ch in rest[1:]:
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    if depth == 0:
                        break
                    depth -= 1
                elif ch == "," and depth == 0:
                    names.append(name)
                    name = ""
                    continue
                if depth == 0:
                    name += ch
            names.append(name)
            for entry in names:
                head = re.match(r"\s*([a-z_][a-z0-9_]*)", entry)
                if head:
                    found.add(head.group(1))
        else:
            head = re.match(r"([a-z_][a-z0-9_]*)", rest)
            if head:
                found.add(head.group(1))
    return found


def imports():
    modules = module_files()
    graph = {}
    for module, files in modules.items():
        used = set()
        for path in files:
            used |= crate_paths(path.read_text())
        # Only modules count: `crate::` items of lib.rs (if any) are not a module's.
        graph[module] = sorted(u for u in used if u in modules and u != module)
    return graph


def find_circle(graph):
    state = {}  # module -> "open" while on the path, "done" after

    def visit(module, path):
        state[module] = "open"
        for used in graph.get(module, []):
            if state.get(used) == "open":
                return path[path.index(used):] + [used]
            if used not in state:
                found = visit(used, path + [used])
                if found:
                    return found
        state[module] = "done"
        return None

    for module in graph:
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return None


def top_down(graph):
    """Modules from the top down: by height (the longest chain of uses below a module, 0
    for one that uses nothing), highest first, then by name. A module always comes before
    every module it uses, and the order only changes when the graph does."""
    heights = {}

    def height(module, path=()):
        if module not in heights:
            if module in path:  # a circle: find_circle reports it
                return 0
            deps = graph.get(module, [])
            heights[module] = 1 + max((height(d, path + (module,)) for d in deps), default=-1)
        return heights[module]

    return sorted(graph, key=lambda m: (-height(m), m))


def table(graph):
    order = top_down(graph)
    rank = {m: i for i, m in enumerate(order)}
    width = max(len(m) for m in order)
    rows = []
    for m in order:
        deps = sorted(graph[m], key=rank.get)
        rows.append(f"{m:<{width}} -> " + (" ".join(deps) if deps else "(nothing)"))
    return "\n".join(rows)


def section(text, heading):
    """The text of the section under `heading`, up to the next heading of its level."""
    start = text.find("\n" + heading + "\n")
    if start < 0:
        return None
    body = text[start + len(heading) + 2:]
    end = re.search(r"^## ", body, re.M)
    return body[: end.start()] if end else body


def first_code_block(body):
    match = re.search(r"^```[^\n]*\n(.*?)^```", body, re.M | re.S)
    return match.group(1) if match else None


def documented_table(text):
    """ARCHITECTURE.md's rows, `a, b -> x y` or `a -> (nothing)`, as module -> set."""
    body = section(text, TABLE_HEADING)
    block = first_code_block(body) if body is not None else None
    if block is None:
        return None, [f"ARCHITECTURE.md has no code block under '{TABLE_HEADING}'"]
    rows, problems = {}, []
    for number, line in enumerate(block.splitlines(), 1):
        if not line.strip():
            continue
        if "->" not in line:
            problems.append(f"ARCHITECTURE.md module table, line {number}: no '->': {line!r}")
            continue
        left, right = line.split("->", 1)
        deps = set() if right.strip() == "(nothing)" else set(right.split())
        for module in (m.strip() for m in left.split(",")):
            if module in rows:
                problems.append(f"ARCHITECTURE.md module table: {module} has two rows")
            rows[module] = deps
    return rows, problems


def check_table(graph, text):
    rows, problems = documented_table(text)
    if rows is None:
        return problems
    for module in sorted(set(rows) - set(graph)):
        problems.append(f"ARCHITECTURE.md module table lists {module}, which is no module of src/")
    for module in sorted(set(graph) - set(rows)):
        problems.append(f"ARCHITECTURE.md module table leaves out {module} (src/{module}), which uses: "
                        + (" ".join(graph[module]) or "(nothing)"))
    for module in sorted(set(rows) & set(graph)):
        said, real = rows[module], set(graph[module])
        if said != real:
            detail = []
            if real - said:
                detail.append("it also uses " + " ".join(sorted(real - said)))
            if said - real:
                detail.append("it does not use " + " ".join(sorted(said - real)))
            problems.append(f"ARCHITECTURE.md module table, {module}: " + "; ".join(detail))
    return problems


def check_map(text):
    """Every file of src/ and every sql/*.sql is covered by an entry of the module map, and
    every entry names something that exists. An entry is the first word of a line of the
    map's code block that starts with a path (`src/x.rs`, `sql/`, `sql/lockext--*.sql`)."""
    body = section(text, MAP_HEADING)
    block = first_code_block(body) if body is not None else None
    if block is None:
        return [f"ARCHITECTURE.md has no code block under '{MAP_HEADING}'"]
    problems, entries = [], []
    for line in block.splitlines():
        if not line or line[0].isspace():
            continue
        entry = line.split()[0]
        if entry.startswith(("src/", "sql/")):
            entries.append(entry)
            if not list(ROOT.glob(entry.rstrip("/"))):
                problems.append(f"ARCHITECTURE.md module map names {entry}, which does not exist")

    def covered(rel):
        for entry in entries:
            if entry.endswith("/") and rel.startswith(entry):
                return True
            if pathlib.PurePosixPath(rel).match(entry) and rel.count("/") == entry.count("/"):
                return True
        return False

    wanted = [p for p in SRC.rglob("*.rs")] + [p for p in SQL.glob("*.sql")]
    for path in sorted(wanted):
        rel = path.relative_to(ROOT).as_posix()
        if not covered(rel):
            problems.append(f"ARCHITECTURE.md module map leaves out {rel}")
    return problems


def main(argv):
    graph = imports()
    if "--table" in argv:
        print(table(graph))
        return 0
    problems = []
    circle = find_circle(graph)
    if circle:
        problems.append("import circle: " + " -> ".join(circle))
    text = ARCHITECTURE.read_text()
    problems += check_table(graph, text)
    problems += check_map(text)
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        print("the table from the code: python3 scripts/check_imports.py --table", file=sys.stderr)
        return 1
    print(f"no import circles among {len(graph)} modules; ARCHITECTURE.md's module map and table match them")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
