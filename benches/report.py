"""Turns one benches/run.sh run into a table and rewrites its section of RESULTS.md.

    python benches/report.py exact-svd --dir target/bench-results/<time> --results benches/RESULTS.md
    python benches/report.py kernels   --dir target/bench-results/<time> --results benches/RESULTS.md

Only the text between `<!-- BEGIN <section> -->` and `<!-- END <section> -->` is replaced;
a section that is not there yet is appended, and everything else in the file is kept, so
RESULTS.md stays hand-editable. Standard library only.
"""

import argparse
import datetime
import glob
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

HEADER = """# rankwise benchmarks

Figures written by `make bench` (or `make bench QUICK=1`) between the marked comments
below: `benches/run.sh`, `rsvd.sh`, `zarr.sh` and `reduce.sh` each rewrite their own section,
and `benches/summary.py` the summary at the top; notes outside the sections are kept. Raw
results of each run stay in `target/bench-results/`.

"""


# --------------------------------------------------------------------------------------
# Small helpers


def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def key_values(path):
    out = {}
    for line in Path(path).read_text().splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def load_json(path):
    text = Path(path).read_text()
    # The report is the last JSON object on stdout (nothing else is expected there).
    start = text.find("{")
    return json.loads(text[start:])


def utc(path):
    """A file's modification time, as `YYYY-MM-DD HH:MM UTC`."""
    stamp = datetime.datetime.fromtimestamp(Path(path).stat().st_mtime, datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%d %H:%M UTC")


def gib(nbytes):
    return f"{nbytes / 2**30:.2f} GiB"


def span(times):
    """`median (min–max)` of a list of seconds."""
    med = statistics.median(times)
    if len(times) == 1:
        return f"{med:.2f} s (1 run)"
    return f"{med:.2f} s ({min(times):.2f}–{max(times):.2f})"


def sci(x):
    return "—" if x is None else f"{x:.1e}"


def machine():
    lscpu = {}
    for line in sh("lscpu").splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            lscpu.setdefault(k.strip(), v.strip())
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = gib(int(line.split()[1]) * 1024)
    except OSError:
        pass
    model = lscpu.get("Model name", platform.processor() or "unknown CPU")
    family = lscpu.get("CPU family")
    if family:
        model += f" (family {family}, model {lscpu.get('Model', '?')})"
    cores = (
        f"{lscpu.get('CPU(s)', os.cpu_count())} CPUs = {lscpu.get('Socket(s)', '?')} socket(s) × "
        f"{lscpu.get('Core(s) per socket', '?')} cores × {lscpu.get('Thread(s) per core', '?')} "
        f"thread(s), {lscpu.get('NUMA node(s)', '?')} NUMA node(s)"
    )
    caches = ", ".join(
        f"{k.split()[0]} {lscpu[k]}" for k in ("L2 cache", "L3 cache") if k in lscpu
    )
    virt = lscpu.get("Hypervisor vendor")
    blas = sh("dpkg-query", "-W", "-f", "${Version}", "libopenblas0-pthread")
    thp = []
    for name in ("enabled", "defrag"):
        try:
            text = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text()
            chosen = re.search(r"\[([\w+]+)\]", text).group(1)
            thp.append(f"{name}={chosen}")
        except (OSError, AttributeError):
            pass
    return {
        "thp": f"transparent huge pages {', '.join(thp)}" if thp else "",
        "cpu": model,
        "cores": cores,
        "caches": caches,
        "virt": f"virtualized ({virt})" if virt else "",
        "memory": mem,
        "kernel": f"{platform.system()} {platform.release()}",
        "rustc": sh("rustc", "--version") or "rustc: not found",
        "openblas": f"system OpenBLAS {blas}" if blas else "system OpenBLAS (version unknown)",
        "python": f"Python {platform.python_version()}",
    }


def git_rev(out):
    """`git describe --always --dirty` as run.sh recorded it when it started."""
    try:
        return Path(out, "git.txt").read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def commands(out, snapshot=None, original=None):
    """The commands in order, repeated ones folded into `(×N)`, with the binary's private
    copy shown under its original path."""
    lines = Path(out, "commands.txt").read_text().splitlines()
    if snapshot and original:
        lines = [line.replace(snapshot, original) for line in lines]
    folded = []
    for line in lines:
        if folded and folded[-1][0] == line:
            folded[-1][1] += 1
        else:
            folded.append([line, 1])
    return [f"{c}   # ×{n}" if n > 1 else c for c, n in folded]


def loads(out):
    rows = []
    for line in Path(out, "load.txt").read_text().splitlines():
        stage, l1, l5, l15 = line.rsplit(" ", 3)
        rows.append((stage, l1, l5, l15))
    return rows


def replace_section(path, name, body):
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    path = Path(path)
    text = path.read_text() if path.exists() else HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def para(text, prefix="", indent=""):
    """One wrapped Markdown paragraph (or list item)."""
    return textwrap.fill(
        text, width=92, initial_indent=prefix, subsequent_indent=indent,
        break_long_words=False, break_on_hyphens=False,
    )


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def plain_table(header, rows):
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(cells[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells[1:]])


# --------------------------------------------------------------------------------------
# exact-svd


def exact_svd(args):
    out = Path(args.dir)
    membw = key_values(out / "membw.txt")
    membw1 = key_values(out / "membw-1thread.txt")
    dgemm = key_values(out / "dgemm.txt")
    dgemm_np = load_json(out / "dgemm-numpy.json")
    dgemm_avx = key_values(out / "dgemm-avx512.txt") if (out / "dgemm-avx512.txt").exists() else None
    resident = [load_json(p) for p in sorted(out.glob("rankwise-resident-*.json"))]
    regen = [load_json(p) for p in sorted(out.glob("rankwise-regenerate-*.json"))]
    check = load_json(out / "rankwise-check.json")
    npy = load_json(out / "numpy.json")
    dsk = load_json(out / "dask.json")
    freeze = (out / "pip-freeze.txt").read_text().split()
    m = machine()

    rows, cols = resident[0]["shape"]
    matrix_bytes = resident[0]["matrix_bytes"]
    copy_bw = max(float(membw["copy_gbs"]), float(membw1["copy_gbs"]))

    def rw(runs):
        secs = [r["seconds"] for r in runs]
        peak = max(max(p.get("peak_rss_bytes") or 0 for p in r["per_rank"]) for r in runs)
        gbs = matrix_bytes / statistics.median(secs) / 1e9
        return secs, peak, gbs

    res_s, res_peak, res_gbs = rw(resident)
    reg_s, reg_peak, reg_gbs = rw(regen)
    chk = check.get("check") or {}
    rw_acc = f"{sci(chk.get('relative_residual'))}"

    def sigma_diff(a, b):
        return max(abs(x - y) / abs(y) for x, y in zip(a, b))

    same_sigma = sigma_diff(regen[0]["singular_values"], resident[0]["singular_values"])

    size = f"{rows:,} × {cols} f64 ({matrix_bytes / 1e9:.2f} GB)"
    ratio = lambda peer, mine: f"{statistics.median(peer) / statistics.median(mine):.1f}×"  # noqa: E731
    frac = lambda gbs: f"{100 * gbs / copy_bw:.0f} %"  # noqa: E731
    np_name = f"NumPy {npy['numpy']} `np.linalg.svd` (LAPACK gesdd, {args.threads} BLAS threads)"
    dask_name = f"Dask {dsk['dask']} `da.linalg.svd` (TSQR, threaded scheduler, {dsk['workers']} workers)"
    header = [
        "workload",
        "size",
        "peer",
        "peer time",
        "rankwise time",
        "ratio (peer / rankwise)",
        "peer peak RSS",
        "rankwise peak RSS",
        "rankwise GB/s of matrix",
        "of copy bandwidth",
        "rel. residual (peer / rankwise)",
    ]
    table = [
        [
            "exact SVD; peer: SVD only, matrix already in memory",
            size,
            np_name,
            span(npy["svd_seconds"]["all"]),
            span(res_s),
            ratio(npy["svd_seconds"]["all"], res_s),
            gib(npy["peak_rss_bytes"]),
            gib(res_peak),
            f"{res_gbs:.2f}",
            frac(res_gbs),
            f"{sci(npy['relative_residual'])} / {rw_acc}",
        ],
        [
            "exact SVD incl. generation; peer: generate in memory + SVD",
            size,
            np_name,
            span(npy["total_seconds"]["all"]),
            span(res_s),
            ratio(npy["total_seconds"]["all"], res_s),
            gib(npy["peak_rss_bytes"]),
            gib(res_peak),
            f"{res_gbs:.2f}",
            frac(res_gbs),
            f"{sci(npy['relative_residual'])} / {rw_acc}",
        ],
        [
            "exact SVD incl. generation, chunked",
            size,
            dask_name,
            span(dsk["seconds"]["all"]),
            span(res_s),
            ratio(dsk["seconds"]["all"], res_s),
            gib(dsk["peak_rss_bytes"]),
            gib(res_peak),
            f"{res_gbs:.2f}",
            frac(res_gbs),
            f"{sci(dsk['relative_residual'])} / {rw_acc}",
        ],
        [
            f"same, rankwise regenerating each pass (`--memory-per-actor {args.regen_memory}`)",
            size,
            dask_name,
            span(dsk["seconds"]["all"]),
            span(reg_s),
            ratio(dsk["seconds"]["all"], reg_s),
            gib(dsk["peak_rss_bytes"]),
            gib(reg_peak),
            f"{reg_gbs:.2f}",
            frac(reg_gbs),
            f"{sci(dsk['relative_residual'])} / σ as resident (max rel. diff {same_sigma:.0e})",
        ],
    ]

    now = utc(out / "dask.json")  # the last measurement
    load_rows = loads(out)
    load_text = "; ".join(f"{s}: {l1} / {l5} / {l15}" for s, l1, l5, l15 in load_rows)
    median_run = sorted(resident, key=lambda r: r["seconds"])[len(resident) // 2]
    rank_phases = median_run["per_rank"][0].get("timings", [])
    shares = {p["phase"]: p for p in (median_run.get("machine_limit") or {}).get("passes", [])}

    def phase_text(t):
        p = shares.get(t["phase"])
        at = f" (limit {p['limit_seconds']:.2f} s, {100 * p['share']:.0f} %)" if p else ""
        return f"{t['phase']} {t['seconds']:.2f} s{at}"

    phases = ", ".join(phase_text(t) for t in rank_phases if t["seconds"] >= 0.01)
    limit = median_run.get("machine_limit")
    if limit:
        whole = sum(p["limit_seconds"] for p in limit["passes"])
        phases += (
            f"; the machine limit (`--machine-limit`: each pass's flops at the "
            f"{limit['gemm_gflop_per_s']:.1f} GFLOP/s of a DGEMM on the run's threads"
            + (f" with OpenBLAS's {limit['gemm_kernels']} kernels" if limit.get("gemm_kernels") else "")
            + (f", {limit['pinned_gemm_gflop_per_s']:.1f} with the ones rankwise pins"
               if limit.get("pinned_gemm_gflop_per_s") else "")
            + ", and its "
            f"values at the {limit['production_gb_per_s']:.1f} GB/s they are generated at) is "
            f"{whole:.2f} s for the run, {100 * whole / median_run['seconds']:.0f} % of its "
            f"{median_run['seconds']:.2f} s"
        )
    sig = lambda s: f"σ₁ {s[0]:.2f}, σ₂ {s[1]:.2f}, σ₂₀ {s[-1]:.2f}"  # noqa: E731
    pins = [p for p in freeze if p.split("==")[0].lower() in ("dask", "numpy")]
    others = [p for p in freeze if p not in pins]

    try:
        version, built = Path(out, "binary.txt").read_text().splitlines()[:2]
    except (OSError, ValueError):
        version, built = "rankwise", "unknown"
    reps = len(npy["svd_seconds"]["all"])
    flag = " --quick" if args.mode == "quick" else ""
    blocks = [
        f"## Exact SVD of a generated {rows:,} × {cols} float64 matrix, one process",
        para(
            f"Run of `bash benches/run.sh{flag}` ({args.mode}: rankwise {len(resident)} runs per mode, "
            f"NumPy and Dask {reps} repetitions each), finished {now}. Binary `{args.bin}` "
            f"({version}, built {built}, run from a copy "
            f"taken at the start); working tree at git {git_rev(out)} when the run started."
        ),
        para(
            f"**Machine**: {m['cpu']}; {m['cores']}; {m['caches']}; {m['memory']} memory"
            f"{'; ' + m['virt'] if m['virt'] else ''}; {m['kernel']}{'; ' + m['thp'] if m['thp'] else ''}; "
            f"{m['rustc']}; {m['openblas']} "
            f"(the one rankwise links); {m['python']}."
        ),
        para(
            f"**Measured in the same run**: memory bandwidth (`tools/membw.c`, STREAM-like, "
            f"3 arrays of {membw['array_mib']} MiB, best of {membw['reps']}): copy {membw['copy_gbs']} GB/s, "
            f"read {membw['read_gbs']} GB/s, triad {membw['triad_gbs']} GB/s with {membw['threads']} threads; "
            f"copy {membw1['copy_gbs']} GB/s, triad {membw1['triad_gbs']} GB/s with 1 thread. The "
            f"\"of copy bandwidth\" column divides by the better copy figure, {copy_bw:.2f} GB/s. "
            f"DGEMM {dgemm['n']}³ (best of {args.dgemm_reps}): {dgemm['gflops']} GFLOP/s with the system "
            f"OpenBLAS (`tools/dgemm.c`, {dgemm['threads']} threads, {dgemm.get('core', 'its own')} kernels as rankwise runs them), "
            + (f"{dgemm_avx['gflops']} GFLOP/s with its AVX-512 (SkylakeX) kernels, " if dgemm_avx else "")
            + f"{dgemm_np['gflops']:.1f} GFLOP/s "
            f"with NumPy's bundled OpenBLAS (`np.dot`, OPENBLAS_NUM_THREADS={args.threads})."
        ),
        para(
            f"**Load averages** (1 / 5 / 15 min) at the start of each stage: {load_text}. The "
            f"machine has {os.cpu_count()} CPUs and the benchmark itself keeps up to "
            f"{args.threads} of them busy, so a 1-minute load near {args.threads} is its own; well "
            f"above that, other processes competed for the CPUs and the times are inflated."
        ),
        markdown_table(header, table),
        "\n".join(
            para(item, prefix="- ", indent="  ")
            for item in [
                "Times are the median of the runs, with (min–max). rankwise's time is the whole "
                "`svd` command as its report measures it (generation, both passes, the tree), "
                "without process start-up. Ratio > 1: rankwise is faster.",
                f"rankwise phases (median resident run): {phases}.",
                f"NumPy's generation (`default_rng().random`, one thread) took "
                f"{span(npy['generate_seconds']['all'])} apart from the SVD; NumPy's peak RSS "
                f"includes the matrix, U and LAPACK's copy of the matrix. Its first repetition "
                f"pays first-touch page faults on fresh memory (NumPy asks for huge pages, "
                f"which can stall in compaction), hence the spread.",
                f"Dask runs with OPENBLAS_NUM_THREADS=1 (one BLAS thread per worker), NumPy with "
                f"OPENBLAS_NUM_THREADS={args.threads}. Peak RSS of the references is the Python "
                f"process's `ru_maxrss` right after the timed repetitions; rankwise's is the "
                f"report's VmHWM, the largest over its runs.",
                f"Relative residual ‖A − UΣVᵀ‖_F / ‖A‖_F: rankwise's from one `--check` run "
                f"(max |UᵀU − I| {sci(chk.get('u_orthogonality'))}, max |VᵀV − I| "
                f"{sci(chk.get('v_orthogonality'))}); NumPy's and Dask's computed after their "
                f"timed runs (max |UᵀU − I| {sci(npy['u_orthogonality'])} and "
                f"{sci(dsk['u_orthogonality'])}).",
                f"The three matrices are different draws of one distribution (uniform on [0, 1)), "
                f"so their singular values agree only statistically: rankwise "
                f"{sig(resident[0]['singular_values'])}; NumPy {sig(npy['singular_values'])}; "
                f"Dask {sig(dsk['singular_values'])}.",
                f"Python (`./bench-venv`): {', '.join(pins)}; with {', '.join(others)}.",
            ]
        ),
        "Commands, in order (from the repository root):",
        "```bash\n" + "\n".join(commands(out, args.snapshot or str(out / "rankwise"), args.bin)) + "\n```",
    ]
    body = "\n\n".join(blocks) + "\n"
    replace_section(args.results, "exact-svd", body)
    print(plain_table(header, table))
    print(f"\nload averages (1/5/15 min): {load_text}")
    print(f"copy bandwidth {copy_bw:.2f} GB/s; DGEMM {dgemm['gflops']} GFLOP/s (system OpenBLAS), "
          f"{dgemm_np['gflops']:.1f} GFLOP/s (NumPy)")
    print(f"rankwise --check: relative residual {rw_acc}; wrote {args.results}")


# --------------------------------------------------------------------------------------
# kernels (criterion)


def kernels(args):
    out = Path(args.dir)
    since = (out / "pip-freeze.txt").stat().st_mtime
    rows = []
    newest = []
    for bench in sorted(glob.glob("target/criterion/**/new/benchmark.json", recursive=True)):
        est_path = Path(bench).with_name("estimates.json")
        if not est_path.exists() or est_path.stat().st_mtime < since:
            continue
        newest.append(bench)
        meta = json.loads(Path(bench).read_text())
        est = json.loads(est_path.read_text())
        med = est["median"]["point_estimate"]  # ns
        lo = est["median"]["confidence_interval"]["lower_bound"]
        hi = est["median"]["confidence_interval"]["upper_bound"]
        tp = (meta.get("throughput") or {}).get("Bytes")

        def t(ns):
            for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
                if ns >= scale:
                    return f"{ns / scale:.3g} {unit}"
            return f"{ns:.3g} ns"

        rows.append(
            [
                f"{meta['group_id']}/{meta['function_id']}",
                meta.get("value_str", ""),
                t(med),
                f"{t(lo)} – {t(hi)}",
                f"{tp / med:.2f}" if tp else "—",
            ]
        )
    if not rows:
        print("no criterion results newer than this run", file=sys.stderr)
        return
    order = ["generator", "panel_factor", "allreduce_local_2_ranks", "zarr_decode"]

    def key(row):
        group = row[0].split("/")[0]
        cells = 1
        for part in re.findall(r"\d+", row[1]):
            cells *= int(part)
        return (order.index(group) if group in order else len(order), row[0], cells)

    rows.sort(key=key)
    header = ["benchmark", "size", "median", "median, 95 % CI", "GB/s"]
    load_rows = [r for r in loads(out) if r[0] == "criterion kernels"]
    load_text = " / ".join(load_rows[-1][1:]) if load_rows else "not recorded"
    now = max(utc(Path(b).with_name("estimates.json")) for b in newest)
    text = (
        f"{now}, same machine as above; load average at the start (1 / 5 / 15 min): "
        f"{load_text}. Ten samples each (`benches/kernels.rs`); GB/s counts the f64 bytes of "
        f"the panel or buffer (for `zarr_decode`, the decoded float32 bytes of the band, "
        f"Blosc lz4 + bitshuffle, one thread). `panel_factor` includes the generator filling "
        f"the panel block by block, as in the SVD's first pass; `allreduce` runs on a two-rank "
        f"`Local` world "
        f"(two threads of one process)."
    )
    body = (
        "## Kernels (criterion, `cargo bench --bench kernels`)\n\n"
        + para(text)
        + "\n\n"
        + markdown_table(header, rows)
        + "\n"
    )
    replace_section(args.results, "kernels", body)
    print(plain_table(header, rows))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("section", choices=["exact-svd", "kernels"])
    p.add_argument("--dir", required=True)
    p.add_argument("--results", default="benches/RESULTS.md")
    p.add_argument("--mode", default="full")
    p.add_argument("--bin", default="target/release/rankwise")
    p.add_argument("--snapshot", help="the private copy of --bin that the run used")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--regen-memory", default="500M")
    p.add_argument("--dgemm-reps", type=int, default=3)
    args = p.parse_args()
    {"exact-svd": exact_svd, "kernels": kernels}[args.section](args)


if __name__ == "__main__":
    main()
