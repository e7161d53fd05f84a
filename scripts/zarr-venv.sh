#!/usr/bin/env bash
# Creates the Python virtual environment that writes and reads Zarr with zarr-python, for
# the Zarr interop tests (scripts/zarr_fixtures.py, scripts/zarr_read.py):
#
#   scripts/zarr-venv.sh [DIR]      (default: target/zarr-venv under the repository)
#
# or, with REQUIREMENTS and IMPORTS set, another pinned environment (scripts/sgkit-venv.sh).
#
# The versions are pinned in scripts/zarr-requirements.txt (or REQUIREMENTS). Idempotent: a
# stamp file in DIR records the requirements and the interpreter it was built from, so a
# second call returns at once. Prints nothing unless it fails; then it says why on stderr
# and exits non-zero. Concurrent calls on the same DIR wait for each other (flock on
# DIR.lock).
#
# Environment: PYTHON (the interpreter to build the venv from, default python3; zarr 3
# needs Python 3.11 or newer; on Debian `python3 -m venv` needs the python3-venv package,
# which scripts/install-deps.sh installs).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQUIREMENTS=${REQUIREMENTS:-$ROOT/scripts/zarr-requirements.txt}
# The modules the environment must import once installed.
IMPORTS=${IMPORTS:-zarr numcodecs numpy}
DIR=${1:-$ROOT/target/zarr-venv}
PYTHON=${PYTHON:-python3}

die() {
    printf 'zarr-venv.sh: %s\n' "$*" >&2
    exit 1
}

command -v "$PYTHON" >/dev/null 2>&1 ||
    die "$PYTHON not found: install Python 3.11 or newer (scripts/install-deps.sh installs Debian's python3-venv)"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null ||
    die "$("$PYTHON" --version 2>&1) is too old: zarr 3 needs Python 3.11 or newer (set PYTHON=...)"

# What the environment is built from: the pinned requirements and the interpreter.
want="$(cat "$REQUIREMENTS")
python: $("$PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
stamp="$DIR/.rankwise-zarr-venv"

up_to_date() {
    [[ -f $stamp && -x $DIR/bin/python ]] && [[ "$(cat "$stamp")" == "$want" ]]
}
up_to_date && exit 0

mkdir -p "$(dirname "$DIR")" 2>/dev/null || die "cannot create the parent directory of $DIR"
exec 9>"$DIR.lock"
flock 9
up_to_date && exit 0 # built by a concurrent call while this one waited

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
rm -rf "$DIR"
if ! "$PYTHON" -m venv "$DIR" >"$log" 2>&1; then
    cat "$log" >&2
    die "'$PYTHON -m venv $DIR' failed (on Debian: apt-get install python3-venv, or run scripts/install-deps.sh)"
fi
if ! "$DIR/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --requirement "$REQUIREMENTS" >"$log" 2>&1; then
    cat "$log" >&2
    rm -rf "$DIR"
    die "pip could not install $REQUIREMENTS into $DIR (is PyPI reachable?)"
fi
"$DIR/bin/python" -c "import ${IMPORTS// /, }" >"$log" 2>&1 || {
    cat "$log" >&2
    rm -rf "$DIR"
    die "$DIR does not import $IMPORTS after installing them"
}
printf '%s\n' "$want" >"$stamp.tmp"
# $want has no trailing newline; the stamp must compare equal through $(cat).
mv "$stamp.tmp" "$stamp"
