#!/usr/bin/env bash
# End-to-end benchmark of rankwise's main job (the exact SVD of a generated 10,000,000 × 20
# float64 matrix in one process) against NumPy's LAPACK and Dask on the same machine, with
# the machine's own memory bandwidth and DGEMM rate measured in the same run.
#
#   bash benches/run.sh [--quick]      (or: make bench [QUICK=1])
#   bash benches/run.sh --kernels      (only the criterion kernels and their section)
#
# Prints one table and rewrites the section between `<!-- BEGIN exact-svd -->` and
# `<!-- END exact-svd -->` of benches/RESULTS.md (the rest of that file is left as it is).
# Without --quick it also runs the criterion kernels (`cargo bench --bench kernels`) and
# rewrites the `kernels` section. Raw results stay in target/bench-results/<time>/.
#
# Environment: RANKWISE_BIN (default target/release/rankwise), PYTHON (used to create
# ./bench-venv, default python3), BENCH_RESULTS (default benches/RESULTS.md).
set -euo pipefail

usage() {
    sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

QUICK=0
KERNELS_ONLY=0
for arg in "$@"; do
    case "$arg" in
        --quick) QUICK=1 ;;
        --kernels) KERNELS_ONLY=1 ;;
        -h | --help)
            usage
            exit 0
            ;;
        *)
            printf 'run.sh: unknown argument %s\n' "$arg" >&2
            usage >&2
            exit 2
            ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# The Python references run in ./bench-venv, with the pinned versions of
# tools/bench-venv.sh (Dask) and scripts/zarr-requirements.txt (NumPy, zarr-python).
PYTHON=${PYTHON:-python3}
VENV=bench-venv
BIN=${RANKWISE_BIN:-target/release/rankwise}
RESULTS=${BENCH_RESULTS:-benches/RESULTS.md}

# The main job.
ROWS=10000000
COLS=20
CHUNK_ROWS=625000
REGEN_MEMORY=500M
THREADS=$(nproc)

if ((QUICK)); then
    MODE=quick
    RW_REPS=3       # rankwise runs per mode
    PY_REPS=2       # NumPy / Dask repetitions
    MEMBW_REPS=5    # repetitions of each bandwidth kernel (best is kept)
    DGEMM_REPS=2    # DGEMM calls after the warm-up (best is kept)
else
    MODE=full
    RW_REPS=5
    PY_REPS=3
    MEMBW_REPS=10
    DGEMM_REPS=3
fi
MEMBW_MIB=1024 # per array; three arrays
DGEMM_N=4000

# (--kernels runs go to kernels-<time>/: benches/summary.py reads the newest <date>-<time>/
# for the end-to-end figures.)
if ((KERNELS_ONLY)); then
    OUT="target/bench-results/kernels-$(date +%Y%m%d-%H%M%S)"
else
    OUT="target/bench-results/$(date +%Y%m%d-%H%M%S)"
fi
TOOLS=target/bench-tools
mkdir -p "$OUT" "$TOOLS"
: >"$OUT/commands.txt"
: >"$OUT/load.txt"

log() {
    printf '[bench %s] %s\n' "$(date +%T)" "$*" >&2
}

die() {
    log "error: $*"
    exit 1
}

# Notes the 1/5/15-minute load averages at the start of a stage.
load_mark() {
    local l1 l5 l15 rest
    read -r l1 l5 l15 rest </proc/loadavg
    printf '%s %s %s %s\n' "$1" "$l1" "$l5" "$l15" >>"$OUT/load.txt"
    log "$1 (load average $l1 $l5 $l15)"
}

# Runs a command and records it, shell-quoted, in commands.txt (redirections stay with
# the caller).
run() {
    local quoted
    quoted=$(printf '%q ' "$@")
    printf '%s\n' "${quoted% }" >>"$OUT/commands.txt"
    "$@"
}

# ---------------------------------------------------------------------------------------
# Prerequisites: the binary, the C tools, the virtualenv.

if [[ ! -x $BIN ]]; then
    log "$BIN is missing: building it"
    make --no-print-directory build
fi

# Run a private copy of the binary (mtime kept), so that a rebuild by someone else during
# the run cannot swap it halfway; the table names the original path.
cp -p "$BIN" "$OUT/rankwise"
git describe --always --dirty >"$OUT/git.txt" 2>/dev/null || echo unknown >"$OUT/git.txt"
RW="$OUT/rankwise"
{
    "$RW" --version 2>/dev/null || echo rankwise
    date -u -r "$RW" '+%Y-%m-%d %H:%M:%S UTC'
} >"$OUT/binary.txt"

log "compiling the bandwidth and DGEMM probes"
cc -O2 -fopenmp tools/membw.c -o "$TOOLS/membw"
cc -O2 tools/dgemm.c -o "$TOOLS/dgemm" -lopenblas

PYTHON="$PYTHON" bash tools/bench-venv.sh || die "could not set up $VENV"
PY="$VENV/bin/python"
export PYTHONDONTWRITEBYTECODE=1 # no __pycache__ under benches/
"$PY" -m pip freeze --disable-pip-version-check >"$OUT/pip-freeze.txt"

