#!/usr/bin/env bash
# GPU checks and benchmark, for a machine with an NVIDIA GPU: tests/gpu.rs, then `rsvd -k 10`
# of a generated 10,000,000 × 20,000 genotype matrix (200 GB as uint8) on one GPU, generated
# on the device panel by panel and regenerated in every pass; then a genotype Zarr store
# staged to the device (host decode + pinned copy) against the host's decode rate alone; then
# the exact `svd` of a generated uniform matrix on a GPU actor (panels generated and factored
# on the device) against CPU actors.
#
# From a checkout with a release build (`make build`, and `make test` for the test binary):
#
#   bash benches/gpu.sh
#
# From a bundle, on a machine without Rust or the Debian packages rankwise links (a GPU node
# image): `make bundle DIR=/tmp/rw TESTS=1` here, copy it there (as a tar.xz: the bundle is
# about 67 MB, 13 MB compressed), then
#
#   RANKWISE=/tmp/rw/bin/rankwise GPU_TESTS=/tmp/rw/release/deps/gpu bash benches/gpu.sh
#
# On a GPU node held for a short, fixed time, one command runs it all: DEADLINE bounds the
# whole script (below), the steps run in the order of what they prove (the GPU tests, then
# the benchmark, then Zarr, then svd), and the summary and reports are written whatever
# happened to the steps:
#
#   tar -xJf rw.tar.xz -C /tmp && . /tmp/rw/env.sh && DEADLINE=480 \
#       RANKWISE=/tmp/rw/bin/rankwise GPU_TESTS=/tmp/rw/release/deps/gpu OUT=results \
#       bash benches/gpu.sh
#
# Environment: OUT (results folder; default target/bench-results/gpu-STAMP), DEVICE_DECODE
# (the device_decode example: the Zarr store's chunks decoded on the device; default beside
# RANKWISE, else target/release/examples), ROWS and COLS
# (the benchmark's shape; default 10000000 × 20000), CHUNK_ROWS (default 250000), PRECISIONS
# (default "f32 f64"), TIMEOUT (seconds per rankwise run, default 300); ZARR_ROWS (variants of
# the Zarr store, COLS samples; default 500000, 10 GB as int8; 0 skips the step), ZARR_CHUNK
# (its chunk rows, default 25000) and ZARR_DIR (where it is written, default /tmp/rankwise-gpu);
# SVD_ROWS, SVD_COLS and SVD_CHUNK (the svd's shape, default 2000000 × 1024 in panels of
# 100000 rows; SVD_ROWS=0 skips it);
# SMALL_ROWS (the rows of the first, small GPU-against-CPU run, default 400000);
# CONV_ROWS and CONV_COLS (the default, convergence-controlled PCA of a 3-population cohort
# on both kinds of actor; default 200000 × 5000; CONV_ROWS=0 skips it).
# DEADLINE (seconds for the whole script, default 0: none): every step's timeout is cut to
# what is left of it, less RESERVE seconds (default 15) for the summary, and a step with
# under 10 s left is skipped, saying so. GPU_TESTS: the tests/gpu.rs binary (found under
# target/release/deps by default; `none` runs no tests); each test runs in a process of its
# own under TEST_TIMEOUT seconds (default 120), so that one that hangs costs only its own
# result; TESTS_FILTER (words separated by spaces) runs only the tests whose names contain
# one of them. A test that exits 0 is counted as passed only if it ran its checks: one that
# printed a line `SKIPPED: ` (by design on this machine: no GPU, a usable GPU, no mpirun, …)
# is counted as skipped, with its reason, and one that printed `PART SKIPPED: ` as passed
# with a part skipped. DEVICE (default gpu): the device of the runs named *-gpu; DEVICE=cpu runs every
# step on CPU actors, which checks this script itself on a machine without a GPU
# (tests/gpu.rs runs it so in make test).
#
# CUDA libraries: rankwise loads the driver, NVRTC and cuBLAS at run time. Where the loader
# does not find them, this script adds the folders CUDA images and NVIDIA's Python wheels
# put them in to LD_LIBRARY_PATH, and records what it used.
#
# OUT receives six files (env.txt, tests.log, runs.log, steps.tsv: each step's outcome and
# seconds, reports.json: every run's JSON report by name, summary.md), small enough to copy
# back whole.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RANKWISE=${RANKWISE:-$ROOT/target/release/rankwise}
DEVICE_DECODE=${DEVICE_DECODE:-$(dirname "$RANKWISE")/device_decode}
[[ -x $DEVICE_DECODE ]] || DEVICE_DECODE=$ROOT/target/release/examples/device_decode
ROWS=${ROWS:-10000000}
COLS=${COLS:-20000}
CHUNK_ROWS=${CHUNK_ROWS:-250000}
PRECISIONS=${PRECISIONS:-f32 f64}
TIMEOUT=${TIMEOUT:-300}
ZARR_ROWS=${ZARR_ROWS:-500000}
ZARR_CHUNK=${ZARR_CHUNK:-25000}
ZARR_DIR=${ZARR_DIR:-/tmp/rankwise-gpu}
SVD_ROWS=${SVD_ROWS:-2000000}
SVD_COLS=${SVD_COLS:-1024}
SVD_CHUNK=${SVD_CHUNK:-100000}
SMALL_ROWS=${SMALL_ROWS:-400000}
CONV_ROWS=${CONV_ROWS:-200000}
CONV_COLS=${CONV_COLS:-5000}
DEADLINE=${DEADLINE:-0}
RESERVE=${RESERVE:-15}
TEST_TIMEOUT=${TEST_TIMEOUT:-120}
TESTS_FILTER=${TESTS_FILTER:-}
# Tells tests/gpu.rs's check of this script not to run it again from inside it.
export RANKWISE_IN_GPU_SH=1
DEVICE=${DEVICE:-gpu}
OUT=${OUT:-$ROOT/target/bench-results/gpu-$(date -u +%Y%m%dT%H%M%SZ)}
START=$SECONDS
die() {
    printf 'gpu.sh: %s\n' "$*" >&2
    exit 1
}
[[ -x $RANKWISE ]] || die "$RANKWISE is missing: run make build, or set RANKWISE (a bundle's bin/rankwise)"
[[ $DEVICE == gpu || $DEVICE == cpu ]] || die "DEVICE=$DEVICE: gpu or cpu"
if [[ ${GPU_TESTS:-} == none ]]; then
    GPU_TESTS=
