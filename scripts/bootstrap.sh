#!/usr/bin/env bash
# Installs what building and testing lockext needs on a Debian 12 machine, as root.
# Idempotent: a second run checks and installs nothing.
set -euo pipefail

PG_MAJOR=15
PGRX_VERSION=0.18.1
PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
APT_PACKAGES=(postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR libclang-dev clang pkg-config sudo make
    faketime redis-server python3 binutils gdb)
APT_PACKAGES+=("${LOCKEXT_EXTRA_APT[@]:-}")
# The benchmarks' charts (bench/lockbench/charts.py) need matplotlib in the python3 on PATH.
# Debian's own python3 (sys.prefix /usr, or none yet) takes Debian's package: it has no pip,
# and PEP 668 refuses pip installs into it. Any other python3 (pyenv, a venv) gets it from
# PyPI with its own pip, below.
debian_python() {
    ! command -v python3 >/dev/null 2>&1 || [ "$(python3 -c 'import sys; print(sys.prefix)')" = /usr ]
}
if debian_python; then
    APT_PACKAGES+=(python3-matplotlib)
fi

say() { printf '==> %s\n' "$*" >&2; }

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    [ -n "$pkg" ] || continue
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! python3 -c 'import matplotlib' 2>/dev/null; then
    if debian_python; then
        say "python3-matplotlib is installed, but $(command -v python3) cannot import matplotlib"
        exit 1
    fi
    say "installing matplotlib for $(command -v python3) (pip)"
    python3 -m pip install --quiet 'matplotlib>=3.6'
    python3 -c 'import matplotlib'
fi

export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION\$"; then
    say "installing cargo-pgrx $PGRX_VERSION (a few minutes)"
    cargo install --locked cargo-pgrx --version "$PGRX_VERSION"
fi

# pgrx reads the PostgreSQL it builds against from ~/.pgrx/config.toml: point it at
# Debian's, so that it never tries to download one.
if ! grep -qs "^pg$PG_MAJOR = \"$PG_CONFIG\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    say "cargo pgrx init --pg$PG_MAJOR $PG_CONFIG"
    cargo pgrx init --pg$PG_MAJOR "$PG_CONFIG" >/dev/null
fi
