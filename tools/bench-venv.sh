#!/usr/bin/env bash
# Creates or updates ./bench-venv, the virtualenv of the benchmarks' Python peers: Dask and
# NumPy (benches/run.sh, benches/rsvd.sh) and zarr-python (benches/zarr.sh reads the same
# Zarr stores with Dask's da.from_zarr and writes them in the first place).
#
#   bash tools/bench-venv.sh          (benches/run.sh and benches/zarr.sh call it)
#
# Exact versions: Dask below; zarr, numcodecs, NumPy and their dependencies from
# scripts/zarr-requirements.txt (the same pins as the Zarr interop tests' venv). Idempotent:
# when the venv already imports those versions it returns at once. Logs to stderr; exits
# non-zero with a message when the venv cannot be built.
#
# Environment: PYTHON (the interpreter to build the venv from, default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DASK_VERSION=2026.8.0
REQUIREMENTS=scripts/zarr-requirements.txt
NUMPY_VERSION=$(sed -n 's/^numpy==//p' "$REQUIREMENTS")
ZARR_VERSION=$(sed -n 's/^zarr==//p' "$REQUIREMENTS")
NUMCODECS_VERSION=$(sed -n 's/^numcodecs==//p' "$REQUIREMENTS")
S3FS_VERSION=2026.9.0
BOTO_VERSION=1.43.117
PYTHON=${PYTHON:-python3}
VENV=bench-venv

log() {
    printf '[bench-venv %s] %s\n' "$(date +%T)" "$*" >&2
}

venv_ok() {
    [[ -x $VENV/bin/python ]] || return 1
    "$VENV/bin/python" - "$DASK_VERSION" "$NUMPY_VERSION" "$ZARR_VERSION" "$NUMCODECS_VERSION" \
        "$S3FS_VERSION" \
        <<'PY' 2>/dev/null
import sys
import boto3
import dask
import moto.server
import numcodecs
import obstore
import numpy
import s3fs
import zarr
have = (dask.__version__, numpy.__version__, zarr.__version__, numcodecs.__version__,
        s3fs.__version__)
sys.exit(0 if have == tuple(sys.argv[1:]) else 1)
PY
}

what="dask $DASK_VERSION, numpy $NUMPY_VERSION, zarr $ZARR_VERSION, numcodecs $NUMCODECS_VERSION, s3fs $S3FS_VERSION"
if venv_ok; then
    log "$VENV has $what"
    exit 0
fi
log "setting up $VENV ($what)"
[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV" || {
    log "error: '$PYTHON -m venv $VENV' failed (on Debian: scripts/install-deps.sh installs python3-venv)"
    exit 1
}
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    "dask[array]==$DASK_VERSION" --requirement "$REQUIREMENTS"
# s3fs, Dask's usual way into S3 (benches/object_store.py): its aiobotocore pins botocore to
# an older line than the tests' boto3, so this venv takes boto3 of that line.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    "s3fs==$S3FS_VERSION" "boto3==$BOTO_VERSION" "botocore==$BOTO_VERSION"
venv_ok || {
    log "error: $VENV does not import $what"
    exit 1
}
