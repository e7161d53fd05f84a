#!/usr/bin/env bash
# Randomized SVD and genotype PCA: rankwise against Dask's `da.linalg.svd_compressed` on the
# same shapes, k, oversampling and power iterations, in one run on this machine.
#
#   bash benches/rsvd.sh [--quick]      (make bench runs it after benches/run.sh)
#
# Workloads (full run):
#   1. float64 200,000 × 20,000 (Dask chunks 20,000 × 5,000), k = 10, q = 0: rankwise f64 and
#      f32 tiles; Dask with OPENBLAS_NUM_THREADS=1 (its best) and with the default.
#   2. float64 1,000,000 × 20,000, k = 10, q = 0: rankwise only (Dask's time is far longer;
#      its run is skipped here to keep the benchmark under half an hour).
#   3. uint8 genotypes 200,000 × 20,000, k = 10, q = 0 and q = 2: rankwise `pca` (time
#      includes generating the genotypes) against Dask on a persisted array (generation
#      not timed).
# --quick divides the rows by 10. Rewrites the section between `<!-- BEGIN rsvd -->` and
# `<!-- END rsvd -->` of benches/RESULTS.md; raw JSON stays in target/bench-results/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN=${RANKWISE_BIN:-target/release/rankwise}
RESULTS=${BENCH_RESULTS:-benches/RESULTS.md}
PY=bench-venv/bin/python
QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1
if [[ ! -x "$PY" ]]; then
    echo "rsvd.sh: $PY missing: run benches/run.sh first (it creates the virtualenv)" >&2
    exit 2
fi
if [[ ! -x "$BIN" ]]; then
    make --no-print-directory build
fi
SCALE=1
((QUICK)) && SCALE=10
M1=$((200000 / SCALE))
M2=$((1000000 / SCALE))
N=20000
# RSVD_OUT=DIR resumes an earlier run: workloads whose results exist there are not rerun.
OUT="${RSVD_OUT:-target/bench-results/rsvd-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
REPS=3

rw() { # name, then rankwise arguments
    local name=$1
    shift
    [[ -e "$OUT/$name.$REPS.json" ]] && return 0
    # --machine-limit: after the timed run, the machine's best GEMM rate and the rate it
    # produces the matrix at, measured in the same run (benches/summary.py's limit column).
    for i in $(seq 1 "$REPS"); do
        "$BIN" "$@" --machine-limit --json >"$OUT/$name.$i.json"
    done
    echo "rankwise $name done" >&2
}
dask() { # name, then reference arguments
    local name=$1
    shift
    [[ -e "$OUT/$name.json" || -e "$OUT/$name.failed" ]] && return 0
    # Dask keeps the whole matrix in memory (svd_compressed's passes share it): on a machine
    # with less memory than the matrix it is killed; that outcome is recorded, not hidden.
    local rc=0
    "$PY" benches/reference_rsvd.py "$@" --out "$OUT/$name.json" || rc=$?
    if ((rc != 0)); then
        echo "exit status $rc$( ((rc == 137)) && echo ' (killed: out of memory)')" >"$OUT/$name.failed"
        rm -f "$OUT/$name.json"
    fi
    echo "dask $name done (status $rc)" >&2
}