# The system OpenBLAS with the kernels rankwise runs on it (the binary may restart itself
# with OPENBLAS_CORETYPE set: the last `Core:` line is the one it computes with).
CORE=$({ OPENBLAS_VERBOSE=2 "$BIN" svd --rows 1000 --cols 2 --chunk-rows 500 2>&1 || true; } | sed -n 's/^Core: //p' | tail -1)

criterion_kernels() {
    load_mark "criterion kernels"
    # The kernels OpenBLAS runs in rankwise (its restart), not those it picks here.
    run env ${CORE:+OPENBLAS_CORETYPE="$CORE"} cargo bench --bench kernels 2>&1 \
        | tee "$OUT/criterion.txt" >&2
    "$PY" benches/report.py kernels --dir "$OUT" --results "$RESULTS" --mode "$MODE" \
        --bin "$BIN" --threads "$THREADS"
}

if ((KERNELS_ONLY)); then
    criterion_kernels
    rm -f "$RW"
    log "raw results in $OUT; kernels table in $RESULTS"
    exit 0
fi

# ---------------------------------------------------------------------------------------
# The machine: memory bandwidth and DGEMM.

load_mark "memory bandwidth"
run env OMP_NUM_THREADS="$THREADS" "$TOOLS/membw" "$MEMBW_MIB" "$MEMBW_REPS" \
    >"$OUT/membw.txt" 2>>"$OUT/stderr.log"
run env OMP_NUM_THREADS=1 "$TOOLS/membw" "$MEMBW_MIB" "$MEMBW_REPS" \
    >"$OUT/membw-1thread.txt" 2>>"$OUT/stderr.log"
cat "$OUT/membw.txt" >&2

load_mark "DGEMM"
run env ${CORE:+OPENBLAS_CORETYPE="$CORE"} "$TOOLS/dgemm" "$DGEMM_N" "$THREADS" "$DGEMM_REPS" \
    >"$OUT/dgemm.txt" 2>>"$OUT/stderr.log"
run env OPENBLAS_NUM_THREADS="$THREADS" "$PY" benches/reference.py dgemm --n "$DGEMM_N" \
    --reps "$DGEMM_REPS" >"$OUT/dgemm-numpy.json" 2>>"$OUT/stderr.log"
# The machine's widest kernels in the same OpenBLAS, where the CPU has AVX-512: the system
# OpenBLAS chooses its SSE3 ones for a model it does not know (Intel model 207), and
# rankwise pins the AVX2 ones; the machine's limit is the best of these DGEMMs.
if grep -qw avx512f /proc/cpuinfo; then
    run env OPENBLAS_CORETYPE=SkylakeX "$TOOLS/dgemm" "$DGEMM_N" "$THREADS" "$DGEMM_REPS" \
        >"$OUT/dgemm-avx512.txt" 2>>"$OUT/stderr.log"
    cat "$OUT/dgemm-avx512.txt" >&2
fi
cat "$OUT/dgemm.txt" "$OUT/dgemm-numpy.json" >&2

# ---------------------------------------------------------------------------------------
# rankwise.

SVD_ARGS=(svd --rows "$ROWS" --cols "$COLS" --chunk-rows "$CHUNK_ROWS")

load_mark "rankwise svd (resident)"
for ((i = 1; i <= RW_REPS; i++)); do
    run "$RW" "${SVD_ARGS[@]}" --machine-limit --json >"$OUT/rankwise-resident-$i.json" \
        2>>"$OUT/stderr.log"
done

load_mark "rankwise svd (regenerate, --memory-per-actor $REGEN_MEMORY)"
for ((i = 1; i <= RW_REPS; i++)); do
    run "$RW" "${SVD_ARGS[@]}" --memory-per-actor "$REGEN_MEMORY" --json \
        >"$OUT/rankwise-regenerate-$i.json" 2>>"$OUT/stderr.log"
done

load_mark "rankwise svd --check"
run "$RW" "${SVD_ARGS[@]}" --check --json >"$OUT/rankwise-check.json" 2>>"$OUT/stderr.log"

# ---------------------------------------------------------------------------------------
# The references.

load_mark "NumPy np.linalg.svd"
run env OPENBLAS_NUM_THREADS="$THREADS" "$PY" benches/reference.py numpy \
    --rows "$ROWS" --cols "$COLS" --reps "$PY_REPS" >"$OUT/numpy.json" 2>>"$OUT/stderr.log"

# One BLAS thread per Dask worker, so the two workers do not oversubscribe the cores.
load_mark "Dask da.linalg.svd"
run env OPENBLAS_NUM_THREADS=1 "$PY" benches/reference.py dask --rows "$ROWS" --cols "$COLS" \
    --chunk-rows "$CHUNK_ROWS" --workers "$THREADS" --reps "$PY_REPS" \
    >"$OUT/dask.json" 2>>"$OUT/stderr.log"

load_mark "end"

# ---------------------------------------------------------------------------------------
# The table and RESULTS.md.

"$PY" benches/report.py exact-svd --dir "$OUT" --results "$RESULTS" --mode "$MODE" \
    --bin "$BIN" --snapshot "$RW" --threads "$THREADS" --regen-memory "$REGEN_MEMORY" --dgemm-reps "$DGEMM_REPS"

if ((!QUICK)); then
    criterion_kernels
fi
rm -f "$RW"
log "raw results in $OUT; table in $RESULTS"
