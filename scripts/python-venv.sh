#!/usr/bin/env bash
# Builds the Python package's wheel with maturin and installs it into the test
# environment, a virtual environment with the versions of python/requirements-test.txt:
#
#   scripts/python-venv.sh [VENV]     (default: target/python-venv under the repository)
#
# Prints the wheel's path on stdout. The environment is made once (a stamp records the
# requirements and the interpreter); the wheel is rebuilt every time (cargo makes that
# quick when nothing changed) and reinstalled. Concurrent calls wait for each other.
#
# Environment: PYTHON (the interpreter to build the venv from, default python3), CARGO.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQUIREMENTS="$ROOT/python/requirements-test.txt"
VENV=${1:-$ROOT/target/python-venv}
PYTHON=${PYTHON:-python3}
WHEELS="$ROOT/target/wheels"

die() {
    printf 'python-venv.sh: %s\n' "$*" >&2
    exit 1
}

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: install Python 3.10 or newer"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null ||
    die "$("$PYTHON" --version 2>&1) is too old: the package needs Python 3.10 or newer"

want="$(cat "$REQUIREMENTS")
python: $("$PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
stamp="$VENV/.rankwise-python-venv"

mkdir -p "$(dirname "$VENV")" "$WHEELS"
exec 9>"$VENV.lock"
flock 9

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! [[ -f $stamp && -x $VENV/bin/python && "$(cat "$stamp")" == "$want" ]]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" >"$log" 2>&1 || {
        cat "$log" >&2
        die "'$PYTHON -m venv $VENV' failed (on Debian: apt-get install python3-venv)"
    }
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        --requirement "$REQUIREMENTS" >"$log" 2>&1 || {
        cat "$log" >&2
        rm -rf "$VENV"
        die "pip could not install $REQUIREMENTS into $VENV (is PyPI reachable?)"
    }
    printf '%s\n' "$want" >"$stamp.tmp"
    mv "$stamp.tmp" "$stamp"
fi

# The wheel: one abi3 wheel for every CPython >= 3.10. With the features of `make build`
# (see python/Cargo.toml), so that its artifacts are reused.
rm -f "$WHEELS"/rankwise-*.whl
"$VENV/bin/maturin" build --release --quiet -m "$ROOT/python/Cargo.toml" -o "$WHEELS" \
    --features rankwise/system-tests,rankwise-transports/system-tests \
    >"$log" 2>&1 || {
    cat "$log" >&2
    die "maturin could not build the wheel"
}
wheel=$(ls "$WHEELS"/rankwise-*.whl)
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --force-reinstall --no-deps "$wheel" >"$log" 2>&1 || {
    cat "$log" >&2
    die "pip could not install $wheel"
}
printf '%s\n' "$wheel"
