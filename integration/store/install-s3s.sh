#!/usr/bin/env bash
# Installs the test bed's S3 server, s3s-fs 0.14.1 (feature `binary`), into a cache outside the
# checkout, once per machine. Prints progress on stderr and the binary's path as the last line of
# stdout. Idempotent: when the binary is already there it only prints the path.
#
#   CELLD_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/celld-operator)
set -euo pipefail

version=0.14.1
cache_root="${CELLD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/celld-operator}"
root="$cache_root/tools/s3s-fs-$version"
bin="$root/bin/s3s-fs"

if [[ -x "$bin" ]]; then
    echo "install-s3s: s3s-fs $version already installed at $bin" >&2
    echo "$bin"
    exit 0
fi

command -v cargo >/dev/null || { echo "install-s3s: cargo not found on PATH" >&2; exit 1; }

mkdir -p "$root"
# One installer at a time: parallel test binaries may call this script concurrently.
exec 9>"$root/.install.lock"
if command -v flock >/dev/null; then
    echo "install-s3s: waiting for the install lock $root/.install.lock" >&2
    flock 9
fi
if [[ -x "$bin" ]]; then
    echo "install-s3s: s3s-fs $version installed by a concurrent run at $bin" >&2
    echo "$bin"
    exit 0
fi

echo "install-s3s: building s3s-fs $version (feature binary) into $root; this takes a few minutes on 2 cores" >&2
# The build directory lives in the cache too, so an interrupted build resumes instead of restarting.
CARGO_TARGET_DIR="$root/build" cargo install --locked --root "$root" \
    --features binary --version "=$version" s3s-fs >&2

if [[ ! -x "$bin" ]]; then
    echo "install-s3s: cargo install finished but $bin is missing" >&2
    exit 1
fi
rm -rf "$root/build"
echo "install-s3s: installed $bin" >&2
echo "$bin"
