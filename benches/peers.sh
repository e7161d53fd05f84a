#!/usr/bin/env bash
# rankwise against Heat (MPI + PyTorch) and Cubed (bounded-memory arrays), in one run on this
# machine, on the workloads of the summary table where each has a counterpart.
#
#   bash benches/peers.sh [--quick]      (make bench runs it)
#
# Workloads (float64 unless said):
#   svd     exact SVD of a generated 10,000,000 × 20 uniform matrix, panels of 625,000 rows:
#           Heat `ht.linalg.svd` (TSQR) on 2 MPI ranks against `mpirun -np 2 rankwise svd`;
#           Cubed `xp.linalg.svd` (TSQR) on its threads executor against one `rankwise svd`.
#   rsvd    `rsvd -k 10`, q = 0 and q = 2, of a generated 100,000 × 20,000 uniform matrix
#           (16 GB: Heat holds it in memory, split across the ranks; 200,000 rows would not
#           fit in this machine's memory twice): Heat `ht.linalg.rsvd` on 2 ranks against
#           `mpirun -np 2 rankwise rsvd` (which regenerates its panels each pass).
#   zarr    `rsvd -k 10`, q = 0, of benches/zarr.sh's zarr-python store (200,000 × 5,000
#           float32, Blosc lz4; written here if missing): Heat `ht.load_zarr` + `rsvd` on 2
#           ranks against `mpirun -np 2 rankwise rsvd --zarr`.
#   reduce  (x + 1)[::2, ::2].sum() of a generated 50,000 × 50,000 uniform matrix, chunks
#           10,000²: Cubed against `rankwise reduce --dist uniform` (Cubed has no normal
#           generator, so this is summary row (4) with uniform values).
# rankwise: the report's own time (launch excluded) and every rank's peak RSS, 5 runs for
# svd and reduce, 3 otherwise. Peers: benches/reference_peers.py, 3 repetitions in one
# process (one per rank), their time measured the same way. Memory: every rank's peak RSS
# added up (the node's footprint). Heat: one torch thread per rank; Cubed: as many workers
# as CPUs, allowed_mem 4GB. Cubed's intermediates go to target/bench-data/cubed-work.
#
# --quick divides the rows by 100 (a smoke run). Rewrites the section between
# `<!-- BEGIN peers -->` and `<!-- END peers -->` of benches/RESULTS.md; raw results stay in
# target/bench-results/peers-STAMP/. A run that fails is recorded as failed (exit status) in
# the table, never dropped. PEERS_OUT=DIR resumes an earlier run (results there are not
# rerun); with REPORT_ONLY=1 it only rewrites the section from them.
#
# Environment: RANKWISE_BIN (default target/release/rankwise), BENCH_RESULTS (default
# benches/RESULTS.md), PYTHON (to create the venvs, default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN=${RANKWISE_BIN:-target/release/rankwise}
RESULTS=${BENCH_RESULTS:-benches/RESULTS.md}
QUICK=0
for arg in "$@"; do
    case "$arg" in
        --quick) QUICK=1 ;;
        -h | --help)
            sed -n '2,36p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "peers.sh: unknown argument $arg" >&2
            exit 2
            ;;
    esac
done
# mpirun as root (containers, CI runners) needs these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PYTHONDONTWRITEBYTECODE=1

log() {
    printf '[peers bench %s] %s\n' "$(date +%T)" "$*" >&2
}

OUT="${PEERS_OUT:-target/bench-results/peers-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
SCALE=$((QUICK ? 100 : 1))
SVD_ROWS=$((10000000 / SCALE))
SVD_CHUNK=$((625000 / SCALE))
RSVD_ROWS=$((100000 / SCALE))
RSVD_COLS=20000
RSVD_CHUNK=$((RSVD_ROWS / 20))
ZARR_ROWS=$((200000 / SCALE))
ZARR_CHUNK=$((20000 / SCALE))
RED_N=$((QUICK ? 5000 : 50000))
RED_CHUNK=$((RED_N / 5))
NP=2
CPUS=$(nproc)
MPIRUN=(mpirun -np "$NP" --bind-to none)