elif [[ -z ${GPU_TESTS:-} ]]; then
    GPU_TESTS=
    for f in "$ROOT"/target/release/deps/gpu-*; do
        [[ -x $f && $f != *.d && ( -z $GPU_TESTS || $f -nt $GPU_TESTS ) ]] && GPU_TESTS=$f
    done
fi
mkdir -p "$OUT"

# The folders that hold a CUDA library, in the order a CUDA image's loader would not know.
cuda_dirs() {
    local d
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 \
        /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
        [[ -d $d ]] && printf '%s\n' "$d"
    done
    # NVIDIA's wheels (nvidia-cublas, nvidia-cuda-nvrtc, …) keep theirs in site-packages
    # (nvidia-libnvcomp-cu13 under lib64).
    if command -v python3 >/dev/null; then
        python3 - <<'EOF' 2>/dev/null || true
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "**", "lib"), recursive=True)
                    + glob.glob(os.path.join(r, "nvidia", "**", "lib64"), recursive=True)):
        print(d)
EOF
    fi
}

missing() { # the CUDA libraries rankwise info reports not found
    "$RANKWISE" info 2>/dev/null |
        awk '/^  (cuda|nvrtc|cublas|cublasLt|nvcomp) +not found/ {print $1}'
}
if [[ -n $(missing) ]]; then
    extra=$(cuda_dirs | paste -sd: -)
    export LD_LIBRARY_PATH="${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# NCCL's soname is libnccl.so.2, NVIDIA's wheel ships nothing else, and rankwise (cudarc)
# loads libnccl.so: rankwise info names the file it found, and a link makes it loadable.
nccl2=$("$RANKWISE" info 2>/dev/null |
    sed -n 's|^  nccl .*; \(/[^ ]*libnccl\.so\.2\) loads, but.*|\1|p' || true)
if [[ -n $nccl2 ]]; then
    links=${TMPDIR:-/tmp}/rankwise-gpu-libs
    mkdir -p "$links"
    ln -sf "$nccl2" "$links/libnccl.so"
    export LD_LIBRARY_PATH="$links${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

