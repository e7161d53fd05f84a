#!/usr/bin/env bash
# Zarr input: rankwise against Dask + zarr-python on the same stores, in one run on this
# machine. How fast each decodes a real zarr-python store, and the randomized SVD on it.
#
#   bash benches/zarr.sh [--quick]
#
# The stores: a 200,000 × 5,000 float32 array (4 GB decoded), chunks 20,000 × 5,000, Blosc
# lz4 + bitshuffle, uniform values, written by zarr-python (benches/reference_zarr.py write),
# once as zarr_format 3 and once as zarr_format 2. They are kept in target/bench-data/ and
# reused by later runs. Workloads, on each store:
#   read     rankwise `read --zarr S --json` (decodes every chunk once) against Dask
#            `da.from_zarr(S).sum(dtype=float64)`; the sums are the accuracy column.
#   rsvd q0  rankwise `rsvd --zarr S -k 10 --power-iters 0 --json` against Dask
#            `da.linalg.svd_compressed(x, k=10)` (its default n_power_iter=0).
#   rsvd q2  the same with 2 power iterations (format 3 only).
# rankwise: median of 3 runs, the report's own time and peak RSS. Dask: 3 repetitions of
# each, in one process per workload (benches/reference_zarr.py), OpenBLAS one thread per
# Dask worker, as many workers as CPUs. Both read the stores through the page
# cache (the first run of each warms it), so the figures are decoding, not the disk.
#
# --quick divides the rows and the chunk rows by 100 (a smoke run: 2,000 × 5,000).
# Rewrites the section between `<!-- BEGIN zarr -->` and `<!-- END zarr -->` of
# benches/RESULTS.md; raw JSON, stderr and the commands stay in target/bench-results/zarr-*/.
# A run that fails is recorded as failed (exit status, and "killed" for 137) in the table,
# never dropped. ZARR_OUT=DIR resumes an earlier run: results present there are not rerun.
#
# Environment: RANKWISE_BIN (default target/release/rankwise), BENCH_RESULTS (default
# benches/RESULTS.md), PYTHON (to create ./bench-venv, default python3).
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
            sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "zarr.sh: unknown argument $arg" >&2
            exit 2
            ;;
    esac
done

log() {
    printf '[zarr bench %s] %s\n' "$(date +%T)" "$*" >&2
}

PYTHON="${PYTHON:-python3}" bash tools/bench-venv.sh
PY=bench-venv/bin/python
export PYTHONDONTWRITEBYTECODE=1
if [[ ! -x "$BIN" ]]; then
    make --no-print-directory build
fi

SCALE=1
((QUICK)) && SCALE=100
ROWS=$((200000 / SCALE))
COLS=5000
CHUNK=$((20000 / SCALE))
WORKERS=$(nproc)
REPS=3
OUT="${ZARR_OUT:-target/bench-results/zarr-$(date -u +%Y%m%dT%H%M%SZ)}"
DATA=target/bench-data
mkdir -p "$OUT" "$DATA"
touch "$OUT/commands.txt"
cp -p "$BIN" "$OUT/rankwise" # a rebuild during the run cannot swap the binary
RW="$OUT/rankwise"
"$PY" -m pip freeze --disable-pip-version-check >"$OUT/pip-freeze.txt"
git describe --always --dirty >"$OUT/git.txt" 2>/dev/null || echo unknown >"$OUT/git.txt"

# Runs and records a command (stdout and stderr are the caller's).
run() {
    printf '%s\n' "$(printf '%q ' "$@")" >>"$OUT/commands.txt"
    "$@"
}

store() { # zarr_format → path of the store (written once; the writer's report beside it)
    local s="$DATA/zarr-f32-${ROWS}x${COLS}-c${CHUNK}-blosc-lz4-bitshuffle-v$1.zarr"
    if [[ ! -d $s || ! -e $s.json ]]; then
        log "writing $s with zarr-python"
        rm -rf "$s"
        run "$PY" benches/reference_zarr.py write --store "$s" --format "$1" --rows "$ROWS" \
            --cols "$COLS" --row-chunk "$CHUNK" >"$s.json.tmp"
        mv "$s.json.tmp" "$s.json"
    fi
    cp "$s.json" "$OUT/write-v$1.json"
    printf '%s\n' "$s"
}