if [[ -z ${REPORT_ONLY:-} ]]; then
    PYTHON="${PYTHON:-python3}" bash tools/peers-venv.sh
    PYTHON="${PYTHON:-python3}" bash tools/bench-venv.sh
    [[ -x "$BIN" ]] || make --no-print-directory build
    BIN_COPY="$OUT/rankwise"
    cp "$BIN" "$BIN_COPY"
    "$BIN_COPY" --version >"$OUT/rankwise-version.txt"
    git describe --always --dirty >"$OUT/git.txt" 2>/dev/null || echo "not a git checkout" >"$OUT/git.txt"
fi
PY=peers-venv/bin/python

failed() { # name, exit status → records the failure
    echo "exit status $2$( (($2 == 137)) && echo ' (killed: out of memory?)')" >"$OUT/$1.failed"
    log "$1 failed with status $2"
}

rw() { # name, runs, then the command (rankwise's --json report is kept per run)
    local name=$1 reps=$2 rc=0
    shift 2
    [[ -e "$OUT/$name.$reps.json" || -e "$OUT/$name.failed" ]] && return 0
    echo "$*" >"$OUT/$name.command"
    for i in $(seq 1 "$reps"); do
        "$@" --json >"$OUT/$name.$i.json" 2>>"$OUT/$name.stderr" || rc=$?
        if ((rc != 0)); then
            rm -f "$OUT/$name.$i.json"
            failed "$name" "$rc"
            return 0
        fi
    done
    log "rankwise $name done"
}

peer() { # name, then the command (benches/reference_peers.py writes --out)
    local name=$1 rc=0
    shift
    [[ -e "$OUT/$name.json" || -e "$OUT/$name.failed" ]] && return 0
    echo "$*" >"$OUT/$name.command"
    "$@" --out "$OUT/$name.json" 2>>"$OUT/$name.stderr" || rc=$?
    if ((rc != 0)); then
        rm -f "$OUT/$name.json"
        failed "$name" "$rc"
        return 0
    fi
    log "$name done"
}

