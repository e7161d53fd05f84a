"""One table of every workload of `make bench`, at the top of benches/RESULTS.md.

    python benches/summary.py [--results benches/RESULTS.md] [--runs target/bench-results]

Reads the raw results the benchmark scripts keep under target/bench-results/ (the newest
run of each script: `<date>-<time>/` of benches/run.sh, `rsvd-*/`, `zarr-*/`, `reduce-*/`,
`plink-*/`, `peers-*/`)
and rewrites the section between `<!-- BEGIN summary -->` and `<!-- END summary -->`,
placing it before every other section the first time. A workload whose results are missing
shows "not run"; one whose run failed shows the recorded failure. Columns: workload, size,
peer, peer time, rankwise time, ratio (peer / rankwise), peak memory of each, accuracy of
each, and rankwise's fraction of the machine's limit (memory bandwidth or DGEMM rate,
measured by the harness in the same `make bench`). Standard library only.
"""

import argparse
import glob
import json
import os
import re
import statistics
import sys
from pathlib import Path

# report.py (the section writer and machine description of benches/run.sh) sits beside this
# file; importing it must not leave a __pycache__ in benches/.
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import gib, machine, markdown_table, para, replace_section  # noqa: E402

NOT_RUN = "not run"


# --------------------------------------------------------------------------------------
# Reading a run directory


def newest(runs, pattern):
    """The newest run directory matching `pattern` (names sort by their time stamps)."""
    found = sorted(d for d in glob.glob(os.path.join(runs, pattern)) if os.path.isdir(d))
    return Path(found[-1]) if found else None


def load(path):
    try:
        text = Path(path).read_text()
        return json.loads(text[text.find("{"):])
    except (OSError, ValueError):
        return None


def key_values(path):
    out = {}
    try:
        for line in Path(path).read_text().splitlines():
            k, _, v = line.partition("=")
            if v:
                out[k.strip()] = v.strip()
    except OSError:
        pass
    return out


def failure(d, name):
    """Why `name` has no result in `d`: the recorded failure, or not run."""
    if d is not None:
        f = d / f"{name}.failed"
        if f.exists():
            return f.read_text().strip() or "failed"
    return NOT_RUN


