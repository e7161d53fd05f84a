#!/usr/bin/env bash
# Slurm: how long a small rankwise job takes from `sbatch` to its results, on the one-node
# Slurm of slurm/local-cluster.sh, and what launching the same run costs under `srun` and
# under `mpirun`.
#
#   bash benches/slurm.sh [--quick]
#
# The run: `rankwise svd` of a generated 200,000 × 20 float64 matrix in 8 panels, 2 ranks,
# writing S, U and Vᵀ to an output group (32 MB; --quick: 50,000 rows and 3 repetitions
# instead of 9). Each repetition, in turn:
#   embedded        rankwise in one process, no launcher
#   mpirun          mpirun -np 2 rankwise …
#   srun            srun -n 2 rankwise … from the shell: a new allocation and one step
#   srun in a job   srun --jobid=J -n 2 rankwise …: a step of an allocation made beforehand
#                   (salloc --no-shell), as srun runs inside a batch script
#   sbatch          sbatch slurm/cpu.sbatch (2 ranks, RANKWISE_INFO=0) until its output
#                   group exists ("results", tested every 10 ms), and until scontrol says
#                   COMPLETED (polled every 20 ms from then on)
# Wall times are taken around each command; "own" is the time rankwise reports for itself
# (its JSON report's `seconds`, rank 0), so wall − own is what the launcher adds. Medians,
# with min–max.
#
# Rewrites the section between `<!-- BEGIN slurm -->` and `<!-- END slurm -->` of
# benches/RESULTS.md; the raw times (times.tsv), outputs and commands stay in
# target/bench-results/slurm-*/. The cluster runs from ${TMPDIR:-/tmp}/rankwise-slurm-bench
# on port 6837 and is torn down at the end, also on failure.
#
# Environment: RANKWISE_BIN (default target/release/rankwise), BENCH_RESULTS (default
# benches/RESULTS.md).
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
            echo "slurm.sh: unknown argument $arg" >&2
            exit 2
            ;;
    esac
done

log() {
    printf '[slurm bench %s] %s\n' "$(date +%T)" "$*" >&2
}

if [[ ! -x "$BIN" ]]; then
    make --no-print-directory build
fi
REPS=9
ROWS=200000
if ((QUICK)); then
    REPS=3
    ROWS=50000
fi
COLS=20
CHUNK=$((ROWS / 8))
RANKS=2
OUT="$ROOT/target/bench-results/slurm-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
cp -p "$BIN" "$OUT/rankwise" # a rebuild during the run cannot swap the binary
RW="$OUT/rankwise"
git describe --always --dirty >"$OUT/git.txt" 2>/dev/null || echo unknown >"$OUT/git.txt"
touch "$OUT/commands.txt"
printf 'what\trep\tstart\tend\town_s\n' >"$OUT/times.tsv"

# Slurm variables of an allocation this script may run in would point srun at that job.
for v in $(compgen -v SLURM_); do
    unset "$v"
done
export RANKWISE_SLURM_DIR="${TMPDIR:-/tmp}/rankwise-slurm-bench"
export RANKWISE_SLURM_PORT=6837
ALLOCATION=
cleanup() {
    if [[ -n "$ALLOCATION" ]]; then
        scancel "$ALLOCATION" 2>/dev/null || true
    fi
    slurm/local-cluster.sh down >>"$OUT/cluster.txt" 2>&1 || true
}
trap cleanup EXIT
log "cluster up"
slurm/local-cluster.sh up >>"$OUT/cluster.txt" 2>&1 || {
    cat "$OUT/cluster.txt" >&2
    exit 1
}
eval "$(slurm/local-cluster.sh env)"
# The same Open MPI settings under both launchers: ranks as root, shared memory only.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_base_warn_component_unused=0
export OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_mpi_yield_when_idle=1

ARGS=(svd --rows "$ROWS" --cols "$COLS" --chunk-rows "$CHUNK" --seed 1)

# The `seconds` of a rankwise JSON report.
# The run's own seconds from a printed report, or from a result group's (the `report`
# attribute of its zarr.json).
own_seconds() {
    python3 -c '
import json, os, sys
p = sys.argv[1]
r = json.load(open(os.path.join(p, "zarr.json")))["attributes"]["report"] if os.path.isdir(p) else json.load(open(p))
print(r["seconds"])' "$1"
}

