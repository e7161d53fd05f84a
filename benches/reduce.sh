#!/usr/bin/env bash
# A chunked elementwise map + strided reduction, and the cost per task: rankwise against
# Dask in one run on this machine, with the machine's memory bandwidth measured in the same
# run.
#
#   bash benches/reduce.sh [--quick]      (make bench runs it after benches/zarr.sh)
#
# Workloads (full run; --quick in brackets):
#   reduce  (x + 1)[::2, ::2].sum() of a generated standard normal 50,000 × 50,000 float64
#           matrix [10,000 × 10,000], chunks 10,000 × 10,000 [2,000 × 2,000]: rankwise
#           `reduce --dist normal` (median of 5 runs, plus one --check run for the rounding
#           error) against Dask `(x + 1)[::2, ::2].sum()` of
#           `da.random.default_rng(0).standard_normal(...)` (median of 3 repetitions).
#   tasks   1,000,000 [100,000] no-op tasks, one per chunk: rankwise `tasks` (median of 5
#           runs in one process) against Dask's threaded scheduler running a graph of
#           no-op tasks, as Dask's documentation measures its scheduler overhead (one
#           repetition in the full run, it takes over a minute; 3 in --quick).
#   tasks, array form: 100,000 [10,000] chunks of `da.ones(N, chunks=1).map_blocks(noop)`
#           persisted (graph construction included) against rankwise `tasks` at the same N
#           (3 repetitions each).
# Both sides use every CPU: Dask's threaded scheduler with as many workers as CPUs,
# rankwise's default actors (one per NUMA domain, a thread per core). Peak RSS: rankwise's
# report (VmHWM), Dask's process ru_maxrss.
#
# Rewrites the section between `<!-- BEGIN reduce -->` and `<!-- END reduce -->` of
# benches/RESULTS.md; raw JSON, stderr, load averages and the commands stay in
# target/bench-results/reduce-*/. A run that fails is recorded as failed (exit status) in
# the table, never dropped. REDUCE_OUT=DIR resumes an earlier run: results present there
# are not rerun.
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
            sed -n '2,34p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "reduce.sh: unknown argument $arg" >&2
            exit 2
            ;;
    esac
done

log() {
    printf '[reduce bench %s] %s\n' "$(date +%T)" "$*" >&2
}

PYTHON="${PYTHON:-python3}" bash tools/bench-venv.sh
PY=bench-venv/bin/python
export PYTHONDONTWRITEBYTECODE=1
if [[ ! -x "$BIN" ]]; then
    make --no-print-directory build
fi

WORKERS=$(nproc)
if ((QUICK)); then
    N=10000
    CHUNK=2000
    TASKS=100000
    ARRAY_TASKS=10000
    TASKS_DASK_REPS=3
    MEMBW_MIB=256
    MEMBW_REPS=5
else
    N=50000
    CHUNK=10000
    TASKS=1000000
    ARRAY_TASKS=100000
    TASKS_DASK_REPS=1
    MEMBW_MIB=1024
    MEMBW_REPS=10
fi
RW_REPS=5
DASK_REPS=3
OUT="${REDUCE_OUT:-target/bench-results/reduce-$(date -u +%Y%m%dT%H%M%SZ)}"
TOOLS=target/bench-tools
mkdir -p "$OUT" "$TOOLS"
touch "$OUT/commands.txt" "$OUT/load.txt"
cp -p "$BIN" "$OUT/rankwise" # a rebuild during the run cannot swap the binary
RW="$OUT/rankwise"
"$PY" -m pip freeze --disable-pip-version-check >"$OUT/pip-freeze.txt"
git describe --always --dirty >"$OUT/git.txt" 2>/dev/null || echo unknown >"$OUT/git.txt"
printf '%s\n' "$QUICK" >"$OUT/quick.txt"

# Runs and records a command (stdout and stderr are the caller's).
run() {
    printf '%s\n' "$(printf '%q ' "$@")" >>"$OUT/commands.txt"
    "$@"
}