failed() { # name, exit status → records the failure
    echo "exit status $2$( (($2 == 137)) && echo ' (killed: out of memory?)')" >"$OUT/$1.failed"
    log "$1 failed with status $2"
}

rw() { # name, then rankwise arguments
    local name=$1 rc=0
    shift
    [[ -e "$OUT/$name.$REPS.json" || -e "$OUT/$name.failed" ]] && return 0
    for i in $(seq 1 "$REPS"); do
        run "$RW" "$@" --json >"$OUT/$name.$i.json" 2>>"$OUT/$name.stderr" || rc=$?
        if ((rc != 0)); then
            rm -f "$OUT/$name.$i.json"
            failed "$name" "$rc"
            return 0
        fi
    done
    log "rankwise $name done"
}

dask() { # name, then reference_zarr.py arguments
    local name=$1 rc=0
    shift
    [[ -e "$OUT/$name.json" || -e "$OUT/$name.failed" ]] && return 0
    run "$PY" benches/reference_zarr.py "$@" --out "$OUT/$name.json" 2>>"$OUT/$name.stderr" || rc=$?
    if ((rc != 0)); then
        rm -f "$OUT/$name.json"
        failed "$name" "$rc"
        return 0
    fi
    log "dask $name done"
}

for v in 3 2; do
    S=$(store "$v")
    rw "rw-read-v$v" read --zarr "$S"
    dask "dask-read-v$v" read --store "$S" --reps "$REPS" --workers "$WORKERS" --blas-threads 1
    rw "rw-rsvd-q0-v$v" rsvd --zarr "$S" -k 10 --power-iters 0 --machine-limit
    dask "dask-svd-q0-v$v" svd --store "$S" -k 10 --power-iters 0 --reps "$REPS" --workers "$WORKERS" \
        --blas-threads 1
done
S=$(store 3)
rw rw-rsvd-q2-v3 rsvd --zarr "$S" -k 10 --power-iters 2
dask dask-svd-q2-v3 svd --store "$S" -k 10 --power-iters 2 --reps "$REPS" --workers "$WORKERS" \
    --blas-threads 1

"$PY" - "$OUT" "$RESULTS" "$QUICK" "$ROWS" "$COLS" "$CHUNK" "$WORKERS" <<'EOF'
import glob, json, os, re, statistics, subprocess, sys
out, results, quick = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
rows, cols, chunk, workers = map(int, sys.argv[4:8])
decoded = rows * cols * 4

def failure(name):
    f = f"{out}/{name}.failed"
    return open(f).read().strip() if os.path.exists(f) else "not run"

def rw(name):
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{name}.[0-9]*.json"))]
    if not runs:
        return {"failed": failure(name)}
    t = [r["seconds"] for r in runs]
    rss = max(max(x.get("peak_rss_bytes") or 0 for x in r.get("per_rank", [{}])) for r in runs)
    return {"report": runs[0], "median": statistics.median(t), "min": min(t), "max": max(t),
            "peak_rss_bytes": rss}

def dk(name):
    try:
        return json.load(open(f"{out}/{name}.json"))
    except FileNotFoundError:
        return {"failed": failure(name)}

gib = lambda b: f"{b / 2**30:.2f} GiB" if b else "—"
def rate(r):
    if "failed" in r:
        return "—", "—"
    g = decoded / r["median"] / 1e9
    return f"{g:.2f}", f"{g / workers:.2f}"
def secs(r):
    if "failed" in r:
        return r["failed"]
    spread = f" ({r['min']:.2f}–{r['max']:.2f})" if r["max"] > r["min"] else ""
    return f"{r['median']:.2f} s{spread}"
def ratio(d, r):
    return f"{d['median'] / r['median']:.1f}×" if "failed" not in d and "failed" not in r else "—"

def read_acc(r):
    if "failed" in r:
        return "—"
    rep = r.get("report", r)
    s = rep.get("sum")
    return f"sum {s:.10g}" if s is not None else "no sum reported"