rw f64-200k rsvd --rows "$M1" --cols "$N" --chunk-rows $((M1 / 20)) -k 10 --power-iters 0
rw f32-200k rsvd --rows "$M1" --cols "$N" --chunk-rows $((M1 / 20)) -k 10 --power-iters 0 --precision f32
rw f64-1m rsvd --rows "$M2" --cols "$N" --chunk-rows $((M2 / 20)) -k 10 --power-iters 0
rw f32-1m rsvd --rows "$M2" --cols "$N" --chunk-rows $((M2 / 20)) -k 10 --power-iters 0 --precision f32
rw geno-q0-f32 pca --rows "$M1" --cols "$N" --chunk-rows $((M1 / 20)) -k 10 --power-iters 0 --precision f32
rw geno-q2-f32 pca --rows "$M1" --cols "$N" --chunk-rows $((M1 / 20)) -k 10 --power-iters 2 --precision f32
rw geno-q0-f64 pca --rows "$M1" --cols "$N" --chunk-rows $((M1 / 20)) -k 10 --power-iters 0
rw geno-q2-f64 pca --rows "$M1" --cols "$N" --chunk-rows $((M1 / 20)) -k 10 --power-iters 2
# Dask with compute=True (see benches/reference_rsvd.py: with compute=False it keeps all of
# A in memory and is killed at these sizes); the median of 3 repetitions of every run under
# a minute, one repetition of the 1,000,000-row one (about two minutes).
DREPS=3
dask dask-f64-200k-blas1 --workload float64 --rows "$M1" --cols "$N" --row-chunk $((M1 / 10)) \
    --col-chunk 5000 -k 10 --oversample 10 --power-iters 0 --reps $DREPS --blas-threads 1 --compute
dask dask-f64-200k-default --workload float64 --rows "$M1" --cols "$N" --row-chunk $((M1 / 10)) \
    --col-chunk 5000 -k 10 --oversample 10 --power-iters 0 --reps $DREPS --blas-threads default --compute
if ((!QUICK)); then
    dask dask-f64-1m-blas1 --workload float64 --rows "$M2" --cols "$N" --row-chunk $((M2 / 50)) \
        --col-chunk 5000 -k 10 --oversample 10 --power-iters 0 --reps 1 --blas-threads 1 --compute
fi
dask dask-geno-q0 --workload genotype --rows "$M1" --cols "$N" --row-chunk $((M1 / 10)) \
    --col-chunk 5000 -k 10 --oversample 10 --power-iters 0 --reps 3 --blas-threads 1 --compute
dask dask-geno-q2 --workload genotype --rows "$M1" --cols "$N" --row-chunk $((M1 / 10)) \
    --col-chunk 5000 -k 10 --oversample 10 --power-iters 2 --reps 3 --blas-threads 1 --compute

"$PY" - "$OUT" "$RESULTS" "$QUICK" <<'EOF'
import json, glob, os, re, statistics, subprocess, sys, platform
out, results, quick = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
def rw(name):
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{name}.*.json"))]
    t = [r["seconds"] for r in runs]
    rss = max(max(x.get("peak_rss_bytes") or 0 for x in r["per_rank"]) for r in runs)
    return runs[0], statistics.median(t), min(t), max(t), rss
def dk(name):
    try:
        return json.load(open(f"{out}/{name}.json"))
    except FileNotFoundError:
        reason = open(f"{out}/{name}.failed").read().strip() if os.path.exists(f"{out}/{name}.failed") else "not run"
        return {"failed": reason}
gib = lambda b: f"{b / 2**30:.2f} GiB"
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True, text=True).stdout.strip()
lines = []
lines.append("## Randomized SVD and genotype PCA (k = 10, oversample 10)\n")
lines.append(f"Run of `bash benches/rsvd.sh{' --quick' if quick else ''}` on {cpu}, {os.cpu_count()} CPUs "
             f"(the machine described above), raw results in `{out}`. rankwise: median of 3 runs "
             "(min–max), time of the whole command after start-up including generating the matrix; "
             "Dask 2026.8.0 `svd_compressed(compute=True)`, threaded scheduler, 2 workers: median of 3 "
             "repetitions (one at 1,000,000 rows); float64 rows in the faster of "
             "OPENBLAS_NUM_THREADS=1 and the default.\n")