summarize() {
    python3 - "$OUT" "$ROWS" "$COLS" >"$OUT/summary.md" <<'EOF'
import json, os, sys

out, rows, cols = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


reports = {}
try:
    with open(os.path.join(out, "reports.json")) as f:
        reports = json.load(f)
except (OSError, ValueError):
    pass


def load(name):
    if name not in reports:
        try:
            with open(os.path.join(out, "json", name + ".json")) as f:
                reports[name] = json.load(f)
        except (OSError, ValueError):
            return None
    return reports[name]


try:
    env = open(os.path.join(out, "env.txt")).read().splitlines()
except OSError:
    env = []
gpu = next((l for l in env if "H100" in l or "H200" in l or "NVIDIA" in l), "GPU: see env.txt")
device = next((l.split(": ", 1)[1] for l in env if l.startswith("device of the")), "gpu")
print(f"## GPU: rsvd -k 10 of a generated {rows:,} × {cols:,} genotype matrix\n")
print(f"Device (nvidia-smi: name, driver, memory, PCIe): {gpu}\n")
if device != "gpu":
    print(f"The *-gpu runs ran with --device {device}: a check of this script, not of a GPU.\n")
try:
    tests = [l for l in open(os.path.join(out, "tests.log")) if l.startswith("tests/gpu.rs: ")]
except OSError:
    tests = []
if tests:
    print(f"- {tests[-1].strip()}")
steps = []
try:
    steps = [l.rstrip("\n").split("\t") for l in open(os.path.join(out, "steps.tsv"))]
except OSError:
    pass
# Skipped tests and tests with a part skipped are listed with their reasons: they did not
# check what their names say.
bad = [s for s in steps if len(s) == 3 and s[1] != "ok"]
for name, outcome, secs in bad:
    print(f"- {name}: {outcome}" + (f" ({secs} s)" if secs != "0" else ""))
if steps:
    ok = sum(1 for s in steps if len(s) == 3 and s[1].startswith("ok"))
    print(f"- {ok} of {len(steps)} steps ok, "
          f"{sum(int(s[2]) for s in steps if len(s) == 3)} s in all (steps.tsv).")
print()
actor = "GPU actor" if device == "gpu" else f"{device.upper()} actor (DEVICE={device})"
small_g, small_c = load("small-gpu"), load("small-cpu")
if small_g and small_c:
    sg, sc = small_g["singular_values"], small_c["singular_values"]
    worst = max(abs(a - b) / abs(b) for a, b in zip(sg, sc))
    panels = small_g["per_rank"][0].get("gpu_panel_passes")
    m, n = small_g["shape"]
    print(f"- {m:,} × {n:,}, f64: σ on GPU against CPU actors, largest relative "
          f"difference {worst:.1e}; panel passes on the GPU: {panels}.")
conv_g, conv_c = load("converged-gpu"), load("converged-cpu")
if conv_g or conv_c:
    d = conv_g or conv_c
    m, n = d["shape"]
    print(f"\n## Default (convergence-controlled) pca -k 10 of a generated {m:,} × {n:,} "
          "3-population cohort\n")
    print("| actor | total | passes | pass precisions | converged | largest residual | tol |")
    print("|---|---|---|---|---|---|---|")
    for name, d in ((actor, conv_g), ("CPU actors", conv_c)):
        if not d:
            continue
        c = d["convergence"]
        precs = " ".join(c["pass_precisions"])
        print(f"| {name} | {d['seconds']:.2f} s | {d['passes']} | {precs} | {d['converged']} | "
              f"{max(c['residuals']):.1e} | {c['tol']:.0e} |")
    if conv_g and conv_c:
        a, b = conv_g["singular_values"], conv_c["singular_values"]
        worst = max(abs(x - y) / abs(b[0]) for x, y in zip(a, b))
        print(f"\n- σ on the GPU against CPU actors: largest difference {worst:.1e} of σ₁.")
print()
print("| precision | total | pass 1 | last pass | GEMM TFLOP/s | generated G values/s | peak RSS |")
print("|---|---|---|---|---|---|---|")
for p in ("f32", "f64"):
    d = load("rsvd-" + p)
    if not d:
        continue
    r = d["per_rank"][0]
    t = {x["phase"]: x["seconds"] for x in r["timings"]}
    passes = [v for k, v in t.items() if "pass" in k]
    # Values, not bytes_produced (which counts 8 bytes per value of a dense operand): one
    # value is one byte of the uint8 matrix the benchmark stands for.
    made = d["shape"][0] * d["shape"][1] * d["passes"]
    gen = made / max(sum(passes), 1e-9) / 1e9
    first = next((v for k, v in t.items() if k.startswith("pass 1")), float("nan"))
    last = next((f"{v:.2f} s" for k, v in t.items() if k.startswith("last pass")), "—")
    print(f"| {p} | {d['seconds']:.2f} s | {first:.2f} s | {last} | "
          f"{d['gemm_gflop_per_s'] / 1000:.1f} | {gen:.1f} | "
          f"{r['peak_rss_bytes'] / 2**30:.2f} GiB |")
print()
print("Generated G values/s: the matrix's values times the passes over the passes' time "
      "(GB/s of the uint8 matrix).")

read, zg, zc = load("zarr-read"), load("zarr-gpu"), load("zarr-cpu")
if read:
    print(f"\n## Zarr → device: {read['source']}\n")
    # nvidia-smi's name, driver, memory, PCIe generation and width: the link's nominal rate.
    per_lane = {3: 8, 4: 16, 5: 32, 6: 64}  # GT/s, 128b/130b encoding
    fields = [f.strip() for f in gpu.split(",")]
    try:
        gen, width = int(fields[-2]), int(fields[-1])
        print(f"- PCIe gen {gen} ×{width}: {per_lane[gen] * width * 128 / 130 / 8:.1f} GB/s "
              "nominal per direction.")
    except (ValueError, IndexError, KeyError):
        pass
    pcie = load("pcie")
    if pcie:
        print(f"- page-locked host → device copies of {pcie['bytes'] / 2**30:.0f} GiB "
              f"(PyTorch, best of {pcie['reps']}): {pcie['gb_per_s']:.1f} GB/s.")
    print(f"- host decode alone (`rankwise read`, {read['cores']} cores): "
          f"{read['decoded_gb_per_s']:.2f} GB/s decoded, {read['seconds']:.2f} s.")
    dd = load("zarr-device-decode")
    if dd:
        print(f"- device decode (`examples/device_decode`: nvCOMP and the unshuffle kernels, "
              f"{dd['batches']} batches): {dd['device_decoded_gb_per_s']:.2f} GB/s decoded on "
              f"the device, {dd['decoded_gb_per_s']:.2f} GB/s end to end with the chunk files "
              f"read on {dd['read_threads']} threads ({dd['staged_bytes'] / 1e9:.2f} GB "
              f"staged, {dd['seconds']:.2f} s).")
for name, d in ((actor, zg), ("CPU actor", zc)):
    if not d:
        continue
    r = d["per_rank"][0]
    t = {x["phase"]: x["seconds"] for x in r["timings"]}
    first = next((v for k, v in t.items() if k.startswith("pass 1")), float("nan"))
    decoded = r["read"]["decoded_bytes"]
    line = (f"- pca q = 0 f32 on a {name}: {d['seconds']:.2f} s, pass 1 {first:.2f} s, "
            f"{decoded / first / 1e9:.2f} GB/s of int8 decoded")
    staged = r.get("gpu_staged_bytes") or 0
    dec = r.get("gpu_decode")
    if dec:
        # The device decoded the chunks: what crossed PCIe is their compressed frames.
        line += (f"; decoded on the device: {dec['device']['frames']} chunks, "
                 f"{staged / 1e9:.2f} GB of frames staged, nvCOMP "
                 f"{dec['device']['decompress_seconds']:.3f} s, file reads "
                 f"{dec['read_seconds']:.3f} s, packing {dec['device']['pack_seconds']:.3f} s")
        if dec.get("host_chunks"):
            line += f"; {dec['host_chunks']} chunks decoded on the host ({dec['host_reason']})"
    elif staged:
        line += (f", {staged / 1e9:.2f} GB staged 2-bit packed "
                 f"({staged / first / 1e9:.2f} GB/s over PCIe)")
    if r.get("gpu_kept_passes"):
        line += (f"; {r['gpu_kept_passes']} panel passes from codes kept on the device "
                 f"({r['gpu_kept_bytes'] / 1e9:.2f} GB)")
    print(line + ".")

sg, sc = load("svd-gpu"), load("svd-cpu")
if sg or sc:
    d = sg or sc
    m, n = d["shape"]
    print(f"\n## svd of a generated {m:,} × {n:,} uniform matrix (f64)\n")
for name, d in ((actor, sg), ("CPU actors", sc)):
    if not d:
        continue
    r = d["per_rank"][0]
    t = {x["phase"]: x["seconds"] for x in r["timings"]}
    first = next((v for k, v in t.items() if k.startswith("pass 1")), float("nan"))
    tree = next((v for k, v in t.items() if k.startswith("tree: reduce")), float("nan"))
    line = f"- {name}: {d['seconds']:.2f} s, pass 1 {first:.2f} s, tree {tree:.3f} s"
    if r.get("gpu_panel_qrs"):
        line += (f"; cuSOLVER: {r['gpu_panel_qrs']} panel QRs "
                 f"({r.get('gpu_generated_panels', 0)} generated on the device), "
                 f"{r.get('gpu_node_qrs', 0)} tree-node QRs")
    print(line + ".")
if sg and sc:
    a, b = sg["singular_values"], sc["singular_values"]
    worst = max(abs(x - y) / abs(b[0]) for x, y in zip(a, b))
    print(f"- σ on the GPU against CPU actors: largest difference {worst:.1e} of σ₁.")
EOF
    cat "$OUT/summary.md"
}
# SUMMARY_ONLY=1: only remake summary.md from the files already in OUT.
if [[ -n ${SUMMARY_ONLY:-} ]]; then
    summarize
    exit 0
