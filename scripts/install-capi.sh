#!/usr/bin/env bash
# Installs the C library built by `cargo build --release -p rankwise-capi` under PREFIX:
#   lib/librankwise.so, lib/librankwise.a, lib/pkgconfig/rankwise.pc,
#   include/rankwise.h, include/rankwise.f90 (the Fortran 2008 module, as source: a
#   compiled .mod only works with the compiler that made it, so codes compile it with theirs).
# Usage: scripts/install-capi.sh PREFIX [TARGET_DIR]   (`make install PREFIX=…` runs it)
set -euo pipefail

if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "usage: $0 PREFIX [TARGET_DIR]" >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=$1
target=${2:-${CARGO_TARGET_DIR:-$repo/target}}/release
for f in librankwise.so librankwise.a; do
  if [ ! -f "$target/$f" ]; then
    echo "install-capi: $target/$f is missing: run cargo build --release -p rankwise-capi" >&2
    exit 1
  fi
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n 1)
# The libraries the static library needs, one line in capi/native-static-libs.txt.
native=$(tr -d '\n' <"$repo/capi/native-static-libs.txt")

mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
prefix=$(cd "$prefix" && pwd)
# Debug info stays in the build tree: the installed libraries are a tenth of the size.
install -m 0755 "$target/librankwise.so" "$prefix/lib/librankwise.so"
install -m 0644 "$target/librankwise.a" "$prefix/lib/librankwise.a"
strip --strip-debug "$prefix/lib/librankwise.so" "$prefix/lib/librankwise.a"
install -m 0644 "$repo/capi/include/rankwise.h" "$prefix/include/rankwise.h"
install -m 0644 "$repo/capi/fortran/rankwise.f90" "$prefix/include/rankwise.f90"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" -e "s|@NATIVE_STATIC_LIBS@|$native|" \
  "$repo/capi/rankwise.pc.in" >"$prefix/lib/pkgconfig/rankwise.pc"
echo "install-capi: installed rankwise $version under $prefix"
