#!/usr/bin/env bash
# Genotype PCA: rankwise against PLINK 2's randomized PCA (`--pca approx`) on one PLINK
# fileset, in one run on this machine, each side's accuracy stated for every PC.
#
#   bash benches/plink.sh [--quick]      (make bench runs it; REPS=N runs each N times, 3)
#
# The data: `rankwise gen --dist genotype --populations 3` (200,000 variants × 20,000 samples,
# no missing calls, so that both tools compute the same PCA), written as
# PREFIX.bed/.bim/.fam by tools/zarr_to_bed.py (1 GB). Both tools read that .bed, from the
# page cache (it is read once untimed first). Timed, for k = 10 and k = 20:
# `plink2 --bfile PREFIX --pca approx K --threads NPROC` and `rankwise pca --bed PREFIX -k K`
# with the defaults (LOBPCG to --tol 1e-6, f32 passes then f64) and with --tol 1e-3 (about
# PLINK 2's accuracy on this cohort); for k = 10 also the fixed
# `--power-iters 2 --precision f32` (Dask's n_power_iter, like for like). Wall time of the
# whole command, peak RSS from wait4. Accuracy (benches/plink_report.py): every PC's
# eigenvalue and |corr| against a long rankwise run (`-k 20 --tol 1e-8`,
# untimed): `plink2 --pca` (exact) of 20,000 samples does not fit in the run. Then the QC a
# PCA pipeline applies, on both sides: LD pruning by `plink2 --indep-pairwise 200 50 0.1`
# (untimed) and `--maf 0.01 --hwe 1e-6 --extract PRUNE.IN` with the PCA (k = 10).
# --quick divides the variants by 10.
#
# Rewrites the section between `<!-- BEGIN plink -->` and `<!-- END plink -->` of
# benches/RESULTS.md; raw results stay in target/bench-results/plink-STAMP/.
# PLINK_OUT=DIR REPORT_ONLY=1 rewrites the section from the results of an earlier run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN=${RANKWISE_BIN:-target/release/rankwise}
RESULTS=${BENCH_RESULTS:-benches/RESULTS.md}
PY=bench-venv/bin/python
QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1
command -v plink2 >/dev/null || {
    echo "plink.sh: plink2 is missing: scripts/install-deps.sh installs it" >&2
    exit 2
}
[[ -x "$PY" ]] || bash tools/bench-venv.sh
[[ -x "$BIN" ]] || make --no-print-directory build
M=$((200000 / (QUICK ? 10 : 1)))
N=20000
DATA=target/bench-data/plink-${M}x$N-complete
OUT="${PLINK_OUT:-target/bench-results/plink-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT" "$DATA"
THREADS=$(nproc)

if [[ -n ${REPORT_ONLY:-} ]]; then
    :
elif [[ ! -e "$DATA/g.bed" ]]; then
    rm -rf "$DATA/g.zarr"
    "$BIN" gen --out "$DATA/g.zarr" --rows "$M" --cols "$N" --chunk-rows 10000 --dist genotype \
        --populations 3 --dtype i8 --codec none --seed 11 >/dev/null
    "$PY" tools/zarr_to_bed.py "$DATA/g.zarr" "$DATA/g"
    rm -rf "$DATA/g.zarr"
fi
[[ -n ${REPORT_ONLY:-} ]] || cat "$DATA/g.bed" >/dev/null

# name, then the command: REPS runs, each as OUT/name.i.{json,log} (wall seconds, peak RSS);
# `{i}` in an argument becomes the run's number (each run's own --out).
REPS=${REPS:-3}
timed() {
    local name=$1
    shift
    "$PY" - "$OUT" "$name" "$REPS" "$@" <<'EOF'
import json, os, subprocess, sys, time
out, name, reps, cmd = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
for i in range(1, reps + 1):
    with open(f"{out}/{name}.{i}.log", "wb") as log:
        t = time.perf_counter()
        run = [a.replace("{i}", str(i)) for a in cmd]
        p = subprocess.Popen(run, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
        seconds = time.perf_counter() - t
    if status != 0:
        sys.exit(f"{name}: {' '.join(cmd)} failed (status {status}); see {out}/{name}.{i}.log")
    json.dump({"seconds": seconds, "peak_rss_bytes": usage.ru_maxrss * 1024, "command": cmd},
              open(f"{out}/{name}.{i}.json", "w"))
print(f"{name} done", file=sys.stderr)
EOF
}

if [[ -z ${REPORT_ONLY:-} ]]; then
    pca=("$BIN" pca --bed "$DATA/g")
    # The reference: every PC to a residual of 1e-8 (untimed), by LOBPCG, a solver other
    # than the default's (block Lanczos).
    "${pca[@]}" -k 20 --tol 1e-8 --max-passes 150 --method lobpcg --json \
        --out "$OUT/ref.zarr" >"$OUT/ref.log"
    for K in 10 20; do
        timed "plink2-k$K" plink2 --bfile "$DATA/g" --pca approx "$K" --threads "$THREADS" \
            --out "$OUT/plink2-k$K"
        timed "rw-k$K" "${pca[@]}" -k "$K" --json --out "$OUT/rw-k$K.{i}.zarr"
        # LOBPCG, the default before block Lanczos, to the same tolerance.
        timed "rw-k$K-lobpcg" "${pca[@]}" -k "$K" --method lobpcg --json \
            --out "$OUT/rw-k$K-lobpcg.{i}.zarr"
        # At about PLINK 2's accuracy (its eigenvalues 3 % low, its bulk PCs unresolved).
        timed "rw-k$K-tol1e-3" "${pca[@]}" -k "$K" --tol 1e-3 --json \
            --out "$OUT/rw-k$K-tol1e-3.{i}.zarr"
    done
    timed rw-q2-f32 "${pca[@]}" -k 10 --power-iters 2 --precision f32 --json \
        --out "$OUT/rw-q2-f32.{i}.zarr"
    # QC filters as a PCA pipeline applies them, the same on both sides.
    plink2 --bfile "$DATA/g" --indep-pairwise 200 50 0.1 --threads "$THREADS" \
        --out "$OUT/ld" >/dev/null
    qc=(--maf 0.01 --hwe 1e-6 --extract "$OUT/ld.prune.in")
    timed plink2-qc plink2 --bfile "$DATA/g" "${qc[@]}" --pca approx 10 \
        --threads "$THREADS" --out "$OUT/plink2-qc"
    timed rw-qc "${pca[@]}" -k 10 "${qc[@]}" --json
    # Projection through the reference PCA's weights (`ref.eigenvec.var`, `ref.afreq`), of
    # the same samples: both tools should give back the reference's own PCs.
    timed plink2-score plink2 --bfile "$DATA/g" --read-freq "$OUT/ref.afreq" \
        --score "$OUT/ref.eigenvec.var" 2 4 header-read variance-standardize \
        no-mean-imputation cols=+scoresums --score-col-nums 5-24 --threads "$THREADS" \
        --out "$OUT/score"
    timed rw-project "$BIN" project --bed "$DATA/g" --pca "$OUT/ref" --out "$OUT/proj.{i}" \
        --json
fi

"$PY" benches/plink_report.py "$OUT" "$RESULTS" "$QUICK" "$M" "$N" "$THREADS" "$DATA"