fi

status=0
: >"$OUT/steps.tsv"
: >"$OUT/runs.log"
mkdir -p "$OUT/json"

# Seconds the next step may take: TIMEOUT, cut to what DEADLINE leaves after RESERVE.
budget() {
    local t=$TIMEOUT left
    if ((DEADLINE > 0)); then
        left=$((DEADLINE - (SECONDS - START) - RESERVE))
        ((left < t)) && t=$left
    fi
    echo "$t"
}
# Records a step's outcome (ok, ok, part skipped: why, failed (exit N), timed out after Ns,
# skipped: why) and time.
step() { # name, outcome, seconds
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$OUT/steps.tsv"
}
# Replaces the outcome of the step recorded last (a test that exited 0 but skipped).
restep() { # outcome
    local name secs
    name=$(tail -n 1 "$OUT/steps.tsv" | cut -f1)
    secs=$(tail -n 1 "$OUT/steps.tsv" | cut -f3)
    sed -i '$d' "$OUT/steps.tsv"
    step "$name" "$1" "$secs"
}
# The outcome of the step recorded last.
last_outcome() {
    tail -n 1 "$OUT/steps.tsv" | cut -f2
}
# Runs a command under the step's budget; its outcome goes to steps.tsv. Returns its status.
timed() { # name, then the command
    local name=$1 t rc=0 t0=$SECONDS
    shift
    t=$(budget)
    if ((t < 10)); then
        step "$name" "skipped: ${t} s left of DEADLINE=$DEADLINE" 0
        echo "$name: skipped (deadline)" | tee -a "$OUT/runs.log"
        return 125
    fi
    timeout "$t" "$@" || rc=$?
    if ((rc == 0)); then
        step "$name" ok $((SECONDS - t0))
    elif ((rc == 124)); then
        step "$name" "timed out after ${t} s" $((SECONDS - t0))
    else
        step "$name" "failed (exit $rc)" $((SECONDS - t0))
    fi
    return "$rc"
}