if [[ -z ${REPORT_ONLY:-} ]]; then
    RW="$OUT/rankwise"
    REF=(benches/reference_peers.py)
    SVD=(svd --rows "$SVD_ROWS" --cols 20 --chunk-rows "$SVD_CHUNK")
    rw rw-svd-1 5 "$RW" "${SVD[@]}"
    rw rw-svd-mpi 5 "${MPIRUN[@]}" "$RW" "${SVD[@]}"
    # Untimed: the residual of the same job, for the accuracy column.
    rw rw-svd-check 1 "${MPIRUN[@]}" "$RW" "${SVD[@]}" --check
    peer heat-svd "${MPIRUN[@]}" "$PY" "${REF[@]}" heat-svd --rows "$SVD_ROWS" --cols 20 --reps 3
    mkdir -p target/bench-data/cubed-work
    peer cubed-svd "$PY" "${REF[@]}" cubed-svd --rows "$SVD_ROWS" --cols 20 \
        --chunk-rows "$SVD_CHUNK" --workers "$CPUS" --work-dir target/bench-data/cubed-work --reps 3

    for q in 0 2; do
        rw "rw-rsvd-q$q" 3 "${MPIRUN[@]}" "$RW" rsvd --rows "$RSVD_ROWS" --cols "$RSVD_COLS" \
            --chunk-rows "$RSVD_CHUNK" -k 10 --power-iters "$q"
        peer "heat-rsvd-q$q" "${MPIRUN[@]}" "$PY" "${REF[@]}" heat-rsvd --rows "$RSVD_ROWS" \
            --cols "$RSVD_COLS" -k 10 --power-iters "$q" --reps 3
    done

    # benches/zarr.sh's store (the same name, so either script reuses the other's).
    STORE="target/bench-data/zarr-f32-${ZARR_ROWS}x5000-c${ZARR_CHUNK}-blosc-lz4-bitshuffle-v3.zarr"
    if [[ ! -d $STORE || ! -e $STORE.json ]]; then
        log "writing $STORE with zarr-python"
        rm -rf "$STORE"
        bench-venv/bin/python benches/reference_zarr.py write --store "$STORE" --format 3 \
            --rows "$ZARR_ROWS" --cols 5000 --row-chunk "$ZARR_CHUNK" >"$STORE.json.tmp"
        mv "$STORE.json.tmp" "$STORE.json"
    fi
    cp "$STORE.json" "$OUT/zarr-store.json"
    cat "$STORE"/c/*/* >/dev/null 2>&1 || true # into the page cache: decoding, not the disk
    rw rw-zarr 3 "${MPIRUN[@]}" "$RW" rsvd --zarr "$STORE" -k 10 --power-iters 0
    peer heat-zarr "${MPIRUN[@]}" "$PY" "${REF[@]}" heat-rsvd --zarr "$STORE" -k 10 \
        --power-iters 0 --reps 3

    rw rw-reduce 5 "$RW" reduce --rows "$RED_N" --cols "$RED_N" --chunk-rows "$RED_CHUNK" \
        --chunk-cols "$RED_CHUNK" --dist uniform --step 2 --add 1
    peer cubed-reduce "$PY" "${REF[@]}" cubed-reduce --n "$RED_N" --chunk "$RED_CHUNK" \
        --workers "$CPUS" --work-dir target/bench-data/cubed-work --reps 3
fi

python3 - "$OUT" "$RESULTS" "$QUICK" <<'EOF'
import json, sys
from pathlib import Path
out, results, quick = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
sys.dont_write_bytecode = True
sys.path.insert(0, "benches")
from report import machine, para, replace_section  # noqa: E402
from summary import captured_residual, failure, load, peers_result, rankwise_total  # noqa: E402

mach = machine()
cpu = "; ".join(v for v in (mach["cpu"], mach["cores"], mach["caches"], f"{mach['memory']} memory",
                            mach["virt"], mach["kernel"]) if v)
gib = lambda b: f"{b / 2**30:.2f} GiB"


def t(r):
    if r is None:
        return None
    return f"{r['median']:.2f} s ({r['min']:.2f}–{r['max']:.2f})"


def line(workload, name, what, r, why, acc, extra=""):
    cell = t(r) or why
    return f"| {workload} | {what} | {cell} | {gib(r['peak_rss_bytes']) if r else '—'} | {acc if r else '—'} | {extra} |"


def rw(name):
    return rankwise_total(out, f"{name}.*.json")


def pr(name):
    return peers_result(out, name)


def rw_acc(r):
    rep = r["report"] if r else {}
    if rep.get("command") == "svd":
        c = (load(out / "rw-svd-check.1.json") or {}).get("check") or {}
        return f"residual {c['relative_residual']:.1e}" if "relative_residual" in c else "—"
    if rep.get("command") == "reduce":
        return f"sum {rep['sum']:.6g} (z = {rep['z_score']:+.2f})"
    x = captured_residual(rep)
    return "—" if x is None else f"residual {x:.4f}"


def peer_acc(p):
    if p is None:
        return "—"
    if "z" in p:
        return f"sum {p['sum']:.6g} (z = {p['z']:+.2f})"
    if "generate_seconds" in p and "svd_seconds" in p or "chunk_rows" in p:
        return f"residual {p['relative_residual']:.1e}"
    return f"residual {p['relative_residual']:.4f}"


def split(p):
    if p is None:
        return ""
    for a, b in (("generate_seconds", "svd_seconds"), ("generate_seconds", "rsvd_seconds"),
                 ("read_seconds", "rsvd_seconds")):
        if a in p and b in p:
            return (f"{a.split('_')[0]} {p[a]['median']:.2f} s + {b.split('_')[0]} "
                    f"{p[b]['median']:.2f} s")
    return ""


def rw_split(r):
    if r is None:
        return ""
    ranks = r["report"].get("ranks", 1)
    return f"{ranks} rank{'s' if ranks > 1 else ''}"


svd_shape = (load(out / "rw-svd-1.1.json") or {}).get("shape") or ["?", 20]
rsvd_shape = (load(out / "rw-rsvd-q0.1.json") or {}).get("shape") or ["?", "?"]
store = load(out / "zarr-store.json") or {}
red = (load(out / "rw-reduce.1.json") or {}).get("shape") or ["?", "?"]

rows = []
for workload, pairs in [
    (f"exact SVD, {svd_shape[0]:,} × {svd_shape[1]} (TSQR)", [
        ("heat-svd", "Heat `ht.linalg.svd`, 2 ranks"),
        ("rw-svd-mpi", "`mpirun -np 2 rankwise svd`"),
        ("cubed-svd", "Cubed `xp.linalg.svd`, threads executor"),
        ("rw-svd-1", "`rankwise svd`, 1 process"),
    ]),
    (f"`rsvd -k 10`, q = 0, {rsvd_shape[0]:,} × {rsvd_shape[1]:,}", [
        ("heat-rsvd-q0", "Heat `ht.linalg.rsvd`, 2 ranks"),
        ("rw-rsvd-q0", "`mpirun -np 2 rankwise rsvd`"),
    ]),
    (f"`rsvd -k 10`, q = 2, {rsvd_shape[0]:,} × {rsvd_shape[1]:,}", [
        ("heat-rsvd-q2", "Heat `ht.linalg.rsvd`, 2 ranks"),
        ("rw-rsvd-q2", "`mpirun -np 2 rankwise rsvd`"),
    ]),
    (f"`rsvd -k 10`, q = 0, Zarr store {store.get('shape', ['?'])[0]:,} × "
     f"{store.get('shape', [0, '?'])[1]:,} float32", [
        ("heat-zarr", "Heat `ht.load_zarr` + `ht.linalg.rsvd`, 2 ranks"),
        ("rw-zarr", "`mpirun -np 2 rankwise rsvd --zarr`"),
    ]),
    (f"`(x + 1)[::2, ::2].sum()`, uniform, {red[0]:,} × {red[1]:,}", [
        ("cubed-reduce", "Cubed, threads executor"),
        ("rw-reduce", "`rankwise reduce --dist uniform`, 1 process"),
    ]),
]:
    for name, what in pairs:
        if name.startswith("rw-"):
            r = rw(name)
            rows.append(line(workload, name, what, r, failure(out, name), rw_acc(r), rw_split(r)))
        else:
            p = pr(name)
            rows.append(line(workload, name, what, p, failure(out, name), peer_acc(p), split(p)))

heat = pr("heat-svd") or pr("heat-rsvd-q0") or {}
cub = pr("cubed-svd") or pr("cubed-reduce") or {}
version = (out / "rankwise-version.txt").read_text().strip() if (out / "rankwise-version.txt").exists() else "rankwise"
if (out / "git.txt").exists():
    version += f" (working tree at git {(out / 'git.txt').read_text().strip()} when the run started)"
text = "\n\n".join([
    "## Heat and Cubed: the MPI peer and the bounded-memory peer",
    para(f"Run of `bash benches/peers.sh{' --quick' if quick else ''}` on {cpu}; raw results in "
         f"`{out}`. {version}; Heat {heat.get('heat', '?')} on torch {heat.get('torch', '?')} and "
         f"{heat.get('mpi', 'Open MPI').split(',')[0]} (mpi4py {heat.get('mpi4py', '')}), one torch thread per rank; Cubed "
         f"{cub.get('cubed', '?')}, its `threads` executor with {cub.get('executor', '?').split(', ')[-1]}, "
         f"allowed_mem {cub.get('allowed_mem', '?')}. Median (min–max) of 5 runs for rankwise's "
         "exact SVD and reduce, 3 otherwise; times from inside each job (launch and imports "
         "excluded, the same for every tool); peak RSS of every process of the job, added up."),
    "| workload | tool | time | peak RSS (all ranks) | accuracy | notes |\n|---|---|---|---|---|---|\n"
    + "\n".join(rows),
    "\n".join(para(x, prefix="- ", indent="  ") for x in [
        "Heat keeps the matrix in memory, split by rows across the ranks: its time is the whole "
        "job (generating or reading it, then the decomposition), split in the notes column. "
        "rankwise generates or decodes each panel inside its passes and keeps none (its "
        "`rsvd` at q = 0 is one pass: A·Ω and Yᵀ·A fused), so for it there is no separate "
        "load time. Heat's `rsvd` makes 2q + 2 passes over the resident matrix.",
        "Accuracy: ‖A − UΣVᵀ‖_F/‖A‖_F for the exact SVDs (rankwise's from one more, untimed "
        "run with `--check` on 2 ranks), (‖A‖_F² − Σσ²)^½/‖A‖_F from each tool's own ‖A‖_F "
        "and σ for the randomized ones, and for reduce the sum with z, its distance from "
        "count × 1.5 in standard deviations (the tools draw different random numbers).",
        "Each Heat process imports PyTorch's CUDA build from PyPI (about 0.9 GiB resident "
        "before any data); that is part of the footprint a user of Heat gets.",
        "Heat's `load_zarr` (1.8) reads a single array as `arr[slices][local_slices]`: every "
        "rank decodes the whole store, then keeps its rows, hence its read time and memory. "
        "rankwise's ranks decode only the chunks of their own panels.",
    ]),
])
print(text)
replace_section(results, "peers", text + "\n")
EOF
