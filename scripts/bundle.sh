#!/usr/bin/env bash
# Makes a relocatable copy of rankwise for a machine that lacks the Debian packages it links
# (OpenBLAS, Open MPI, hwloc, UCX, …): a GPU node image, a container, a cluster without
# modules for them.
#
#   scripts/bundle.sh DIR [--tests]      (make bundle DIR=… builds first)
#
# DIR/bin/rankwise        the release binary, without its debug info
# DIR/bin/device_decode   the device decode's benchmark (examples/device_decode.rs), where
#                         make build built it
# DIR/lib/                every shared library it links except the C library's own
#                         (libc, libm, libpthread, libdl, librt, ld-linux), from `ldd`
# DIR/env.sh              `. DIR/env.sh` puts both on PATH and LD_LIBRARY_PATH
# --tests adds DIR/release/rankwise and DIR/release/deps/gpu: the GPU test binary, laid out
#                         as it expects (it finds rankwise beside its own directory), so
#                         `. DIR/env.sh && RANKWISE_REQUIRE_GPU=1 DIR/release/deps/gpu` runs
#                         tests/gpu.rs where no Rust toolchain is installed; and, where
#                         make test built them, release/deps/rankwise_device and
#                         release/deps/device_generator (make test-gpu's other two).
#
# CUDA is not bundled: rankwise loads the machine's own driver, NVRTC and cuBLAS at run
# time. Runs under the bundled Open MPI need its plugins too; use the target's MPI and
# launcher for multi-process runs (it must be Open MPI 4.x, whose libmpi.so.40 rankwise
# links).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() {
    printf 'bundle.sh: %s\n' "$*" >&2
    exit 1
}
[[ $# -ge 1 ]] || die "usage: scripts/bundle.sh DIR [--tests]"
DIR=$1
TESTS=0
[[ ${2:-} == --tests ]] && TESTS=1
BIN="$ROOT/target/release/rankwise"
[[ -x $BIN ]] || die "$BIN is missing: run make build (or make bundle DIR=$DIR)"
[[ ! -e $DIR ]] || die "$DIR exists: give a new directory"

mkdir -p "$DIR.tmp/bin" "$DIR.tmp/lib"
trap 'rm -rf "$DIR.tmp"' EXIT
objcopy --strip-debug "$BIN" "$DIR.tmp/bin/rankwise"

# The libraries `ldd` resolves for FILE, less the C library's own.
libs() {
    ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
        grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*)\.so' || true
}
copy_libs() {
    local lib
    while read -r lib; do
        [[ -n $lib ]] || continue
        # -L: the library itself under the name the binary asks for (ldd gives that name).
        cp -L "$lib" "$DIR.tmp/lib/$(basename "$lib")"
    done < <(libs "$1")
}
copy_libs "$BIN"

if ((TESTS)); then
    test_bin=$(find "$ROOT/target/release/deps" -maxdepth 1 -type f -executable -name 'gpu-*' \
        -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
    [[ -n $test_bin ]] || die "no tests/gpu.rs binary under target/release/deps: run make test first"
    mkdir -p "$DIR.tmp/release/deps"
    ln "$DIR.tmp/bin/rankwise" "$DIR.tmp/release/rankwise"
    objcopy --strip-debug "$test_bin" "$DIR.tmp/release/deps/gpu"
    copy_libs "$test_bin"
    # make test-gpu's other two: the device crate's units (probe, NVRTC-compiled kernels)
    # and the sources' device generator check, where make test built them.
    for unit in rankwise_device device_generator; do
        bin=$(find "$ROOT/target/release/deps" -maxdepth 1 -type f -executable -name "$unit-*" \
            -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
        if [[ -n $bin ]]; then
            objcopy --strip-debug "$bin" "$DIR.tmp/release/deps/$unit"
            copy_libs "$bin"
        fi
    done
fi

# The device decode's benchmark (benches/gpu.sh runs it beside the rankwise binary).
if [[ -x $ROOT/target/release/examples/device_decode ]]; then
    objcopy --strip-debug "$ROOT/target/release/examples/device_decode" "$DIR.tmp/bin/device_decode"
fi

cat >"$DIR.tmp/env.sh" <<'EOF'
# Source this file: rankwise and its libraries from this bundle.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="$here/bin:$PATH"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset here
EOF
mv "$DIR.tmp" "$DIR"
trap - EXIT
du -sh "$DIR" | awk '{print "bundle.sh: " $2 ": " $1}'