# Whatever happens to the steps, the reports become one file (a handful of files is easier to
# copy back from a node than a folder of them) and the summary is written.
# shellcheck disable=SC2317  # called by the EXIT trap
finish() {
    python3 - "$OUT" <<'PY' || true
import glob, json, os, sys
out = sys.argv[1]
reports = {}
for f in sorted(glob.glob(os.path.join(out, "json", "*.json"))):
    try:
        reports[os.path.basename(f)[:-5]] = json.load(open(f))
    except ValueError:
        pass
json.dump(reports, open(os.path.join(out, "reports.json"), "w"), indent=1)
PY
    rm -rf "$OUT/json"
    summarize || true
    echo "results in $OUT"
}
trap finish EXIT

{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(hostname)"
    echo "device of the *-gpu runs: $DEVICE"
    echo "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
    echo
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max \
            --format=csv 2>&1 || true
    else
        echo "nvidia-smi: not found"
    fi
    echo
    "$RANKWISE" info 2>&1 || true
    if [[ $DEVICE == gpu ]]; then
        echo
        timeout 120 "$RANKWISE" info --check-kernels 2>&1 | grep -E '^(kernels|rankwise)' || true
    fi
} >"$OUT/env.txt"
if [[ $DEVICE == gpu && -n $(missing) ]]; then
    cat "$OUT/env.txt" >&2
    step env "failed: CUDA libraries not found: $(missing | paste -sd' ' -)" 0
    die "CUDA libraries not found: $(missing | paste -sd' ' -) (see $OUT/env.txt)"