def svd_acc(r):
    if "failed" in r:
        return "—"
    rep = r.get("report", r)
    sv = rep.get("singular_values") or rep.get("s") or []
    est = (rep.get("error_estimate") or {}).get("relative_frobenius")
    res = rep.get("relative_residual", est)
    parts = []
    if sv:
        parts.append(f"σ₁ {sv[0]:.6g}, σ₁₀ {sv[-1]:.6g}")
    if res is not None:
        parts.append(f"rel. residual {res:.4f}")
    return "; ".join(parts) or "—"

cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                     capture_output=True, text=True).stdout.strip()
w3 = json.load(open(f"{out}/write-v3.json"))
lines = ["## Zarr input (float32, Blosc lz4 + bitshuffle, written by zarr-python)\n"]
lines.append(
    f"Run of `bash benches/zarr.sh{' --quick' if quick else ''}` on {cpu}, {os.cpu_count()} CPUs, "
    f"raw results in `{out}`. Store: {rows:,} × {cols:,} float32 ({decoded / 1e9:.2f} GB decoded), "
    f"chunks {chunk:,} × {cols:,}, zarr-python {w3.get('zarr', '')} (`benches/reference_zarr.py write`). "
    f"rankwise: median of 3 runs (min–max), the report's time and peak RSS. Dask with "
    f"zarr-python: threaded scheduler, {workers} workers, OPENBLAS_NUM_THREADS=1; median of 3 "
    f"repetitions (min–max). Decoded GB/s = decoded bytes / median time; per "
    f"core = divided by the {workers} CPUs both use. Ratio = Dask time / rankwise time.\n")
lines.append("| workload | format | Dask time | rankwise time | ratio | Dask GB/s (per core) | rankwise GB/s (per core) | Dask peak RSS | rankwise peak RSS | Dask accuracy | rankwise accuracy |")
lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
def row(label, v, dname, rname, acc):
    d, r = dk(dname), rw(rname)
    dg, dgc = rate(d)
    rg, rgc = rate(r)
    lines.append(f"| {label} | v{v} | {secs(d)} | {secs(r)} | {ratio(d, r)} | {dg} ({dgc}) | {rg} ({rgc}) | "
                 f"{gib(d.get('peak_rss_bytes'))} | {gib(r.get('peak_rss_bytes'))} | {acc(d)} | {acc(r)} |")
for v in (3, 2):
    row("read every chunk", v, f"dask-read-v{v}", f"rw-read-v{v}", read_acc)
    row("rsvd k = 10, q = 0", v, f"dask-svd-q0-v{v}", f"rw-rsvd-q0-v{v}", svd_acc)
row("rsvd k = 10, q = 2", 3, "dask-svd-q2-v3", "rw-rsvd-q2-v3", svd_acc)
lines.append("")
lines.append(f"- The sum of the values written (computed by the writer in float64, chunk by chunk) is "
             f"{w3['sum']:.10g}; stored {w3['stored_bytes'] / 1e9:.2f} GB for {decoded / 1e9:.2f} GB of values "
             f"(v3), written in {w3['seconds']:.1f} s.")
lines.append("- Both compute in float32 on float32 data: Dask's `svd_compressed` keeps the array's dtype, "
             "rankwise's default `--precision auto` multiplies f32 tiles (sums in f64). rankwise reads "
             "each band in 16 MiB segments (`--read-segment`); with `--power-iters 0` it reads the store "
             "once (B formed in the same pass: the fused last pass, see the rsvd section of docs/cli.md), "
             "with 2 it keeps the decoded float32 panels (5 passes).")
lines.append("- Dask's accuracy is the exact relative residual (‖A‖_F² − Σσ²)^½/‖A‖_F; rankwise's is its "
             "probe estimate of the same quantity.")
text = "\n".join(lines) + "\n"
print(text)
body = open(results).read()
begin, end = "<!-- BEGIN zarr -->", "<!-- END zarr -->"
section = f"{begin}\n{text}{end}"
if begin in body:
    body = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: section, body, flags=re.S)
else:
    body = body.rstrip("\n") + "\n\n" + section + "\n"
open(results, "w").write(body)
EOF
rm -f "$RW"