# Notes the 1/5/15-minute load averages at the start of a stage.
load_mark() {
    local l1 l5 l15 rest
    read -r l1 l5 l15 rest </proc/loadavg
    printf '%s %s %s %s\n' "$1" "$l1" "$l5" "$l15" >>"$OUT/load.txt"
    log "$1 (load average $l1 $l5 $l15)"
}

failed() { # name, exit status → records the failure
    echo "exit status $2$( (($2 == 137)) && echo ' (killed: out of memory?)')" >"$OUT/$1.failed"
    log "$1 failed with status $2"
}

rw() { # name, repetitions, then rankwise arguments
    local name=$1 reps=$2 rc=0
    shift 2
    [[ -e "$OUT/$name.$reps.json" || -e "$OUT/$name.failed" ]] && return 0
    load_mark "rankwise $name"
    for i in $(seq 1 "$reps"); do
        run "$RW" "$@" --json >"$OUT/$name.$i.json" 2>>"$OUT/$name.stderr" || rc=$?
        if ((rc != 0)); then
            rm -f "$OUT/$name.$i.json"
            failed "$name" "$rc"
            return 0
        fi
    done
}

dask() { # name, then reference_reduce.py arguments
    local name=$1 rc=0
    shift
    [[ -e "$OUT/$name.json" || -e "$OUT/$name.failed" ]] && return 0
    load_mark "dask $name"
    run "$PY" benches/reference_reduce.py "$@" --out "$OUT/$name.json" 2>>"$OUT/$name.stderr" || rc=$?
    if ((rc != 0)); then
        rm -f "$OUT/$name.json"
        failed "$name" "$rc"
    fi
}

# The machine's memory bandwidth, in the same run (the probe of benches/run.sh).
if [[ ! -e "$OUT/membw.txt" ]]; then
    cc -O2 -fopenmp tools/membw.c -o "$TOOLS/membw"
    load_mark "memory bandwidth"
    run env OMP_NUM_THREADS="$WORKERS" "$TOOLS/membw" "$MEMBW_MIB" "$MEMBW_REPS" \
        >"$OUT/membw.txt" 2>>"$OUT/membw.stderr"
fi

REDUCE=(reduce --rows "$N" --cols "$N" --chunk-rows "$CHUNK" --chunk-cols "$CHUNK" --dist normal
    --step 2 --add 1)
rw rw-reduce "$RW_REPS" "${REDUCE[@]}"
rw rw-reduce-check 1 "${REDUCE[@]}" --check
dask dask-reduce reduce --n "$N" --chunk "$CHUNK" --step 2 --add 1 --reps "$DASK_REPS" \
    --workers "$WORKERS"

rw rw-tasks 1 tasks --tasks "$TASKS" --repeat "$RW_REPS"
dask dask-tasks tasks --tasks "$TASKS" --form graph --reps "$TASKS_DASK_REPS" --workers "$WORKERS"
rw rw-tasks-array 1 tasks --tasks "$ARRAY_TASKS" --repeat "$RW_REPS"
dask dask-tasks-array tasks --tasks "$ARRAY_TASKS" --form array --reps 3 --workers "$WORKERS"
load_mark "end"

"$PY" - "$OUT" "$RESULTS" <<'EOF'
import glob, json, os, re, statistics, subprocess, sys
out, results = sys.argv[1], sys.argv[2]
quick = open(f"{out}/quick.txt").read().strip() == "1"

def failure(name):
    f = f"{out}/{name}.failed"
    return open(f).read().strip() if os.path.exists(f) else "not run"

def rw(name):
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{name}.[0-9]*.json"))]
    if not runs:
        return {"failed": failure(name)}
    if runs[0]["command"] == "tasks":  # one process, --repeat runs
        t = runs[0]["run_seconds"]
    else:
        t = [r["seconds"] for r in runs]
    rss = max(max(x.get("peak_rss_bytes") or 0 for x in r["per_rank"]) for r in runs)
    return {"report": runs[0], "median": statistics.median(t), "min": min(t), "max": max(t),
            "runs": len(t), "peak_rss_bytes": rss}