def rankwise(d, pattern):
    """rankwise's reports matching `pattern` in `d`: median time, spread, peak RSS."""
    if d is None:
        return None
    reports = [r for r in (load(f) for f in sorted(d.glob(pattern))) if r]
    if not reports:
        return None
    if reports[0].get("command") == "tasks":
        times = reports[0]["run_seconds"]
    else:
        times = [r["seconds"] for r in reports]
    def rss(r):
        return [(x.get("peak_rss_bytes") or 0) for x in r.get("per_rank", [{}])]

    # The run whose time is the median (the lower middle of an even count).
    middle = sorted(zip(times, range(len(times))))[(len(times) - 1) // 2][1]
    return {
        "report": reports[0],
        "median_report": reports[middle] if len(reports) == len(times) else reports[0],
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "runs": len(times),
        "peak_rss_bytes": max(max(rss(r)) for r in reports),
        # Every rank's peak added up: a multi-rank job's footprint on the node.
        "peak_rss_total_bytes": max(sum(rss(r)) for r in reports),
    }


def rankwise_total(d, pattern):
    """As `rankwise`, with every rank's peak RSS added up as the peak RSS."""
    r = rankwise(d, pattern)
    return r and {**r, "peak_rss_bytes": r["peak_rss_total_bytes"]}


def captured_residual(report):
    """(‖A‖_F² − Σσ²)^½/‖A‖_F from a rankwise report's own ‖A‖_F² and σ, or None."""
    tss, s = report.get("total_sum_squares"), report.get("singular_values") or []
    if not tss:
        return None
    return max(tss - sum(v * v for v in s), 0) ** 0.5 / tss ** 0.5


def peers_result(d, name):
    """A benches/reference_peers.py result in `d` (Heat's peak RSS is already every rank's
    added up), with the whole job's median, min and max at the top level."""
    r = peer(d, name)
    if r is None:
        return None
    return {**r, "runs": len(r.get("times") or [])}


def peer(d, name):
    """A peer's JSON result in `d`, with its median under "median"."""
    if d is None:
        return None
    r = load(d / f"{name}.json")
    if r is None:
        return None
    if "median" not in r and isinstance(r.get("seconds"), dict):  # benches/reference.py
        r = {**r, **r["seconds"]}
    return r


# --------------------------------------------------------------------------------------
# Formatting


def secs(r, why=NOT_RUN):
    if r is None:
        return why
    runs = r.get("runs") or len(r.get("times") or r.get("all") or [0])
    unit, scale = ("ms", 1e3) if r["median"] < 0.1 else ("s", 1.0)

    def fmt(x):
        return f"{x * scale:.3g}" if unit == "ms" else f"{x:.2f}"

    spread = f" ({fmt(r['min'])}–{fmt(r['max'])})" if r.get("max", 0) > r.get("min", 0) else ""
    return f"{fmt(r['median'])} {unit}{spread}" + (f", {runs} runs" if runs > 1 else ", 1 run")


def ratio(p, r):
    if p is None or r is None:
        return "—"
    return f"{p['median'] / r['median']:.1f}×"


def mem(r):
    return gib(r["peak_rss_bytes"]) if r and r.get("peak_rss_bytes") else "—"


def pct(x):
    return f"{x:.1%}" if x is not None else "—"


def rows_text(shape, dtype="float64"):
    return f"{shape[0]:,} × {shape[1]:,} {dtype}"


# --------------------------------------------------------------------------------------
# The workloads


def machine_limits(runs):
    """Copy bandwidth (GB/s) and the machine's DGEMM rate (GFLOP/s) of the newest
    benches/run.sh run: the best of the system OpenBLAS with the kernels rankwise pins,
    with its AVX-512 kernels, and NumPy's bundled OpenBLAS, all measured in that run."""
    d = newest(runs, "[0-9]" * 8 + "-" + "[0-9]" * 6)
    if d is None:
        return None, None, None
    bw = key_values(d / "membw.txt").get("copy_gbs")
    rates = [key_values(d / f).get("gflops") for f in ("dgemm.txt", "dgemm-avx512.txt")]
    rates.append((load(d / "dgemm-numpy.json") or {}).get("gflops"))
    rates = [float(r) for r in rates if r]
    return d, float(bw) if bw else None, max(rates) if rates else None


def exact_svd(runs, copy_bw):
    d = newest(runs, "[0-9]" * 8 + "-" + "[0-9]" * 6)
    r = rankwise(d, "rankwise-resident-*.json")
    dk = peer(d, "dask")
    chk = load(d / "rankwise-check.json") if d else None
    shape = (r or {}).get("report", {}).get("shape", [10_000_000, 20])
    racc = "—"
    if chk and chk.get("check"):
        racc = f"residual {chk['check']['relative_residual']:.1e}"
    rate = None
    if r and copy_bw:
        rate = shape[0] * shape[1] * 8 / r["median"] / 1e9 / copy_bw
    # The runs' own machine limit (`svd --machine-limit`: each pass's flops at the DGEMM
    # probe's rate, its values at the generator's): its time over the run's, median run.
    limits = []
    for f in sorted(d.glob("rankwise-resident-*.json")) if d else []:
        rep = load(f)
        if rep and rep.get("machine_limit"):
            whole = sum(p["limit_seconds"] for p in rep["machine_limit"]["passes"])
            limits.append((rep["seconds"], whole / rep["seconds"]))
    limit = "—"
    if limits:
        share = sorted(limits)[len(limits) // 2][1]
        limit = (f"{pct(share)} of the machine limit (`--machine-limit`: flops at DGEMM's "
                 f"rate, values at the generator's)")
        if rate:
            limit += f"; {pct(rate)} of copy bandwidth"
    elif rate:
        limit = f"{pct(rate)} of copy bandwidth (matrix bytes / time)"
    return [
        {
            "workload": "(1) exact SVD, `da.linalg.svd` (TSQR)",
            "size": rows_text(shape),
            "peer": "Dask `da.linalg.svd`",
            "p": dk,
            "pwhy": failure(d, "dask"),
            "r": r,
            "rwhy": failure(d, "rankwise-resident"),
            "pacc": f"residual {dk['relative_residual']:.1e}" if dk else "—",
            "racc": racc,
            "limit": limit,
            "dir": d,
        }
    ]


def gemm_limit(r, dgemm):
    """The limit column of a randomized run: its share of the machine limit its median
    run's report measured (`--machine-limit`: flops at the machine's best GEMM rate, and for a float
    matrix the values at the rate its threads produce them), with its GEMMs' share of that
    rate; for runs without one, its GEMM rate against the run.sh DGEMM."""
    rep = (r or {}).get("median_report") or (r or {}).get("report", {})
    gflops = rep.get("gemm_gflop_per_s")
    ml = rep.get("machine_limit")
    if ml and rep.get("seconds"):
        whole = sum(p["limit_seconds"] for p in ml["passes"])
        values = ", values at the rate they are produced at" if ml.get("production_gb_per_s") else ""
        kernels = f" ({ml['gemm_kernels']} kernels)" if ml.get("gemm_kernels") else ""
        return (f"{pct(whole / rep['seconds'])} of the machine limit (`--machine-limit`: flops at "
                f"the best GEMM's {ml['gemm_gflop_per_s']:.0f} GFLOP/s{kernels}{values}); "
                f"GEMMs at {pct(gflops / ml['gemm_gflop_per_s'])} of that GEMM")
    return f"{pct(gflops / dgemm)} of DGEMM (GEMM GFLOP/s)" if gflops and dgemm else "—"


def rsvd(runs, dgemm):
    d = newest(runs, "rsvd-*")
    out = []

    def row(label, rname, dname, dtype, full):
        r = rankwise(d, f"{rname}.[0-9]*.json")
        p = peer(d, dname) if dname else None
        shape = (r or {}).get("report", {}).get("shape") or (p or {}).get("shape") or full
        est = ((r or {}).get("report", {}).get("error_estimate") or {}).get("relative_frobenius")
        out.append(
            {
                "workload": label,
                "size": rows_text(shape, dtype),
                "peer": "Dask `svd_compressed`",
                "p": p,
                "pwhy": failure(d, dname) if dname else "skipped by benches/rsvd.sh (too long)",
                "r": r,
                "rwhy": failure(d, rname),
                "pacc": f"residual {p['relative_residual']:.4f}" if p else "—",
                "racc": f"residual est. {est:.4f}" if est is not None else "—",
                "limit": gemm_limit(r, dgemm),
                "dir": d,
            }
        )

    # The full run's shapes stand where nothing ran (a quick run's are read from its results).
    full_200k, full_1m = [200_000, 20_000], [1_000_000, 20_000]
    rsvd_label = "(2) `svd_compressed(k=10)`, q = 0"
    row(rsvd_label, "f64-200k", "dask-f64-200k-blas1", "float64", full_200k)
    # The full run only (benches/rsvd.sh --quick skips Dask at this size).
    row(rsvd_label, "f64-1m", "dask-f64-1m-blas1", "float64", full_1m)
    for q in (0, 2):
        label = f"(3) genotype PCA, persisted uint8, q = {q}"
        row(label, f"geno-q{q}-f64", f"dask-geno-q{q}", "uint8", full_200k)
    return out


def timed(d, name):
    """benches/plink.sh's runs of `name` (wall seconds and peak RSS per run) as a result."""
    if d is None:
        return None
    reports = [r for r in (load(f) for f in sorted(d.glob(f"{name}.[0-9]*.json"))) if r]
    if not reports:
        return None
    times = [r["seconds"] for r in reports]
    return {
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "runs": len(times),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in reports),
    }


def plink(runs):
    """(7): `rankwise pca --bed` (defaults) against `plink2 --pca approx`, k = 10, each with
    its accuracy against the run's reference (benches/plink_report.py)."""
    d = newest(runs, "plink-*")
    p, r = timed(d, "plink2-k10"), timed(d, "rw-k10")
    # The first run's log is its JSON report.
    rep = (load(d / "rw-k10.1.log") if d else None) or {}
    ref = (load(d / "ref.log") if d else None) or {}
    shape = rep.get("shape") or [200_000, 20_000]

    def evs(path):
        try:
            return [float(x) for x in Path(path).read_text().split()]
        except (OSError, ValueError):
            return None

    def worst(ev):
        if not ev or not ref.get("eigenvalues"):
            return "—"
        e = max(abs(a - b) / b for a, b in zip(ev[:10], ref["eigenvalues"][:10]))
        return f"λ₁…λ₁₀ within {e:.0e} of the reference"

    pe = evs(d / "plink2-k10.eigenval") if d else None
    conv = rep.get("convergence") or {}
    racc = worst(rep.get("eigenvalues"))
    if conv:
        racc += f"; {'converged' if conv.get('converged') else 'NOT converged'}"
    return [
        {
            "workload": "(7) genotype PCA from a PLINK .bed, k = 10",
            "size": rows_text(shape, "2-bit .bed"),
            "peer": "PLINK 2 `--pca approx`",
            "p": p,
            "pwhy": failure(d, "plink2-k10"),
            "r": r,
            "rwhy": failure(d, "rw-k10"),
            "pacc": worst(pe),
            "racc": racc,
            "limit": "—",
            "dir": d,
        }
    ]


def peers(runs):
    """Heat and Cubed (benches/peers.sh), on the workloads of (1), (2), (4) and (5) at the
    sizes that script runs."""
    d = newest(runs, "peers-*")
    if d is None:
        return []

    def shape(name, default):
        return (load(d / f"{name}.1.json") or {}).get("shape") or default

    def resid(p):
        return f"residual {p['relative_residual']:.2g}" if p else "—"

    def rw_resid(name):
        x = captured_residual(load(d / f"{name}.1.json") or {})
        return "—" if x is None else f"residual {x:.4f}"

    check = ((load(d / "rw-svd-check.1.json") or {}).get("check") or {}).get("relative_residual")
    svd_acc = f"residual {check:.2g}" if check is not None else "—"
    store = load(d / "zarr-store.json") or {}
    red = load(d / "rw-reduce.1.json") or {}
    red_shape = red.get("shape") or [50_000, 50_000]
    rows = []

    def row(workload, size, peer_label, pname, rname, pacc, racc):
        p, r = peers_result(d, pname), rankwise_total(d, f"{rname}.*.json")
        rows.append({
            "workload": workload, "size": size, "peer": peer_label,
            "p": p, "pwhy": failure(d, pname), "r": r, "rwhy": failure(d, rname),
            "pacc": pacc(p), "racc": racc, "limit": "—", "dir": d,
        })

    svd_shape = shape("rw-svd-1", [10_000_000, 20])
    row("(1) exact SVD, 2 MPI ranks each", rows_text(svd_shape), "Heat `ht.linalg.svd`",
        "heat-svd", "rw-svd-mpi", resid, svd_acc)
    row("(1) exact SVD, one process", rows_text(svd_shape), "Cubed `xp.linalg.svd`",
        "cubed-svd", "rw-svd-1", resid, svd_acc)
    rsvd_shape = shape("rw-rsvd-q0", [100_000, 20_000])
    for q in (0, 2):
        row(f"(2) `rsvd -k 10`, q = {q}, 2 MPI ranks each", rows_text(rsvd_shape),
            "Heat `ht.linalg.rsvd`", f"heat-rsvd-q{q}", f"rw-rsvd-q{q}",
            lambda p: f"residual {p['relative_residual']:.4f}" if p else "—",
            rw_resid(f"rw-rsvd-q{q}"))
    row("(5) `rsvd -k 10` of a zarr-python store, q = 0, 2 MPI ranks each",
        rows_text(store.get("shape") or [200_000, 5_000], "float32, Zarr v3 Blosc"),
        "Heat `ht.load_zarr` + `rsvd`", "heat-zarr", "rw-zarr",
        lambda p: f"residual {p['relative_residual']:.4f}" if p else "—", rw_resid("rw-zarr"))
    row("(4) `(x + 1)[::2, ::2].sum()`, uniform", rows_text(red_shape) + ", chunks "
        f"{red.get('chunk_rows', 10_000):,}²", "Cubed, threads executor", "cubed-reduce",
        "rw-reduce", lambda p: f"z = {p['z']:+.2f}" if p else "—",
        f"z = {red['z_score']:+.2f}" if "z_score" in red else "—")
    return rows


def zarr(runs, copy_bw, dgemm):
    d = newest(runs, "zarr-*")
    out = []
    w = load(d / "write-v3.json") if d else None
    shape = (w or {}).get("shape") or [200_000, 5_000]
    size = rows_text(shape, "float32, Zarr v3 Blosc")
    r = rankwise(d, "rw-read-v3.[0-9]*.json")
    p = peer(d, "dask-read-v3")
    rate = None
    if r and copy_bw:
        rate = r["report"]["decoded_bytes"] / r["median"] / 1e9 / copy_bw
    out.append(
        {
            "workload": "(5) read every chunk of a zarr-python store",
            "size": size,
            "peer": "Dask `da.from_zarr(...).sum()`",
            "p": p,
            "pwhy": failure(d, "dask-read-v3"),
            "r": r,
            "rwhy": failure(d, "rw-read-v3"),
            "pacc": f"sum {p['sum']:.10g}" if p else "—",
            "racc": f"sum {r['report']['sum']:.10g}" if r else "—",
            "limit": f"{pct(rate)} of copy bandwidth (decoded bytes / time)" if rate else "—",
            "dir": d,
        }
    )
    r = rankwise(d, "rw-rsvd-q0-v3.[0-9]*.json")
    p = peer(d, "dask-svd-q0-v3")
    est = ((r or {}).get("report", {}).get("error_estimate") or {}).get("relative_frobenius")
    out.append(
        {
            "workload": "(5) `svd_compressed(k=10)` of a zarr-python store, q = 0",
            "size": size,
            "peer": "Dask `da.from_zarr` + `svd_compressed`",
            "p": p,
            "pwhy": failure(d, "dask-svd-q0-v3"),
            "r": r,
            "rwhy": failure(d, "rw-rsvd-q0-v3"),
            "pacc": f"residual {p['relative_residual']:.4f}" if p else "—",
            "racc": f"residual est. {est:.4f}" if est is not None else "—",
            "limit": gemm_limit(r, dgemm),
            "dir": d,
        }
    )
    return out


def reduce_and_tasks(runs):
    d = newest(runs, "reduce-*")
    bw = key_values(d / "membw.txt").get("copy_gbs") if d else None
    bw = float(bw) if bw else None
    out = []
    r = rankwise(d, "rw-reduce.[0-9]*.json")
    chk = rankwise(d, "rw-reduce-check.[0-9]*.json")
    p = peer(d, "dask-reduce")
    rep = (r or {}).get("report", {})
    shape = rep.get("shape") or (p or {}).get("shape") or [50_000, 50_000]
    chunk = rep.get("chunk_rows") or ((p or {}).get("chunks") or [10_000])[0]
    racc = f"z = {rep['z_score']:+.2f}" if rep.get("z_score") is not None else "—"
    if chk and (chk["report"].get("check") or {}).get("relative_difference") is not None:
        racc += f", rounding {chk['report']['check']['relative_difference']:.0e}"
    rate = rep["values_bytes"] / r["median"] / 1e9 / bw if r and bw else None
    out.append(
        {
            "workload": "(4) `(x + 1)[::2, ::2].sum()`, standard normal",
            "size": f"{rows_text(shape)}, chunks {chunk:,}²",
            "peer": "Dask threaded",
            "p": p,
            "pwhy": failure(d, "dask-reduce"),
            "r": r,
            "rwhy": failure(d, "rw-reduce"),
            "pacc": f"z = {p['z_score']:+.2f}" if p else "—",
            "racc": racc,
            "limit": f"{pct(rate)} of copy bandwidth (values summed / time)" if rate else "—",
            "dir": d,
        }
    )
    for rname, dname, label, peer_name in [
        ("rw-tasks", "dask-tasks", "(6) no-op task per chunk", "Dask `threaded.get`"),
        (
            "rw-tasks-array",
            "dask-tasks-array",
            "(6) no-op task per chunk, array form",
            "Dask `map_blocks` + `persist`",
        ),
    ]:
        r = rankwise(d, f"{rname}.[0-9]*.json")
        p = peer(d, dname)
        full = 1_000_000 if rname == "rw-tasks" else 100_000
        n = (r or {}).get("report", {}).get("tasks") or (p or {}).get("tasks") or full
        runs_ok = r and all(x == n for x in r["report"].get("tasks_run", []))
        out.append(
            {
                "workload": label,
                "size": f"{n:,} tasks",
                "peer": peer_name,
                "p": p,
                "pwhy": failure(d, dname),
                "r": r,
                "rwhy": failure(d, rname),
                "pacc": f"{p['microseconds_per_task']:.1f} µs/task" if p else "—",
                "racc": (
                    f"{r['median'] / n * 1e6:.2f} µs/task" + ("" if runs_ok else ", TASKS LOST")
                )
                if r
                else "—",
                "limit": "— (no hardware limit applies)",
                "dir": d,
            }
        )
    return out, d, bw


# --------------------------------------------------------------------------------------
# The section


def place_first(path, name, body):
    """Writes the section; the first time, before every other marked section."""
    begin = f"<!-- BEGIN {name} -->"
    text = Path(path).read_text() if Path(path).exists() else ""
    if begin in text or "<!-- BEGIN " not in text:
        replace_section(path, name, body)
        return
    at = text.index("<!-- BEGIN ")
    block = f"{begin}\n{body.rstrip()}\n<!-- END {name} -->\n\n"
    tmp = Path(path).with_suffix(".md.tmp")
    tmp.write_text(text[:at] + block + text[at:])
    tmp.replace(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=os.environ.get("BENCH_RESULTS", "benches/RESULTS.md"))
    p.add_argument("--runs", default="target/bench-results")
    args = p.parse_args()

    limits_dir, copy_bw, dgemm = machine_limits(args.runs)
    rows = exact_svd(args.runs, copy_bw)
    rows += rsvd(args.runs, dgemm)
    rows += zarr(args.runs, copy_bw, dgemm)
    reduce_rows, reduce_dir, reduce_bw = reduce_and_tasks(args.runs)
    rows += reduce_rows
    rows += plink(args.runs)
    rows += peers(args.runs)
    # In the order of workloads: (1) … (6).
    rows.sort(key=lambda x: x["workload"][:3])  # stable: Dask's row first in each

    header = [
        "workload",
        "size",
        "peer",
        "peer time",
        "rankwise time",
        "ratio",
        "peer peak RSS",
        "rankwise peak RSS",
        "peer accuracy",
        "rankwise accuracy",
        "rankwise of machine limit",
    ]
    table = [
        [
            x["workload"],
            x["size"],
            x["peer"],
            secs(x["p"], x["pwhy"]),
            secs(x["r"], x["rwhy"]),
            ratio(x["p"], x["r"]),
            mem(x["p"]),
            mem(x["r"]),
            x["pacc"] if x["p"] else "—",
            x["racc"] if x["r"] else "—",
            x["limit"] if x["r"] else "—",
        ]
        for x in rows
    ]
    m = machine()
    dirs = sorted({str(x["dir"]) for x in rows if x["dir"] is not None})
    describe = "; ".join(v for v in (m["cpu"], m["cores"], m["caches"], f"{m['memory']} memory",
                                     m["virt"], m["kernel"]) if v)
    limits = []
    if copy_bw:
        limits.append(
            f"copy bandwidth {copy_bw:.2f} GB/s and DGEMM {dgemm:.1f} GFLOP/s (the best of "
            f"the system OpenBLAS with the kernels rankwise pins, with its AVX-512 kernels "
            f"where the CPU has them, and NumPy's) from `{limits_dir}`"
        )
    if reduce_bw:
        limits.append(f"copy bandwidth {reduce_bw:.2f} GB/s for (4) from `{reduce_dir}`")
    text = [
        "## Summary: rankwise against Dask, Cubed, Heat and PLINK 2, one row per workload and peer",
        para(
            f"**Machine**: {describe}. Written by `benches/summary.py` (the end of `make bench`) "
            "from the newest raw results of each script: "
            f"{', '.join(f'`{d}`' for d in dirs) or 'none'}. "
            f"Machine limits, measured by the harness: "
            f"{'; '.join(limits) or 'not measured'}. The sections below give every variant, "
            f"the commands and the load averages."
        ),
        markdown_table(header, table),
        "\n".join(
            para(item, prefix="- ", indent="  ")
            for item in [
                "Times are medians (min–max) over the runs counted; ratio = peer time / rankwise "
                "time (> 1: rankwise is faster). rankwise runs in float64 here (its f32 variants "
                "are in the sections below), except on the float32 Zarr store of (5), where both "
                "sides compute in float32; with the peer's shapes, chunking, k, oversampling and "
                "power iterations.",
                "Accuracy: residual = ‖A − UΣVᵀ‖_F/‖A‖_F for (1), (‖A‖_F² − Σσ²)^½/‖A‖_F for "
                "the randomized SVDs (rankwise's from its probes: an estimate); sums of the same "
                "stored values for (5); for (4), z = the sum's distance from its expectation in "
                "standard deviations (the two sides draw different random numbers) and "
                "rankwise's rounding error against a compensated sum; for (6), cost per task; "
                "for (7), the largest relative error of the ten eigenvalues (PLINK's scale) "
                "against the section's reference run, `rankwise pca -k 20 --tol 1e-8 --method lobpcg` (both "
                "sides read the same .bed; the section below has every PC's |corr| too).",
                "Heat and Cubed (benches/peers.sh): \"2 MPI ranks each\" rows run both sides "
                "as two MPI processes, with peak RSS every rank's added up; Heat holds the "
                "matrix in memory and its time includes generating or reading it, as "
                "rankwise's includes making each panel. Cubed has no normal generator: its (4) "
                "row sums uniform values on both sides.",
                "\"not run\": no result of that workload under target/bench-results (its script "
                "did not run, or skips that peer); a failed run shows its exit status.",
            ]
        ),
    ]
    body = "\n\n".join(text) + "\n"
    place_first(args.results, "summary", body)
    print(body)


if __name__ == "__main__":
    main()