fi

# tests/gpu.rs, one process per test: a test that hangs loses only its own result.
if [[ -n $GPU_TESTS && -x $GPU_TESTS ]]; then
    echo "tests/gpu.rs: $GPU_TESTS" | tee "$OUT/tests.log"
    passed=0 partial=0 skipped=0 failed=0
    require=0
    [[ $DEVICE == gpu ]] && require=1
    filter=()
    for f in $TESTS_FILTER; do
        filter+=(-e "$f")
    done
    ((${#filter[@]})) || filter=(-e "")
    mapfile -t tests < <("$GPU_TESTS" --list --format terse 2>/dev/null | sed -n 's/: test$//p' |
        grep -F "${filter[@]}" || true)
    saved_timeout=$TIMEOUT
    TIMEOUT=$TEST_TIMEOUT
    one=$(mktemp)
    # A marker starts a line of the test's output, or follows libtest's `test NAME ... `
    # (with --nocapture the test's output continues that line).
    marked() { grep -Eq "(^|[.]{3} )$1" "$one"; }
    # What follows the first marker $1, less the test's name.
    why() { sed -En "s/^(.*[.]{3} )?$1//p" "$one" | head -n 1 | sed "s/^${t}[: ]*//"; }
    for t in "${tests[@]}"; do
        echo "== test $t" >>"$OUT/tests.log"
        rc=0
        timed "test $t" env RANKWISE_REQUIRE_GPU=$require \
            "$GPU_TESTS" --exact "$t" --nocapture --test-threads=1 >"$one" 2>&1 || rc=$?
        cat "$one" >>"$OUT/tests.log"
        if ((rc == 0)) && ! grep -q '^test result: ok\. 1 passed' "$one"; then
            # Exit 0 without the test having run (a name the binary does not know).
            restep "failed: ran no test"
            rc=1
        elif ((rc == 0)) && marked 'SKIPPED: '; then
            restep "skipped: $(why 'SKIPPED: ')"
            skipped=$((skipped + 1))
            echo "$t: $(last_outcome)"
            continue
        elif ((rc == 0)) && marked 'PART SKIPPED: '; then
            restep "ok, part skipped: $(why 'PART SKIPPED: ')"
            partial=$((partial + 1))
        fi
        if ((rc == 0)); then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
            echo "$t: $(last_outcome)"
        fi
    done
    rm -f "$one"
    TIMEOUT=$saved_timeout
    echo "tests/gpu.rs: $passed passed ($partial with a part skipped), $skipped skipped," \
        "$failed failed" | tee -a "$OUT/tests.log"
    ((failed == 0)) || status=1
else
    echo "no GPU test binary (make test builds it; a bundle has release/deps/gpu)" | tee "$OUT/tests.log"
fi

run() { # name, then rankwise arguments; the report as JSON in OUT/json/name.json
    local name=$1 rc=0
    shift
    echo "== $name: rankwise $*" >>"$OUT/runs.log"
    timed "$name" "$RANKWISE" "$@" --json >"$OUT/json/$name.json" 2>>"$OUT/runs.log" || rc=$?
    if ((rc != 0)); then
        rm -f "$OUT/json/$name.json"
        if ((rc != 125)); then
            echo "$name: $(last_outcome)" | tee -a "$OUT/runs.log"
            status=1
        fi
    fi
}

# The PCIe limit that staging runs against: page-locked host → device copies of 1 GiB,
# timed with CUDA events by the PyTorch of GPU node images, where there is one (the rest of
# the script needs none).
if [[ $DEVICE == gpu ]] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    timed pcie python3 - >"$OUT/json/pcie.json" 2>>"$OUT/runs.log" <<'PY' || status=1
import json, torch
n = 1 << 30
host = torch.empty(n, dtype=torch.uint8).pin_memory()
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
dev.copy_(host, non_blocking=True)
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
reps, best = 5, None
for _ in range(reps):
    start.record()
    dev.copy_(host, non_blocking=True)
    end.record()
    end.synchronize()
    s = start.elapsed_time(end) / 1e3
    best = s if best is None else min(best, s)
print(json.dumps({"bytes": n, "reps": reps, "best_seconds": best, "gb_per_s": n / best / 1e9}))
PY
fi

# A small run on both kinds of actor first: it warms the driver and NVRTC's cache, and its
# σ compare the two.
small=(rsvd --rows "$SMALL_ROWS" --cols "$COLS" --chunk-rows 50000 --dist genotype -k 10
    --power-iters 0 --precision f64)
run small-gpu "${small[@]}" --device "$DEVICE"
run small-cpu "${small[@]}" --device cpu
# The default PCA (LOBPCG to --tol, the precision chosen by accuracy) of a structured cohort
# with a flat tail, on both kinds of actor: passes, precision and residuals side by side.
if ((CONV_ROWS > 0)); then
    conv=(pca --rows "$CONV_ROWS" --cols "$CONV_COLS" --chunk-rows 25000 --populations 3 -k 10)
    run converged-gpu "${conv[@]}" --device "$DEVICE"
    run converged-cpu "${conv[@]}" --device cpu
fi
for p in $PRECISIONS; do
    run "rsvd-$p" rsvd --rows "$ROWS" --cols "$COLS" --chunk-rows "$CHUNK_ROWS" --dist genotype \
        -k 10 --power-iters 0 --precision "$p" --device "$DEVICE"
done

# Zarr → device: a genotype store decoded on the GPU (nvCOMP; on the host and staged 2-bit
# packed where the device cannot), against the host decode alone and a CPU actor.
if ((ZARR_ROWS > 0)); then
    store="$ZARR_DIR/genotypes-${ZARR_ROWS}x$COLS.zarr"
    if [[ ! -d $store ]]; then
        mkdir -p "$ZARR_DIR"
        echo "== gen: $store" >>"$OUT/runs.log"
        timed gen "$RANKWISE" gen --out "$store" --rows "$ZARR_ROWS" --cols "$COLS" \
            --chunk-rows "$ZARR_CHUNK" --dist genotype --codec blosc-zstd >>"$OUT/runs.log" 2>&1 ||
            { echo "gen: $(last_outcome)" | tee -a "$OUT/runs.log"; status=1; }
    fi
    if [[ -d $store ]]; then
        run zarr-read read --zarr "$store:call_dosage"
        # The same chunks decoded on the device (nvCOMP and the unshuffle kernels), where
        # the example was built (make build; a bundle's bin/device_decode).
        if [[ $DEVICE == gpu && -x $DEVICE_DECODE ]]; then
            echo "== zarr-device-decode: $DEVICE_DECODE $store:call_dosage" >>"$OUT/runs.log"
            timed zarr-device-decode "$DEVICE_DECODE" "$store:call_dosage" \
                >"$OUT/json/zarr-device-decode.json" 2>>"$OUT/runs.log" ||
                { rm -f "$OUT/json/zarr-device-decode.json"; status=1; }
        fi
        zarr=(pca --zarr "$store:call_dosage" -k 10 --power-iters 0 --precision f32)
        run zarr-gpu "${zarr[@]}" --device "$DEVICE"
        run zarr-cpu "${zarr[@]}" --device cpu
    fi
fi

# The exact SVD: panels generated and factored on the device, against CPU actors.
if ((SVD_ROWS > 0)); then
    svd=(svd --rows "$SVD_ROWS" --cols "$SVD_COLS" --chunk-rows "$SVD_CHUNK")
    run svd-gpu "${svd[@]}" --device "$DEVICE"
    run svd-cpu "${svd[@]}" --device cpu
fi

exit "$status"