# Runs rankwise (under a launcher or not), which writes its output group like the batch job
# and prints its JSON report, and records the wall and own times.
timed() { # what rep command...
    local what=$1 rep=$2 t0 t1
    shift 2
    printf '%s\n' "$(printf '%q ' "$@")" >>"$OUT/commands.txt"
    t0=$EPOCHREALTIME
    "$@" --json --out "$OUT/run.zarr" >"$OUT/last.json" 2>>"$OUT/stderr.txt"
    t1=$EPOCHREALTIME
    rm -rf "$OUT/run.zarr"
    printf '%s\t%s\t%s\t%s\t%s\n' "$what" "$rep" "$t0" "$t1" "$(own_seconds "$OUT/last.json")" >>"$OUT/times.tsv"
}

# sbatch slurm/cpu.sbatch, timed until its output group exists and until the job ends.
timed_sbatch() { # rep
    local rep=$1 t0 t_results='' t_end='' id state group="$OUT/sbatch-$1.zarr"
    t0=$EPOCHREALTIME
    id=$(RANKWISE_BIN=$RW RANKWISE_INFO=0 RANKWISE_OUT=$group RANKWISE_ROWS=$ROWS \
        RANKWISE_COLS=$COLS RANKWISE_CHUNK_ROWS=$CHUNK RANKWISE_SEED=1 \
        sbatch --parsable --chdir="$OUT" --output="$OUT/sbatch-%j.out" --nodes=1 \
        --ntasks-per-node="$RANKS" --oversubscribe slurm/cpu.sbatch)
    echo "sbatch slurm/cpu.sbatch (job $id)" >>"$OUT/commands.txt"
    # Until the results exist, only a file test every 10 ms (and the job's state every half
    # second): polling scontrol as often costs the controller and munge CPU time that the
    # job's ranks would miss on a small machine. Then the state every 20 ms.
    local polls=0
    while [[ -z "$t_end" ]]; do
        if [[ -z "$t_results" && -f "$group/zarr.json" ]]; then
            t_results=$EPOCHREALTIME
        fi
        if [[ -n "$t_results" ]] || ((polls % 50 == 0)); then
            state=$(scontrol show job --oneliner "$id" | grep -o 'JobState=[A-Z_]*' || true)
            case "$state" in
                JobState=COMPLETED) t_end=$EPOCHREALTIME ;;
                JobState=PENDING | JobState=CONFIGURING | JobState=RUNNING | JobState=COMPLETING) ;;
                *)
                    cat "$OUT/sbatch-$id.out" >&2
                    echo "slurm.sh: job $id ended with $state" >&2
                    exit 1
                    ;;
            esac
        fi
        if ((EPOCHSECONDS - ${t0%.*} > 120)); then
            echo "slurm.sh: job $id did not end in 120 s" >&2
            exit 1
        fi
        polls=$((polls + 1))
        if [[ -z "$t_results" ]]; then
            sleep 0.01
        else
            sleep 0.02
        fi
    done
    t_results=${t_results:-$t_end}
    local own
    own=$(own_seconds "$group")
    rm -rf "$group"
    printf 'sbatch results\t%s\t%s\t%s\t%s\n' "$rep" "$t0" "$t_results" "$own" >>"$OUT/times.tsv"
    printf 'sbatch end\t%s\t%s\t%s\t%s\n' "$rep" "$t0" "$t_end" "$own" >>"$OUT/times.tsv"
}

# salloc says "Granted job allocation J" on stderr.
ALLOCATION=$(salloc --no-shell -n "$RANKS" --oversubscribe 2>&1 |
    sed -n 's/.*Granted job allocation \([0-9]*\).*/\1/p')
[[ -n "$ALLOCATION" ]] || {
    echo "slurm.sh: salloc made no allocation" >&2
    exit 1
}
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$RANKS")
SRUN=(srun --mpi=pmix --cpu-bind=none --oversubscribe -n "$RANKS")

# A first run of each, not counted: page cache, Slurm's first step.
"$RW" "${ARGS[@]}" >/dev/null
"${MPIRUN[@]}" "$RW" "${ARGS[@]}" >/dev/null
"${SRUN[@]}" --jobid="$ALLOCATION" "$RW" "${ARGS[@]}" >/dev/null 2>&1

