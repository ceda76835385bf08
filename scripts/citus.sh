#!/usr/bin/env bash
# Builds Citus, unchanged, from its source tarball and installs it into a PostgreSQL tree, as
# root: the Citus tests' clusters (tests/cluster/src/citus.rs) preload it beside lockext.
# Citus is AGPL: built and run as a separate extension, never linked into lockext.
# Idempotent: a marker in the tree records the tarball's sha256 (and the tree's library
# directory, which citus.so's RUNPATH names), and a second run prints one line and stops.
#
# CITUS_SRC (default ../shared/citus/citus-src.tar.gz from the repository's root; its
# README.md gives the commit and the sha256 pinned here) the tarball; PG_CONFIG (default
# /opt/lockext-postgresql/18/bin/pg_config, which scripts/bootstrap.sh unpacks) the tree,
# PostgreSQL 16 to 18. Built under target/citus-build/.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CITUS_SRC=${CITUS_SRC:-$ROOT/../shared/citus/citus-src.tar.gz}
# citusdata/citus a3d5708a6ae8bc8ed7129f8256b4585c01b917f3 (15.0devel), `git archive --prefix=citus/`.
CITUS_SHA256=66ca8e2343bf769c22a8ecb579eadbe152a639a067ef9c3fe22e99736b322faa
PG_CONFIG=${PG_CONFIG:-/opt/lockext-postgresql/18/bin/pg_config}
BUILD=$ROOT/target/citus-build
# Headers and libraries Citus's configure looks for (lz4, zstd, OpenSSL, GSSAPI), and its compiler.
APT_PACKAGES=(liblz4-dev libzstd-dev libssl-dev libkrb5-dev gcc make)

say() { printf '==> %s\n' "$*" >&2; }

[ -x "$PG_CONFIG" ] || { say "no pg_config at $PG_CONFIG (run scripts/bootstrap.sh, or set PG_CONFIG)"; exit 1; }
major=$("$PG_CONFIG" --version | sed -n 's/^PostgreSQL \([0-9]*\).*/\1/p')
if [ -z "$major" ] || [ "$major" -lt 16 ] || [ "$major" -gt 18 ]; then
    say "Citus ${CITUS_SHA256:0:12} builds against PostgreSQL 16 to 18, not $("$PG_CONFIG" --version) ($PG_CONFIG)"
    exit 1
fi

[ -f "$CITUS_SRC" ] || { say "no Citus source at $CITUS_SRC (set CITUS_SRC)"; exit 1; }
sha=$(sha256sum "$CITUS_SRC" | cut -d' ' -f1)
if [ "$sha" != "$CITUS_SHA256" ]; then
    say "refusing $CITUS_SRC: its sha256 is $sha, not $CITUS_SHA256 (../shared/citus/README.md)"
    exit 1
fi

LIBDIR=$("$PG_CONFIG" --pkglibdir)
EXTDIR=$("$PG_CONFIG" --sharedir)/extension
MARKER=$EXTDIR/citus-src.sha256
wanted="$CITUS_SHA256 $LIBDIR"
if [ -f "$LIBDIR/citus.so" ] && [ -f "$EXTDIR/citus.control" ] &&
    [ "$(cat "$MARKER" 2>/dev/null)" = "$wanted" ]; then
    say "Citus ${CITUS_SHA256:0:12} is already installed in PostgreSQL $major ($LIBDIR)"
    exit 0
fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# A fresh tree each time: a build left by another tarball or another PostgreSQL is never reused.
rm -rf "$BUILD"
mkdir -p "$BUILD"
tar -xzf "$CITUS_SRC" -C "$BUILD"
log=$BUILD/build.log
step() {
    local what=$1
    shift
    say "$what"
    "$@" >>"$log" 2>&1 || { tail -n 40 "$log" >&2; say "$what failed; the whole log is $log"; exit 1; }
}
start=$SECONDS
cd "$BUILD/citus"
step "configuring Citus ${CITUS_SHA256:0:12} for PostgreSQL $major ($PG_CONFIG)" ./configure PG_CONFIG="$PG_CONFIG"
step "building Citus (make -j2, about a minute and a half on two cores)" make -j2
step "installing Citus into $LIBDIR" make install
# Last, so that an interrupted install is done again by the next run.
echo "$wanted" >"$MARKER.tmp"
mv "$MARKER.tmp" "$MARKER"
say "Citus ${CITUS_SHA256:0:12} installed in PostgreSQL $major in $((SECONDS - start)) s"
