#!/usr/bin/env bash
# The lint checkers can fail: each is run on a copy of the repository with one thing made
# wrong, and must exit 1 naming it (`make lint` runs this after the checkers themselves).
#   - check_imports.py: a wrong row of ARCHITECTURE.md's table, a module of src/ it leaves
#     out (a new folder module), and a file left out of the module map;
#   - check_links.py: a link to a file that does not exist, and to a heading that does not;
#   - check_statements.py: a column read by position, and a header that leaves a `$N` out;
#   - check_unsafe.py: `unsafe` in a file it does not list (one that wraps nothing), and a
#     listed file with no `unsafe` left.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

# expect_failure NAME PATTERN COMMAND...: COMMAND exits 1 and says PATTERN.
expect_failure() {
    local name=$1 pattern=$2; shift 2
    local out rc=0
    out=$("$@" 2>&1) || rc=$?
    [ "$rc" = 1 ] || fail "$name: exit status $rc, not 1: $out"
    grep -qF -- "$pattern" <<<"$out" || fail "$name: did not say '$pattern': $out"
    echo "ok: $name"
}

# A copy of the files git knows of (and new ones it does not ignore), not a clone: no .git.
fresh() {
    rm -rf "$WORK/repo" && mkdir -p "$WORK/repo"
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$WORK/repo" 2>/dev/null || true)
}

fresh
python3 "$WORK/repo/scripts/check_imports.py" >/dev/null || fail "check_imports.py fails on the repository as it is"
row=$(grep -m1 -E '^error +-> ' "$WORK/repo/ARCHITECTURE.md") || fail "no row for error in ARCHITECTURE.md"
sed -i "s/^$row\$/$row ledger/" "$WORK/repo/ARCHITECTURE.md"
expect_failure "a wrong row" "error: it does not use ledger" python3 "$WORK/repo/scripts/check_imports.py"

fresh
mkdir "$WORK/repo/src/toy" && echo 'use crate::{error::LockError, text};' >"$WORK/repo/src/toy/mod.rs"
expect_failure "a module left out of the table" "leaves out toy (src/toy), which uses: error text" \
    python3 "$WORK/repo/scripts/check_imports.py"

fresh
sed -i '/^src\/caller\.rs /d' "$WORK/repo/ARCHITECTURE.md"
expect_failure "a file left out of the map" "module map leaves out src/caller.rs" python3 "$WORK/repo/scripts/check_imports.py"

fresh
python3 "$WORK/repo/scripts/check_links.py" "$WORK/repo/README.md" >/dev/null || fail "check_links.py fails on README.md as it is"
echo '[gone](docs/no-such-page.md)' >>"$WORK/repo/README.md"
expect_failure "a link to no file" "docs/no-such-page.md: no such file" python3 "$WORK/repo/scripts/check_links.py" "$WORK/repo/README.md"

fresh
echo '[gone](docs/sql-reference.md#no-such-heading)' >>"$WORK/repo/README.md"
expect_failure "a link to no heading" "no heading with anchor #no-such-heading" \
    python3 "$WORK/repo/scripts/check_links.py" "$WORK/repo/README.md"

fresh
python3 "$WORK/repo/scripts/check_statements.py" || fail "check_statements.py fails on the repository as it is"
sed -i 's/first_named::<bool>(cleared, "all_gone")/cleared.first().get_one::<bool>()/' "$WORK/repo/src/grant.rs"
expect_failure "a column read by position" "src/grant.rs" python3 "$WORK/repo/scripts/check_statements.py"

fresh
sed -i 's/^-- \$1 event, \$2 lock_id,/-- $1 event, lock_id,/' "$WORK/repo/sql/run/lease/notify.sql"
expect_failure "a header that leaves a parameter out" "notify.sql: the header does not name \$2" \
    python3 "$WORK/repo/scripts/check_statements.py"

fresh
python3 "$WORK/repo/scripts/check_unsafe.py" >/dev/null || fail "check_unsafe.py fails on the repository as it is"
echo 'pub fn raw() -> i32 { unsafe { pgrx::pg_sys::MyProcPid } }' >>"$WORK/repo/src/wait.rs"
expect_failure "unsafe outside the wrappers" "src/wait.rs:" python3 "$WORK/repo/scripts/check_unsafe.py"

fresh
sed -i 's/unsafe/UNSAFE/g' "$WORK/repo/src/guc.rs"
expect_failure "a listed file with no unsafe left" "listed but free of unsafe (remove from scripts/check_unsafe.py): guc.rs" \
    python3 "$WORK/repo/scripts/check_unsafe.py"
