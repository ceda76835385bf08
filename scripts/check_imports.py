#!/usr/bin/env python3
"""Fails when two modules of src/ import each other, directly or around a circle.

ARCHITECTURE.md lists which module may use which, from the top down; this keeps that list
true (`make lint` runs it). A module's imports are the `crate::<module>` paths its file
names. Exit status 1 and the circle found, or 0.
"""
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"


def imports():
    graph = {}
    for path in sorted(SRC.glob("*.rs")):
        module = path.stem
        if module in ("lib", "tests"):
            continue  # the module list, and the unit tests, which may use anything
        used = set(re.findall(r"crate::([a-z_]+)", path.read_text()))
        graph[module] = sorted(used - {module})
    # A folder (src/<name>/mod.rs and the files beside it) is one module, `crate::<name>`:
    # what its files import together.
    for folder in sorted(p for p in SRC.iterdir() if (p / "mod.rs").is_file()):
        used = set()
        for path in sorted(folder.glob("*.rs")):
            used |= set(re.findall(r"crate::([a-z_]+)", path.read_text()))
        graph[folder.name] = sorted(used - {folder.name})
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


if __name__ == "__main__":
    circle = find_circle(imports())
    if circle:
        print("import circle: " + " -> ".join(circle), file=sys.stderr)
        sys.exit(1)
    print(f"no import circles among {len(imports())} modules")