def dk(name):
    try:
        return json.load(open(f"{out}/{name}.json"))
    except FileNotFoundError:
        return {"failed": failure(name)}

membw = {}
if os.path.exists(f"{out}/membw.txt"):
    for line in open(f"{out}/membw.txt"):
        k, _, v = line.strip().partition("=")
        membw[k] = v
copy_bw = float(membw["copy_gbs"]) if "copy_gbs" in membw else None

gib = lambda b: f"{b / 2**30:.2f} GiB" if b else "—"
def secs(r):
    if "failed" in r:
        return r["failed"]
    n = r.get("runs", len(r.get("times", [])))
    # Milliseconds below a tenth of a second, where two decimals of a second say nothing.
    unit, scale = ("ms", 1e3) if r["median"] < 0.1 else ("s", 1.0)
    fmt = lambda x: f"{x * scale:.3g}" if unit == "ms" else f"{x:.2f}"
    spread = f" ({fmt(r['min'])}–{fmt(r['max'])})" if r["max"] > r["min"] else ""
    return f"{fmt(r['median'])} {unit}{spread}, {n} run{'s' if n != 1 else ''}"
def ratio(d, r):
    return f"{d['median'] / r['median']:.1f}×" if "failed" not in d and "failed" not in r else "—"

cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                     capture_output=True, text=True).stdout.strip()
loads = [l.rsplit(" ", 3) for l in open(f"{out}/load.txt").read().splitlines()]
load_text = "; ".join(f"{s}: {a} / {b} / {c}" for s, a, b, c in loads)

d, r, chk = dk("dask-reduce"), rw("rw-reduce"), rw("rw-reduce-check")
dt, rt = dk("dask-tasks"), rw("rw-tasks")
da_, ra = dk("dask-tasks-array"), rw("rw-tasks-array")
rep = r.get("report", {})
n = rep.get("shape", [d.get("shape", ["?"])[0]])[0]
chunk = rep.get("chunk_rows", (d.get("chunks") or ["?"])[0])

lines = ["## Chunked elementwise map + strided sum, and the cost per task\n"]
lines.append(
    f"Run of `bash benches/reduce.sh{' --quick' if quick else ''}` on {cpu}, {os.cpu_count()} CPUs, "
    f"raw results in `{out}`. Dask {d.get('dask', dt.get('dask', '?'))} threaded scheduler with "
    f"{os.cpu_count()} workers; rankwise one process, default actors. Times are medians "
    f"(min–max) of the runs counted; ratio = Dask time / rankwise time (> 1: rankwise is faster). "
    f"Memory bandwidth measured in the same run (`tools/membw.c`, {membw.get('threads', '?')} threads): "
    f"copy {membw.get('copy_gbs', '?')} GB/s, read {membw.get('read_gbs', '?')} GB/s, triad "
    f"{membw.get('triad_gbs', '?')} GB/s. Load averages (1 / 5 / 15 min) at the start of each stage: "
    f"{load_text}.\n")
lines.append("| workload | size | Dask | Dask time | rankwise time | ratio | Dask peak RSS | rankwise peak RSS | Dask accuracy | rankwise accuracy | rankwise rate | of copy bandwidth |")
lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")

def z(x):
    return f"sum {x['sum']:.10g}, z = {x['z_score']:+.2f}" if "sum" in x and x.get("z_score") is not None else "—"
if "failed" not in r:
    rate = f"{r['report']['values_bytes'] / r['median'] / 1e9:.2f} GB/s of values summed ({r['report']['matrix_bytes'] / r['median'] / 1e9:.1f} GB/s of the matrix)"
    frac = f"{r['report']['values_bytes'] / r['median'] / 1e9 / copy_bw:.1%}" if copy_bw else "—"
    racc = z(r["report"])
    if "failed" not in chk and chk["report"].get("check"):
        racc += f"; rel. rounding error {chk['report']['check']['relative_difference']:.1e}"