for rep in $(seq "$REPS"); do
    log "repetition $rep of $REPS"
    timed embedded "$rep" "$RW" "${ARGS[@]}"
    timed mpirun "$rep" "${MPIRUN[@]}" "$RW" "${ARGS[@]}"
    timed srun "$rep" "${SRUN[@]}" "$RW" "${ARGS[@]}"
    timed "srun in a job" "$rep" "${SRUN[@]}" --jobid="$ALLOCATION" "$RW" "${ARGS[@]}"
    timed_sbatch "$rep"
done

SLURM_VERSION=$(sinfo --version)
MPI_VERSION=$(mpirun --version | head -n 1)
CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)
MEM=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
python3 - "$OUT" "$RESULTS" "$QUICK" "$ROWS" "$COLS" "$CHUNK" "$RANKS" "$REPS" \
    "$SLURM_VERSION" "$MPI_VERSION" "$CPU" "$(nproc)" "$MEM" <<'EOF'
import csv, re, statistics, sys
out, results, quick, rows, cols, chunk, ranks, reps, slurm, mpi, cpu, ncpu, mem = sys.argv[1:]
rows, cols, chunk, ranks = int(rows), int(cols), int(chunk), int(ranks)
times = {}
with open(f"{out}/times.tsv") as f:
    for r in csv.DictReader(f, delimiter="\t"):
        wall = float(r["end"]) - float(r["start"])
        times.setdefault(r["what"], []).append((wall, float(r["own_s"])))

def spread(xs):
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f}–{max(xs):.2f})"

labels = [
    ("embedded", "embedded (one process, no launcher)"),
    ("mpirun", f"`mpirun -np {ranks}`"),
    ("srun", f"`srun -n {ranks}` from the shell (allocation + step)"),
    ("srun in a job", f"`srun -n {ranks}` in an allocation (a step, as in a batch script)"),
    ("sbatch results", f"`sbatch slurm/cpu.sbatch` → output group written ({ranks} ranks)"),
    ("sbatch end", f"`sbatch slurm/cpu.sbatch` → job COMPLETED"),
]
lines = [
    "## Slurm: sbatch to results, srun against mpirun",
    "",
    f"Run of `bash benches/slurm.sh{' --quick' if quick == '1' else ''}` on {cpu}, {ncpu} CPUs, "
    f"{mem}, on the one-node Slurm of `slurm/local-cluster.sh` ({slurm}, {mpi}); raw times in "
    f"`target/bench-results/{out.rsplit('/', 1)[-1]}`. The run: `rankwise svd` of a generated "
    f"{rows:,} × {cols} float64 matrix ({rows * cols * 8 / 1e6:.0f} MB) in {rows // chunk} "
    f"panels, written to an output group (`--out`) by every run; {reps} repetitions, interleaved; median (min–max). Own = the time rankwise "
    "reports for itself; launch overhead = wall − own, per run, median.",
    "",
    "| launch | wall time | rankwise's own time | launch overhead |",
    "|---|---|---|---|",
]
for key, label in labels:
    runs = times.get(key, [])
    if not runs:
        lines.append(f"| {label} | not run | | |")
        continue
    wall = [w for w, _ in runs]
    own = [o for _, o in runs]
    over = [w - o for w, o in runs]
    lines.append(f"| {label} | {spread(wall)} | {statistics.median(own):.2f} s | {statistics.median(over):.2f} s |")
m = lambda k: statistics.median([w - o for w, o in times[k]])
lines += [
    "",
    f"- srun in a job against mpirun: {m('srun in a job') - m('mpirun'):+.2f} s of launch "
    f"overhead per run; srun from the shell against mpirun: {m('srun') - m('mpirun'):+.2f} s.",
    "- The sbatch times include the batch script (bash, srun's step) and the scheduler: "
    "`SchedulerParameters=batch_sched_delay=0` starts a job as soon as it is submitted.",
]
section = "<!-- BEGIN slurm -->\n" + "\n".join(lines) + "\n<!-- END slurm -->"
text = open(results).read()
pattern = re.compile(r"<!-- BEGIN slurm -->.*?<!-- END slurm -->", re.S)
text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section + "\n"
open(results, "w").write(text)
print("\n".join(lines))
EOF
