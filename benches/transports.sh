#!/usr/bin/env bash
# The UCX transport against the MPI transport between ranks of one node: point-to-point
# latency and bandwidth, and the R-factor tree reduction of TSQR.
#
#   bash benches/transports.sh [--quick]      (make bench runs it after benches/slurm.sh)
#
# Runs `mpirun -np 2 target/release/examples/transport_bench T` (examples/transport_bench.rs)
# for each configuration, interleaved, ROUNDS times (3; --quick: 1, with fewer repetitions
# inside):
#   mpi         --transport mpi: Open MPI's ob1 with its shared-memory btl (vader), as the
#               tests run it
#   ucx tcp     --transport ucx with UCX_TLS=tcp,self over loopback (peer failure detection)
#   ucx shm     --transport ucx with UCX_TLS=sm,self (posix/sysv shared memory and CMA)
# Measurements (each a median over the repetitions inside a run; the table gives the median
# over the rounds of those medians, with the min–max of all repetitions):
#   latency 8 B        half the round trip of an 8-byte ping-pong
#   bandwidth 1 MiB    rank 0 streams 64 messages to rank 1 (each received into a new buffer)
#   bandwidth 64 MiB   the same with 4 messages of 64 MiB
#   R tree n = 20/200  Tree::up over 16 panels of n × n R factors (TSQR's combine: QR of two
#                      stacked R), 8 per rank, then the root owner's broadcast; per reduction
# Also on 4 ranks for the R tree.
#
# Rewrites the section between `<!-- BEGIN transports -->` and `<!-- END transports -->` of
# benches/RESULTS.md; the raw lines stay in target/bench-results/transports-*/.
#
# Environment: BENCH_RESULTS (default benches/RESULTS.md), RANKWISE_BENCH_EXAMPLE (default
# target/release/examples/transport_bench), TRANSPORTS_OUT=DIR (write the section from the
# raw lines of an earlier run in DIR instead of running again).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RESULTS=${BENCH_RESULTS:-benches/RESULTS.md}
EXAMPLE=${RANKWISE_BENCH_EXAMPLE:-target/release/examples/transport_bench}
QUICK=0
for arg in "$@"; do
    case "$arg" in
        --quick) QUICK=1 ;;
        -h | --help)
            sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "transports.sh: unknown argument $arg" >&2
            exit 2
            ;;
    esac
done

log() {
    printf '[transports bench %s] %s\n' "$(date +%T)" "$*" >&2
}

if [[ ! -x "$EXAMPLE" ]]; then
    cargo build --release --example transport_bench
fi

# Open MPI as the tests run it: as root in a container, its own shared memory only (so
# its UCX components never compete with ours), more ranks than cores allowed.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_base_warn_component_unused=0
export OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1