else:
    rate, frac, racc = "—", "—", "—"
lines.append(
    f"| `(x + 1)[::2, ::2].sum()`, standard normal float64 | {n:,} × {n:,}, chunks {chunk:,} × {chunk:,} | "
    f"`da.random.default_rng(0).standard_normal` | {secs(d)} | {secs(r)} | {ratio(d, r)} | "
    f"{gib(d.get('peak_rss_bytes'))} | {gib(r.get('peak_rss_bytes'))} | {z(d) if 'failed' not in d else '—'} | "
    f"{racc} | {rate} | {frac} |")

def task_row(label, dd, rr, form):
    ntasks = rr["report"]["tasks"] if "failed" not in rr else dd.get("tasks", "?")
    dacc = f"{dd['tasks']:,} results" if "failed" not in dd else "—"
    racc = f"{sum(rr['report']['tasks_run']) // len(rr['report']['tasks_run']):,} tasks run per run" if "failed" not in rr else "—"
    rrate = (f"{ntasks / rr['median'] / 1e6:.2f} M tasks/s, {rr['median'] / ntasks * 1e6:.3f} µs per task"
             if "failed" not in rr else "—")
    drate = f" (Dask {dd['microseconds_per_task']:.1f} µs per task)" if "failed" not in dd else ""
    size = f"{ntasks:,} tasks" if isinstance(ntasks, int) else f"{ntasks} tasks"
    lines.append(f"| {label} | {size} | {form} | {secs(dd)} | {secs(rr)} | {ratio(dd, rr)} | "
                 f"{gib(dd.get('peak_rss_bytes'))} | {gib(rr.get('peak_rss_bytes'))} | {dacc} | {racc} | "
                 f"{rrate}{drate} | — |")
task_row("no-op task per chunk (scheduling overhead)", dt, rt, "`dask.threaded.get` of a graph of no-op tasks")
task_row("no-op task per chunk, array form", da_, ra, "`da.ones(N, chunks=1).map_blocks(noop)`, persisted")
lines.append("")
lines.append("- The sums are of different draws of the same distribution (rankwise's counter-based "
             "generator, NumPy's PCG64 through Dask), so they agree statistically: z is the sum's "
             "distance from its expectation (count × 1) in standard deviations (√count). rankwise's "
             "rounding error is its plain sum against the compensated (Neumaier) sum of the same "
             "values, from one `--check` run.")
lines.append("- Dask generates every value of each chunk and then slices; rankwise generates only "
             "the rows and columns the stride selects (a quarter of the values), which is most of "
             "the difference. Its rate counts the values summed, 8 bytes each; they are produced and "
             "summed in cache, so the copy bandwidth is a reference, not its bound (the normal "
             "generator is).")
lines.append("- rankwise's times are its reports' (the command after process start-up); Dask's "
             "include building the graph, except where said below.")
lines.append("- Tasks: rankwise's time is `Runtime::map` handing out one closure per chunk to the "
             "actors' threads and collecting every result (job lists built before the clock starts); "
             "Dask's is `dask.threaded.get` of a prebuilt graph (its build time is apart: "
             + (", ".join(f"{x:.2f} s" for x in dt.get("build_seconds", [])) or "—")
             + "), and for the array form the whole `persist`, graph construction included.")
text = "\n".join(lines) + "\n"
print(text)
body = open(results).read()
begin, end = "<!-- BEGIN reduce -->", "<!-- END reduce -->"
section = f"{begin}\n{text}{end}"
if begin in body:
    body = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: section, body, flags=re.S)
else:
    body = body.rstrip("\n") + "\n\n" + section + "\n"
open(results, "w").write(body)
EOF
rm -f "$RW"
log "raw results in $OUT; table in $RESULTS"
