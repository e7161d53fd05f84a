#!/usr/bin/env bash
# Creates or updates ./peers-venv, the virtualenv of the benchmarks' Heat and Cubed peers
# (benches/peers.sh), from the exact versions in tools/peers-requirements.txt.
#
#   bash tools/peers-venv.sh          (benches/peers.sh calls it)
#
# A virtualenv of its own, apart from ./bench-venv: Heat needs PyTorch, whose PyPI wheel
# brings NVIDIA's CUDA libraries (about 3 GB), which the other benchmarks need not download.
# mpi4py runs on the system's Open MPI (scripts/install-deps.sh installs it). Idempotent:
# when the venv already has those versions it returns at once. Logs to stderr; exits non-zero
# with a message when the venv cannot be built.
#
# Environment: PYTHON (the interpreter to build the venv from, default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
REQUIREMENTS=tools/peers-requirements.txt
PYTHON=${PYTHON:-python3}
VENV=peers-venv

log() {
    printf '[peers-venv %s] %s\n' "$(date +%T)" "$*" >&2
}

venv_ok() {
    [[ -x $VENV/bin/python ]] || return 1
    local want have
    want=$(grep -v '^#' "$REQUIREMENTS" | tr 'A-Z_' 'a-z-' | sort)
    have=$("$VENV/bin/python" -m pip freeze --disable-pip-version-check 2>/dev/null |
        tr 'A-Z_' 'a-z-' | sort)
    [[ -z $(comm -23 <(echo "$want") <(echo "$have")) ]] || return 1
    "$VENV/bin/python" -c 'import cubed, heat, mpi4py.MPI, torch' 2>/dev/null
}

if venv_ok; then
    log "$VENV has every version of $REQUIREMENTS"
    exit 0
fi
log "setting up $VENV from $REQUIREMENTS (Heat, Cubed, PyTorch: a download of about 3 GB)"
[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV" || {
    log "error: '$PYTHON -m venv $VENV' failed (on Debian: scripts/install-deps.sh installs python3-venv)"
    exit 1
}
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --requirement "$REQUIREMENTS"
venv_ok || {
    log "error: $VENV does not have the versions of $REQUIREMENTS, or does not import cubed, heat, mpi4py and torch"
    exit 1
}
log "$VENV ready"
