#!/usr/bin/env bash
# Creates the Python virtual environment of sgkit 0.10, which pins zarr-python 2 (versions in
# scripts/sgkit-requirements.txt), for tests/sgkit.rs and benches/python_sgkit.py:
#
#   scripts/sgkit-venv.sh [DIR]     (default: target/sgkit-venv under the repository)
#
# Idempotent and locked as scripts/zarr-venv.sh, which builds it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQUIREMENTS="$ROOT/scripts/sgkit-requirements.txt" IMPORTS="sgkit xarray zarr" \
    exec "$ROOT/scripts/zarr-venv.sh" "${1:-$ROOT/target/sgkit-venv}"
