#!/usr/bin/env bash
# Installs NVRTC, CUDA's run-time compiler library, and nvCOMP from PyPI into a virtual
# environment, so that the GPU kernels can be compiled (not run) and nvCOMP's functions
# looked up on machines without CUDA: tests/gpu.rs runs `rankwise info --check-kernels`
# against them in every `make test`.
#
#   scripts/nvrtc-venv.sh [DIR]     (default: target/nvrtc-venv under the repository)
#
# Prints the directories holding libnvrtc.so.* and libnvcomp.so.* (as LD_LIBRARY_PATH takes
# them) on success. Idempotent (a stamp in DIR records
# the pinned version); concurrent calls on one DIR wait for each other (flock on DIR.lock).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR=${1:-$ROOT/target/nvrtc-venv}
PYTHON=${PYTHON:-python3}
# Neither has dependencies of its own: the pins are the whole environment.
PACKAGE="nvidia-cuda-nvrtc==13.5.37 nvidia-libnvcomp-cu13==6.0.0.12"

die() {
    printf 'nvrtc-venv.sh: %s\n' "$*" >&2
    exit 1
}

libdir() {
    local nvrtc nvcomp
    nvrtc=$(find "$DIR" -name 'libnvrtc.so.*' -not -name '*builtins*' -print -quit 2>/dev/null)
    nvcomp=$(find "$DIR" -name 'libnvcomp.so.*' -print -quit 2>/dev/null)
    [[ -n $nvrtc && -n $nvcomp ]] && printf '%s:%s\n' "$(dirname "$nvrtc")" "$(dirname "$nvcomp")"
}

stamp="$DIR/.rankwise-nvrtc-venv"
up_to_date() {
    [[ -f $stamp && "$(cat "$stamp")" == "$PACKAGE" ]] && libdir >/dev/null
}
if up_to_date; then
    libdir
    exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (scripts/install-deps.sh installs python3-venv)"
mkdir -p "$(dirname "$DIR")"
exec 9>"$DIR.lock"
flock 9
if up_to_date; then
    libdir
    exit 0
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
rm -rf "$DIR"
"$PYTHON" -m venv "$DIR" >"$log" 2>&1 || {
    cat "$log" >&2
    die "'$PYTHON -m venv $DIR' failed (on Debian: apt-get install python3-venv)"
}
# shellcheck disable=SC2086 # the pins, one word each
"$DIR/bin/python" -m pip install --quiet --disable-pip-version-check --no-input $PACKAGE >"$log" 2>&1 || {
    cat "$log" >&2
    rm -rf "$DIR"
    die "pip could not install $PACKAGE into $DIR (is PyPI reachable?)"
}
libdir >/dev/null || die "$PACKAGE installed no libnvrtc.so.* or libnvcomp.so.* under $DIR"
printf '%s' "$PACKAGE" >"$stamp"
libdir
