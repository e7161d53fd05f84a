"""`rankwise.pca` on an sgkit Dataset against `sgkit.pca` (its default, TSQR: exact), in
one run (benches/python.sh runs it in its own environment: sgkit 0.10 needs zarr 2 and an
older dask than the rest of the benchmarks).

The Dataset is sgkit's `simulate_genotype_call_dataset` (VARIANTS × SAMPLES diploid calls)
with population structure added: two groups of samples whose allele frequencies differ.
Accuracy of both sides against the exact PCA (numpy.linalg.svd of the matrix both
standardize alike up to a constant): the smallest |corr| of a component with the exact
one, and the largest relative error of the eigenvalues' ratios to the first (sgkit and
PLINK scale eigenvalues differently; their ratios agree).

    python benches/python_sgkit.py VARIANTS SAMPLES K   → JSON lines on stdout
"""

import json
import sys
import time

import numpy as np
import sgkit
import xarray as xr

import rankwise

VARIANTS, SAMPLES, K = (int(v) for v in sys.argv[1:4])

r = np.random.default_rng(3)
p = r.uniform(0.05, 0.95, size=(VARIANTS, 1))
shift = r.normal(0, 0.1, size=(VARIANTS, 1))
group = np.arange(SAMPLES) < SAMPLES // 3
freq = np.clip(np.where(group, p + shift, p - shift), 0.01, 0.99)
calls = (r.random((VARIANTS, SAMPLES, 2)) < freq[:, :, None]).astype(np.int8)
ds = sgkit.simulate_genotype_call_dataset(n_variant=VARIANTS, n_sample=SAMPLES, seed=1)
ds["call_genotype"] = (("variants", "samples", "ploidy"), calls)
ds = ds.chunk({"variants": 5000})

dosage = calls.sum(axis=2).astype(np.float64)
f = dosage.mean(axis=1, keepdims=True) / 2
x = ((dosage - 2 * f) / np.sqrt(2 * f * (1 - f))).T  # samples × variants
uu, ss, _ = np.linalg.svd(x, full_matrices=False)
exact_pcs, exact_ratio = uu[:, :K], (ss[:K] / ss[0]) ** 2


def scores(pcs, eig):
    pcs = pcs / np.linalg.norm(pcs, axis=0)
    corr = float(np.min(np.abs(np.sum(pcs * exact_pcs, axis=0))))
    ratio = np.asarray(eig) / eig[0]
    return corr, float(np.max(np.abs(ratio - exact_ratio) / exact_ratio))


def emit(**row):
    print(json.dumps(row), flush=True)


t = time.perf_counter()
out = sgkit.pca(ds, n_components=K, merge=False).compute()
dt = time.perf_counter() - t
corr, err = scores(out["sample_pca_projection"].values,
                   out["sample_pca_explained_variance"].values)
emit(what="pca of an sgkit Dataset", tool="sgkit.pca (tsqr)", seconds=dt, min_abs_corr=corr,
     max_eig_ratio_err=err, variants=VARIANTS, samples=SAMPLES, k=K)

t = time.perf_counter()
res = rankwise.pca(ds, K)
dt = time.perf_counter() - t
corr, err = scores(res.pcs, res.eigenvalues)
emit(what="pca of an sgkit Dataset", tool="rankwise.pca", seconds=dt, min_abs_corr=corr,
     max_eig_ratio_err=err, converged=res.converged, variants=VARIANTS, samples=SAMPLES, k=K)