OUT=${TRANSPORTS_OUT:-target/bench-results/transports-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
ROUNDS=3
EXTRA=()
if ((QUICK)); then
    ROUNDS=1
    EXTRA=(--quick)
fi

run() { # name np transport [env...]
    local name=$1 np=$2 transport=$3
    shift 3
    local file="$OUT/$name-np$np.tsv"
    printf '%s\t%s\n' "$(date -u +%T)" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/load.tsv"
    echo "env $* mpirun --bind-to none -np $np $EXAMPLE $transport ${EXTRA[*]}" >>"$OUT/commands.txt"
    env "$@" mpirun --bind-to none -np "$np" "$EXAMPLE" "$transport" "${EXTRA[@]}" >>"$file"
}

if [[ -n "${TRANSPORTS_OUT:-}" ]]; then
    ROUNDS=0
    log "writing the section from $OUT"
fi
for round in $(seq "$ROUNDS"); do
    log "round $round of $ROUNDS"
    run mpi 2 mpi
    run ucx-tcp 2 ucx UCX_TLS=tcp,self UCX_NET_DEVICES=lo
    run ucx-shm 2 ucx UCX_TLS=sm,self
    run mpi 4 mpi
    run ucx-tcp 4 ucx UCX_TLS=tcp,self UCX_NET_DEVICES=lo
    run ucx-shm 4 ucx UCX_TLS=sm,self
done
if ((ROUNDS)); then
    printf '%s\t%s\n' "$(date -u +%T)" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/load.tsv"
fi

CPU="$(lscpu | sed -n 's/^Model name: *//p' | head -n 1) (family $(lscpu | sed -n 's/^CPU family: *//p' | head -n 1), model $(lscpu | sed -n 's/^Model: *//p' | head -n 1))"
VIRT=$(lscpu | sed -n 's/^Hypervisor vendor: *//p' | head -n 1)
MPI_VERSION=$(mpirun --version | head -n 1)
UCX_VERSION=$(pkg-config --modversion ucx)
python3 - "$OUT" "$RESULTS" "$QUICK" "$CPU" "$VIRT" "$(nproc)" "$MPI_VERSION" "$UCX_VERSION" <<'PY'
import re, statistics, sys
from pathlib import Path
out, results, quick, cpu, virt, ncpu, mpi, ucx = sys.argv[1:]
# AMD's CPU families by microarchitecture, for the machine line.
cpu = cpu.replace("(family 26,", "(Zen 5, family 26,").replace("(family 25,", "(Zen 3/4, family 25,")
configs = [("mpi", "MPI (ob1, vader)"), ("ucx-tcp", "UCX tcp,self"), ("ucx-shm", "UCX sm,self")]
metrics = [
    ("latency 8 B", 2, "µs", 2),
    ("bandwidth 1 MiB", 2, "GB/s", 2),
    ("bandwidth 64 MiB", 2, "GB/s", 2),
    ("R tree n = 20", 2, "ms", 3),
    ("R tree n = 200", 2, "ms", 1),
    ("R tree n = 20", 4, "ms", 3),
    ("R tree n = 200", 4, "ms", 1),
]
data = {}
for name, _ in configs:
    for np in (2, 4):
        path = Path(out, f"{name}-np{np}.tsv")
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            metric, median, lo, hi, unit, n = line.split("\t")
            d = data.setdefault((name, np, metric), {"medians": [], "lo": [], "hi": []})
            d["medians"].append(float(median))
            d["lo"].append(float(lo))
            d["hi"].append(float(hi))

def cell(name, np, metric, digits):
    d = data.get((name, np, metric))
    if not d:
        return "not run"
    m = statistics.median(d["medians"])
    return f"{m:.{digits}f} ({min(d['lo']):.{digits}f}–{max(d['hi']):.{digits}f})"

loads = [l.split("\t")[1] for l in Path(out, "load.tsv").read_text().splitlines()]
lines = [
    "## Transports: UCX against MPI between ranks of one node",
    "",
    f"Run of `bash benches/transports.sh{' --quick' if quick == '1' else ''}` on {cpu}"
    f"{', ' + virt + ' VM' if virt else ''} with {ncpu} CPUs ({mpi}; UCX {ucx}); raw lines, "
    f"commands and load averages in `target/bench-results/{out.rsplit('/', 1)[-1]}`. "
    f"`mpirun --bind-to none -np P target/release/examples/transport_bench mpi|ucx` "
    "(`examples/transport_bench.rs`), the three configurations interleaved; each cell is the "
    "median over the runs of each run's median, with the min–max of every repetition. "
    f"Load average (1 min) before the runs: {loads[0].split()[0]} at the start, "
    f"{max(float(l.split()[0]) for l in loads):.2f} at most, {loads[-1].split()[0]} at the end.",
    "",
    "| measurement | ranks | unit | " + " | ".join(label for _, label in configs) + " |",
    "|---|---|---|" + "---|" * len(configs),
]
for metric, np, unit, digits in metrics:
    lines.append(
        f"| {metric} | {np} | {unit} | "
        + " | ".join(cell(name, np, metric, digits) for name, _ in configs)
        + " |"
    )
lines += [
    "",
    "- Latency is half an 8-byte round trip through `send_bytes`/`recv_bytes` (the mailbox "
    "included); bandwidth counts payload bytes, each message received into a new buffer, as "
    "the runtime receives them. The R tree is `Tree::up` over 16 panels with TSQR's combine, "
    "then the root's broadcast: what `svd` does between its two passes.",
    "- Both transports poll without a progress thread. With 2 CPUs shared with other work, "
    "two ranks sometimes share one core; then a waiting rank that spins delays the message "
    "it waits for, and the spread (max) shows it. The MPI runs yield the CPU whenever idle "
    "(`OMPI_MCA_mpi_yield_when_idle=1`, as the tests run them); UCX waits spin 5 µs first.",
    "- UCX over TCP here is loopback (`UCX_NET_DEVICES=lo`): it measures UCX's TCP stack, "
    "not a network. With peer failure detection on (the default), UCX 1.13 cannot use "
    "shared memory, so `UCX_TLS=sm,self` falls back to endpoints without it (see README).",
    "- At 64 MiB all three move about the same: each message is received into a new "
    "allocation, as the runtime receives them (not investigated further).",
]
section = "<!-- BEGIN transports -->\n" + "\n".join(lines) + "\n<!-- END transports -->"
text = open(results).read()
pattern = re.compile(r"<!-- BEGIN transports -->.*?<!-- END transports -->", re.S)
text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section + "\n"
open(results, "w").write(text)
print("\n".join(lines))
PY
