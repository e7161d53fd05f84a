#!/usr/bin/env bash
# rankwise from Python, against its Python peers in one run on this machine:
# rankwise.dask.svd_compressed against dask.array.linalg.svd_compressed (in memory and from
# Zarr), the Python call against the command line on the same rsvd, and rankwise.pca of an
# sgkit Dataset against sgkit.pca. Every row states both sides' accuracy.
#
#   bash benches/python.sh [--quick]
#
# Environment: ROWS, COLS (default 400000 × 100 float64; --quick 100000), CHUNK_ROWS (20000),
# K (10), VARIANTS, SAMPLES (sgkit: 40000 × 2000; --quick 10000 × 1000).
# Results: target/bench-results/python-*/rows.jsonl.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ROWS=${ROWS:-400000}
VARIANTS=${VARIANTS:-40000}
SAMPLES=${SAMPLES:-2000}
if [[ ${1:-} == --quick ]]; then
    ROWS=100000
    VARIANTS=10000
    SAMPLES=1000
fi
COLS=${COLS:-100}
CHUNK_ROWS=${CHUNK_ROWS:-20000}
K=${K:-10}
BIN=target/release/rankwise
[[ -x "$BIN" ]] || make --no-print-directory build
wheel=$(scripts/python-venv.sh)
# sgkit's environment: made once from the pinned versions, the wheel installed anew.
SGKIT=target/sgkit-venv
scripts/sgkit-venv.sh "$SGKIT"
"$SGKIT/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"

OUT=target/bench-results/python-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
target/python-venv/bin/python benches/python.py "$BIN" "$OUT/work" "$ROWS" "$COLS" \
    "$CHUNK_ROWS" "$K" | tee "$OUT/rows.jsonl"
"$SGKIT/bin/python" benches/python_sgkit.py "$VARIANTS" "$SAMPLES" "$K" | tee -a "$OUT/rows.jsonl"
rm -rf "$OUT/work"
python3 - "$OUT/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'what':24} {'tool':22} {'source':24} {'seconds':>8}  accuracy")
for r in rows:
    if "max_rel_err" in r:
        acc = f"σ err {r['max_rel_err']:.1e}, residual {r['max_residual']:.1e}"
    else:
        acc = f"min |corr| {r['min_abs_corr']:.6f}, eigenvalue ratio err {r['max_eig_ratio_err']:.1e}"
    print(f"{r['what']:24} {r['tool']:22} {r.get('source', 'memory'):24} {r['seconds']:8.2f}  {acc}")
PY