lines.append("| workload | size | peer | peer time | rankwise | rankwise time | ratio | peer peak RSS | rankwise peak RSS | rankwise GEMM GFLOP/s | relative error estimate (rankwise) |")
lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
def row(work, size, peer, rname, label):
    r, med, lo, hi, rss = rw(rname)
    ok = peer is not None and "failed" not in peer
    spread = f" ({peer['min']:.2f}–{peer['max']:.2f})" if ok and peer.get("max", 0) > peer.get("min", 0) else ""
    pt = f"{peer['median']:.2f} s{spread}" if ok else (peer["failed"] if peer else "not run")
    ratio = f"{peer['median'] / med:.1f}×" if ok else "—"
    prss = gib(peer["peak_rss_bytes"]) if ok else "—"
    pname = (f"Dask `svd_compressed`, q={peer['power_iters']}, OPENBLAS_NUM_THREADS={peer['blas_threads']}" if ok else "Dask `svd_compressed`")
    est = r.get("error_estimate") or {}
    lines.append(f"| {work} | {size} | {pname} | {pt} | {label} | {med:.2f} s ({lo:.2f}–{hi:.2f}) | {ratio} | {prss} | {gib(rss)} | {r['gemm_gflop_per_s']:.1f} | {est.get('relative_frobenius', float('nan')):.4f} |")
m1 = "200,000" if not quick else "20,000"
m2 = "1,000,000" if not quick else "100,000"
d1, d1d = dk("dask-f64-200k-blas1"), dk("dask-f64-200k-default")
best = min((d for d in (d1, d1d) if "failed" not in d), key=lambda d: d["median"], default=d1)
d2 = dk("dask-f64-1m-blas1") if not quick else None
row("rsvd float64, q = 0", f"{m1} × 20,000", best, "f64-200k", "`rsvd` f64 tiles")
row("rsvd float64, q = 0", f"{m1} × 20,000", best, "f32-200k", "`rsvd --precision f32`")
row("rsvd float64, q = 0", f"{m2} × 20,000", d2, "f64-1m", "`rsvd` f64 tiles")
row("rsvd float64, q = 0", f"{m2} × 20,000", d2, "f32-1m", "`rsvd --precision f32`")
g0, g2 = dk("dask-geno-q0"), dk("dask-geno-q2")
row("genotype PCA, q = 0", f"{m1} × 20,000 uint8", g0, "geno-q0-f32", "`pca --precision f32`")
row("genotype PCA, q = 0", f"{m1} × 20,000 uint8", g0, "geno-q0-f64", "`pca` f64 tiles")
row("genotype PCA, q = 2", f"{m1} × 20,000 uint8", g2, "geno-q2-f32", "`pca --precision f32`")
row("genotype PCA, q = 2", f"{m1} × 20,000 uint8", g2, "geno-q2-f64", "`pca` f64 tiles")
lines.append("")
lines.append("- Dask's relative residuals (‖A‖_F² − Σσ²)^½/‖A‖_F: "
             + ", ".join(f"{n} {dk(n)['relative_residual']:.4f}" for n in ["dask-f64-200k-blas1", "dask-f64-1m-blas1", "dask-geno-q0", "dask-geno-q2"] if "failed" not in dk(n))
             + "; rankwise's column is its probe estimate of the same quantity. The matrices are different draws of the same distributions.")
lines.append("- Dask's genotype time excludes generating and persisting the array; rankwise's includes generating and 2-bit packing it.")
lines.append("- GEMM GFLOP/s counts 2·m·n·(columns) for every pass (pass 1 with the 5 probe columns); the machine's DGEMM is measured above.")
for name in ["f64-1m", "geno-q0-f32"]:
    r = rw(name)[0]
    lines.append(f"- phases of `{name}` (rank 0): " + "; ".join(f"{t['phase']} {t['seconds']:.2f} s" for t in r["per_rank"][0]["timings"]))
text = "\n".join(lines) + "\n"
print(text)
body = open(results).read()
begin, end = "<!-- BEGIN rsvd -->", "<!-- END rsvd -->"
section = f"{begin}\n{text}{end}"
if begin in body:
    body = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: section, body, flags=re.S)
else:
    body = body.rstrip("\n") + "\n\n" + section + "\n"
open(results, "w").write(body)
EOF
