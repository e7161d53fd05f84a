#!/usr/bin/env bash
# Writing U to Zarr against writing the same bytes with dd, interleaved, on one file system.
#
#   bash benches/write_u.sh [--quick]      (make bench runs it after benches/run.sh)
#
# Each repetition runs, in turn:
#   1. `rankwise svd` of the generated 10,000,000 × 20 float64 matrix, without output;
#   2. the same with `--out` (U, 1.6 GB uncompressed, in a Zarr group);
#   3. `dd` of as many bytes from /dev/zero to a file, then `sync`;
#   4. `dd … conv=fdatasync` of as many bytes.
# Every time is the command's wall time (start-up included, alike for 1 and 2). The cost of
# writing U is 2 − 1; the bytes at the disk's speed are 3 (to the page cache and then to the
# disk) and 4. After run 2, the kernel's count of dirty pages says whether U had reached the
# disk when rankwise exited. --quick: 2,000,000 rows, 3 repetitions (default 5).
# Rewrites the section between `<!-- BEGIN write-u -->` and `<!-- END write-u -->` of
# benches/RESULTS.md; raw rows in target/bench-results/write-u-<time>/rows.jsonl.
#
# Environment: RANKWISE_BIN (default target/release/rankwise), BENCH_RESULTS (default
# benches/RESULTS.md), WRITE_U_DIR (where the outputs go, default target/write-u-scratch;
# removed after each repetition).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN=${RANKWISE_BIN:-target/release/rankwise}
RESULTS=${BENCH_RESULTS:-benches/RESULTS.md}
QUICK=0
case "${1:-}" in
    --quick) QUICK=1 ;;
    "") ;;
    *)
        echo "write_u.sh: unknown argument $1 (usage: bash benches/write_u.sh [--quick])" >&2
        exit 2
        ;;
esac
if [[ ! -x "$BIN" ]]; then
    make --no-print-directory build
fi
ROWS=10000000
REPS=5
if ((QUICK)); then
    ROWS=2000000
    REPS=3
fi
COLS=20
CHUNK_ROWS=$((ROWS / 16))
BYTES=$((ROWS * COLS * 8))
OUT="target/bench-results/write-u-$(date -u +%Y%m%dT%H%M%SZ)"
SCRATCH=${WRITE_U_DIR:-target/write-u-scratch}
mkdir -p "$OUT" "$SCRATCH"
# The binary as it is now, so a rebuild during the run does not change what is measured.
RW="$OUT/rankwise"
cp "$BIN" "$RW"
trap 'rm -rf "$SCRATCH/u.zarr" "$SCRATCH/dd.bin" "$RW"' EXIT

now() { date +%s.%N; }
# Wall seconds of a command whose output is dropped; a failure ends the benchmark.
timed() {
    local t0 t1
    t0=$(now)
    if ! "$@" >/dev/null 2>>"$OUT/stderr.log"; then
        echo "write_u.sh: failed: $* (its messages: $OUT/stderr.log)" >&2
        return 1
    fi
    t1=$(now)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f\n", b - a }'
}
dirty_kb() { awk '/^Dirty:/ { print $2 }' /proc/meminfo; }

SVD=("$RW" svd --rows "$ROWS" --cols "$COLS" --chunk-rows "$CHUNK_ROWS")
DD=(dd if=/dev/zero bs=4M iflag=count_bytes count="$BYTES")
for ((i = 1; i <= REPS; i++)); do
    rm -rf "$SCRATCH/u.zarr" "$SCRATCH/dd.bin"
    sync
    plain=$(timed "${SVD[@]}")
    sync
    out=$(timed "${SVD[@]}" --out "$SCRATCH/u.zarr")
    dirty=$(dirty_kb)
    stored=$(du -sb "$SCRATCH/u.zarr" | cut -f1)
    rm -rf "$SCRATCH/u.zarr"
    sync
    dd_cache=$(timed "${DD[@]}" of="$SCRATCH/dd.bin")
    dd_sync=$(timed sync)
    rm -f "$SCRATCH/dd.bin"
    sync
    dd_fdatasync=$(timed "${DD[@]}" of="$SCRATCH/dd.bin" conv=fdatasync)
    rm -f "$SCRATCH/dd.bin"
    load=$(cut -d' ' -f1 /proc/loadavg)
    printf '{"rep": %d, "svd": %s, "svd_out": %s, "dirty_kb_after_out": %s, "stored_bytes": %s, "dd_cache": %s, "sync_after_dd": %s, "dd_fdatasync": %s, "load1": %s}\n' \
        "$i" "$plain" "$out" "$dirty" "$stored" "$dd_cache" "$dd_sync" "$dd_fdatasync" "$load" \
        | tee -a "$OUT/rows.jsonl" >&2
