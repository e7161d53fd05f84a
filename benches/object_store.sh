#!/usr/bin/env bash
# Zarr from object storage: rankwise against Dask + zarr-python (through obstore, and through
# s3fs) on the same store, in one run on this machine: from disk, from moto's S3 server on
# 127.0.0.1, and through a proxy that adds DELAY_MS to every request (the latency of a
# cloud store). Reports GB/s decoded for a read of every chunk and the randomized SVD's time and accuracy (the
# largest relative error of the top K singular values against LAPACK's, both tools).
#
#   bash benches/object_store.sh [--quick]
#
# Environment: ROWS, COLS (default 400000 × 100 float64, 320 MB; --quick 100000), CHUNK_ROWS
# (5000: 4 MB chunks), DELAY_MS (20), K (10). Results: target/bench-results/object-store-*.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ROWS=${ROWS:-400000}
[[ ${1:-} == --quick ]] && ROWS=${ROWS_QUICK:-100000}
COLS=${COLS:-100}
CHUNK_ROWS=${CHUNK_ROWS:-5000}
DELAY_MS=${DELAY_MS:-20}
K=${K:-10}
BIN=target/release/rankwise
[[ -x "$BIN" ]] || make --no-print-directory build
PYTHON="${PYTHON:-python3}" bash tools/bench-venv.sh
OUT=target/bench-results/object-store-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
bench-venv/bin/python benches/object_store.py "$BIN" scripts "$OUT/work" "$ROWS" "$COLS" \
    "$CHUNK_ROWS" "$DELAY_MS" "$K" | tee "$OUT/rows.jsonl"
rm -rf "$OUT/work"
bench-venv/bin/python - "$OUT/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'what':24} {'tool':26} {'source':28} {'seconds':>8} {'GB/s':>6} {'max rel err / sum':>22}")
for r in rows:
    gbps = f"{r['gbps']:.3f}" if "gbps" in r else ""
    err = f"{r['max_rel_err']:.1e}" if "max_rel_err" in r else f"sum {r['sum']:.12e}"
    print(f"{r['what']:24} {r['tool']:26} {r['source']:28} {r['seconds']:8.2f} {gbps:>6} {err:>22}")
PY
