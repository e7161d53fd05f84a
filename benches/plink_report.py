"""The `plink` section of benches/RESULTS.md from a run of benches/plink.sh.

    python benches/plink_report.py OUT RESULTS QUICK M N THREADS DATA

Every row states both tools' accuracy against the reference run (`ref.*` in OUT): the
largest relative error of the k eigenvalues and the smallest |corr| of the k sample PCs.
"""

import glob
import json
import os
import re
import statistics
import subprocess
import sys

out, results, quick, m, n, threads, data = sys.argv[1:8]
quick, m, n = quick == "1", int(m), int(n)


def runs(name):
    return [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{name}.[0-9]*.json"))]


def stats(name):
    r = runs(name)
    t = [x["seconds"] for x in r]
    return statistics.median(t), min(t), max(t), max(x["peak_rss_bytes"] for x in r), len(t)


def pcs(path):
    """The PC columns of an .eigenvec (the ID columns before `PC1` skipped)."""
    lines = open(path).read().splitlines()
    ids = sum(1 for h in lines[0].split() if not h.startswith("PC"))
    rows = [line.split() for line in lines[1:]]
    return [[float(r[ids + j]) for r in rows] for j in range(len(rows[0]) - ids)]


def corr(a, b):
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    a = [x - ma for x in a]
    b = [x - mb for x in b]
    dot = sum(x * y for x, y in zip(a, b))
    return abs(dot) / (sum(x * x for x in a) * sum(y * y for y in b)) ** 0.5


def report(path):
    log = open(path).read()
    return json.loads(log[log.find("{"):])


ref = report(f"{out}/ref.log")
ref_ev, ref_pcs = ref["eigenvalues"], pcs(f"{out}/ref.eigenvec")


def accuracy(ev, vecs, k):
    """Per PC 1..k: relative eigenvalue error and |corr| with the reference's PC."""
    errs = [abs(ev[j] - ref_ev[j]) / ref_ev[j] for j in range(k)]
    cors = [corr(vecs[j], ref_pcs[j]) for j in range(k)]
    return errs, cors


version = subprocess.run(["plink2", "--version"], capture_output=True, text=True).stdout.strip()
sys.dont_write_bytecode = True
sys.path.insert(0, "benches")
from report import machine, replace_section  # noqa: E402  (benches/report.py, as run.sh uses it)

mach = machine()
cpu = "; ".join(v for v in (mach["cpu"], mach["cores"], mach["caches"], f"{mach['memory']} memory",
                            mach["virt"], mach["kernel"]) if v)


def gib(b):
    return f"{b / 2**30:.2f} GiB"


reps = stats("plink2-k10")[4]
lines = ["## Genotype PCA against PLINK 2 (`--pca approx`), one PLINK fileset, k = 10 and 20\n"]
lines.append(
    f"Run of `bash benches/plink.sh{' --quick' if quick else ''}` on {cpu}, raw results in `{out}`. "
    f"The fileset: {m:,} variants × {n:,} samples from `rankwise gen --dist genotype --populations 3` "
    "(3 populations, F_ST 0.1, no missing calls, so that both tools compute the same PCA), written by "
    f"`tools/zarr_to_bed.py` ({os.path.getsize(f'{data}/g.bed') / 1e9:.2f} GB). Both tools read the "
    f"same `.bed` from the page cache. {version}, `--threads {threads}`. "
    f"{'Median of ' + str(reps) + ' runs (min–max)' if reps > 1 else 'One run each'}, wall time of the "
    "whole command; peak RSS of the process. Accuracy is against the reference run "
    f"`rankwise pca --bed g -k 20 --tol 1e-8 --method lobpcg` ({ref['passes']} passes, largest residual "
    f"{max(ref['convergence']['residuals']):.1e}; `plink2 --pca` exact of {n:,} samples does not fit in "
    "the run): the largest relative error of the k eigenvalues, and the smallest |corr| of the k sample "
    "PCs with the reference's.\n")
lines.append("| k | tool | command | time | ratio (PLINK 2 / this) | peak RSS | passes | eigenvalues: max rel. "
             "error | PCs: min \\|corr\\| | converged |")
lines.append("|---|---|---|---|---|---|---|---|---|---|")
per_pc = {}
for k in (10, 20):
    p_med, p_lo, p_hi, p_rss, _ = stats(f"plink2-k{k}")
    pev = [float(x) for x in open(f"{out}/plink2-k{k}.eigenval").read().split()]
    perr, pcor = accuracy(pev, pcs(f"{out}/plink2-k{k}.eigenvec"), k)
    per_pc[(k, "plink2")] = (perr, pcor)
    lines.append(f"| {k} | PLINK 2 | `plink2 --bfile g --pca approx {k}` | {p_med:.2f} s ({p_lo:.2f}–{p_hi:.2f}) "
                 f"| 1.0× | {gib(p_rss)} | — | {max(perr):.1e} | {min(pcor):.6f} | not reported |")
    rows = [(f"rw-k{k}", f"`rankwise pca --bed g -k {k}` (defaults: block Lanczos)"),
            (f"rw-k{k}-lobpcg", "`… --method lobpcg` (the default before)"),
            (f"rw-k{k}-tol1e-3", "`… --tol 1e-3`")]
    if k == 10:
        rows.append(("rw-q2-f32", "`… --power-iters 2 --precision f32` (fixed iterations)"))
    for name, cmd in rows:
        if not runs(name):
            continue
        med, lo, hi, rss, _ = stats(name)
        r = report(f"{out}/{name}.1.log")
        errs, cors = accuracy(r["eigenvalues"], pcs(f"{out}/{name}.1.eigenvec"), k)
        per_pc[(k, name)] = (errs, cors)
        c = r["convergence"]
        unmet = sum(1 for x in c["met"] if not x)
        conv = "yes" if c["converged"] else f"no, {unmet} of {k}"
        prec = c["pass_precisions"]
        npass = f"{r['passes']} ({prec.count('f32')} f32, {prec.count('f64')} f64)"
        lines.append(f"| {k} | rankwise | {cmd} | {med:.2f} s ({lo:.2f}–{hi:.2f}) | {p_med / med:.1f}× | "
                     f"{gib(rss)} | {npass} | {max(errs):.1e} | {min(cors):.6f} | {conv} (largest residual "
                     f"{max(c['residuals']):.1e}) |")
lines.append("")
lines.append("Per PC, k = 20: eigenvalue relative error / |corr| with the reference's PC.\n")
lines.append("| PC | reference eigenvalue | PLINK 2 approx | rankwise (defaults) |")
lines.append("|---|---|---|---|")
pe, pc = per_pc[(20, "plink2")]
re_, rc = per_pc.get((20, "rw-k20"), ([float("nan")] * 20, [float("nan")] * 20))
for j in range(20):
    lines.append(f"| {j + 1} | {ref_ev[j]:.6g} | {pe[j]:.1e} / {pc[j]:.6f} | {re_[j]:.1e} / {rc[j]:.6f} |")
lines.append("")
lines.append("- PCs 3 onwards are the Marchenko–Pastur bulk: eigenvalues within 0.1 % of each other, where a "
             "method that stops early returns mixtures of them. The fixed `--power-iters 2` row (the "
             "default before convergence control) shows it, and its report says which PCs did not converge.")
if runs("plink2-qc"):
    log = open(f"{out}/plink2-qc.1.log").read()
    plink_kept = int(re.search(r"(\d+) variants remaining after main filters", log).group(1))
    pruned = sum(1 for _ in open(f"{out}/ld.prune.in"))
    qc_ev = [float(x) for x in open(f"{out}/plink2-qc.eigenval").read().split()]
    lines.append("")
    lines.append("QC as a PCA pipeline applies it: LD pruning by `plink2 --indep-pairwise 200 50 0.1` "
                 f"(untimed; {pruned:,} variants in `.prune.in`), then `--maf 0.01 --hwe 1e-6 --extract "
                 "ld.prune.in` on both sides, k = 10 (PLINK v2.00a3.5's `--hwe` is not scaled by the sample "
                 "count; in these 3 populations the Wahlund effect fails more than half of the variants).\n")
    lines.append("| tool | command | time | ratio (PLINK 2 / this) | peak RSS | variants kept | eigenvalues 1, 2, 10 "
                 "| converged |")
    lines.append("|---|---|---|---|---|---|---|---|")
    q_med, q_lo, q_hi, q_rss, _ = stats("plink2-qc")
    lines.append(f"| PLINK 2 | `plink2 --bfile g … --pca approx 10` | {q_med:.2f} s ({q_lo:.2f}–{q_hi:.2f}) | 1.0× | "
                 f"{gib(q_rss)} | {plink_kept:,} | {qc_ev[0]:.5g}, {qc_ev[1]:.5g}, {qc_ev[9]:.5g} | not reported |")
    med, lo, hi, rss, _ = stats("rw-qc")
    r = report(f"{out}/rw-qc.1.log")
    g = r["genotypes"]
    kept = g["variants"] - g["variants_filtered"]
    ev = r["eigenvalues"]
    lines.append(f"| rankwise | `rankwise pca --bed g -k 10 …` (defaults) | {med:.2f} s ({lo:.2f}–{hi:.2f}) | "
                 f"{q_med / med:.1f}× | {gib(rss)} | {kept:,} | {ev[0]:.5g}, {ev[1]:.5g}, {ev[9]:.5g} | "
                 f"{'yes' if r['converged'] else 'no'} ({r['passes']} passes) |")
if runs("rw-project"):
    # Both sides against the reference's own PCs: plink2's score sums over ‖Wⱼ‖²·√λⱼ.
    var = [line.split() for line in open(f"{out}/ref.eigenvec.var").read().splitlines()[1:]]
    k = len(var[0]) - 4
    norm2 = [sum(float(r[4 + j]) ** 2 for r in var) for j in range(k)]
    lam = [float(x) for x in open(f"{out}/ref.eigenval").read().split()]
    rows = [line.split() for line in open(f"{out}/score.sscore").read().splitlines()]
    cols = [rows[0].index(f"PC{j + 1}_SUM") for j in range(k)]
    theirs = [[float(r[cols[j]]) / (norm2[j] * lam[j] ** 0.5) for r in rows[1:]] for j in range(k)]
    ours = pcs(f"{out}/proj.1.eigenvec")
    scale = max(abs(x) for col in ref_pcs[:k] for x in col)

    def worst(p):
        return max(abs(a - b) for j in range(k) for a, b in zip(p[j], ref_pcs[j])) / scale

    matched = report(f"{out}/rw-project.1.log")["matched"]
    s_med, s_lo, s_hi, s_rss, _ = stats("plink2-score")
    med, lo, hi, rss, _ = stats("rw-project")
    lines.append("")
    lines.append(f"Projection of the fileset's own samples through the reference PCA's weights "
                 f"(`ref.eigenvec.var`, `ref.afreq`: k = {k}, {matched:,} variants matched on both sides): "
                 "each tool should give back the reference's PCs. Accuracy: the largest difference "
                 "from them, relative to the largest |PC| (plink2's `PCj_SUM` divided by ‖Wⱼ‖²·√λⱼ; it "
                 "prints 6 significant digits).\n")
    lines.append("| tool | command | time | ratio (PLINK 2 / this) | peak RSS | max \\|Δ\\| / max \\|PC\\| |")
    lines.append("|---|---|---|---|---|---|")
    lines.append(f"| PLINK 2 | `plink2 --bfile g --read-freq ref.afreq --score ref.eigenvec.var 2 4 header-read "
                 f"variance-standardize no-mean-imputation cols=+scoresums` | {s_med:.2f} s ({s_lo:.2f}–{s_hi:.2f}) | "
                 f"1.0× | {gib(s_rss)} | {worst(theirs):.1e} |")
    lines.append(f"| rankwise | `rankwise project --bed g --pca ref` | {med:.2f} s ({lo:.2f}–{hi:.2f}) | "
                 f"{s_med / med:.1f}× | {gib(rss)} | {worst(ours):.1e} |")
text = "\n".join(lines) + "\n"
print(text)
replace_section(results, "plink", text)