done

python3 - "$OUT" "$RESULTS" "$ROWS" "$COLS" "$CHUNK_ROWS" "$BYTES" "$QUICK" "$SCRATCH" <<'EOF'
import json, os, platform, statistics, subprocess, sys
from pathlib import Path

out, results, rows, cols, chunk, nbytes, quick, scratch = sys.argv[1:]
rows, cols, nbytes = int(rows), int(cols), int(nbytes)
reps = [json.loads(l) for l in Path(out, "rows.jsonl").read_text().splitlines() if l.strip()]

def cell(values):
    values = sorted(values)
    return f"{statistics.median(values):.2f} s ({values[0]:.2f}–{values[-1]:.2f})"

write = [r["svd_out"] - r["svd"] for r in reps]
dd_cache = [r["dd_cache"] + r["sync_after_dd"] for r in reps]
dd_sync = [r["dd_fdatasync"] for r in reps]
cpu = "unknown CPU"
try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
except OSError:
    pass
fs = subprocess.run(["df", "-T", scratch], capture_output=True, text=True).stdout.splitlines()
fs = fs[-1].split()[1] if len(fs) > 1 else "unknown"
gb = nbytes / 1e9
stamp = Path(out).name.removeprefix("write-u-")
when = f"{stamp[0:4]}-{stamp[4:6]}-{stamp[6:8]} {stamp[9:11]}:{stamp[11:13]} UTC"
lines = [
    "## Writing U to Zarr against the same bytes written by dd",
    "",
    f"Run of `bash benches/write_u.sh{' --quick' if quick == '1' else ''}` ({when}) on {cpu}, "
    f"{os.cpu_count()} CPUs, Linux {platform.release()}, file system {fs}; raw rows in "
    f"`{out}/rows.jsonl`. {len(reps)} repetitions, each running in turn `rankwise svd --rows {rows} "
    f"--cols {cols} --chunk-rows {chunk}` without output and with `--out` (U: {gb:.2f} GB, "
    f"uncompressed float64 chunks of {int(chunk):,} rows), then `dd` of {gb:.2f} GB to the same "
    "file system followed by `sync`, then `dd … conv=fdatasync`. Wall times; median (min–max). "
    "Writing U = the run with `--out` less the run without.",
    "",
    "| what | time | GB/s |",
    "|---|---|---|",
    f"| `rankwise svd`, no output | {cell(r['svd'] for r in reps)} | — |",
    f"| `rankwise svd --out` | {cell(r['svd_out'] for r in reps)} | — |",
    f"| writing U (the difference) | {cell(write)} | {gb / statistics.median(write):.2f} |",
    f"| `dd` to the page cache, then `sync` | {cell(dd_cache)} | {gb / statistics.median(dd_cache):.2f} |",
    f"| `dd conv=fdatasync` | {cell(dd_sync)} | {gb / statistics.median(dd_sync):.2f} |",
    "",
    f"- The kernel's dirty pages right after each `--out` run: "
    f"{', '.join(str(r['dirty_kb_after_out']) + ' kB' for r in reps)}: U had reached the disk "
    "when rankwise exited (committing the output syncs its directories).",
    f"- Stored bytes of the group: {reps[0]['stored_bytes']:,}.",
    f"- Load average (1 min) after each repetition: {', '.join(str(r['load1']) for r in reps)}.",
]
section = "\n".join(lines) + "\n"
text = Path(results).read_text()
begin, end = "<!-- BEGIN write-u -->", "<!-- END write-u -->"
if begin in text and end in text:
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    text = head + begin + "\n" + section + end + tail
else:
    text = text.rstrip("\n") + "\n\n" + begin + "\n" + section + end + "\n"
Path(results).write_text(text)
print(section)
EOF
