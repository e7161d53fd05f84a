"""`rankwise.pca` of a Dataset made by sgkit's own `simulate_genotype_call_dataset`, in
sgkit's environment (sgkit 0.10, zarr-python 2: target/sgkit-venv), run by
tests/python.rs with the wheel under test installed there:

    python sgkit_dataset.py SEED RANKWISE_BIN TMPDIR

Checks, on a shape and seed drawn from SEED:
- the PCA converges and matches the exact PCA (numpy's SVD of the dosages standardized
  as PLINK does, a missing call at the mean) in components and eigenvalue ratios;
- the Dataset saved by `sgkit.save_dataset` and read by `rankwise pca --vcf-zarr` gives
  the same bits as the Dataset in memory;
- `sgkit.pca` of the Dataset without missing calls agrees with `rankwise.pca`;
- `to_xarray()` merges into the Dataset as sgkit's own variables.
Prints one JSON line of what it measured; exits non-zero on any failure.
"""

import json
import os
import subprocess
import sys

import numpy as np
import sgkit
import xarray as xr
import zarr

import rankwise

SEED, BIN, TMP = int(sys.argv[1]), sys.argv[2], sys.argv[3]
r = np.random.default_rng([SEED, 37])
V = int(r.integers(2000, 5000))
S = int(r.integers(150, 350))
K = int(r.integers(3, 7))
CHUNK = 500

ds = sgkit.simulate_genotype_call_dataset(n_variant=V, n_sample=S, seed=SEED % 2**31,
                                          missing_pct=0.01)
# sgkit simulates independent calls: a flat spectrum whose components are not unique. Two
# populations give the leading ones; the Dataset's variables, and its missing calls
# (-1, with call_genotype_mask), stay sgkit's.
p = r.uniform(0.05, 0.95, size=(V, 1))
shift = r.normal(0, 0.1, size=(V, 1))
group = np.arange(S) < S // 3
freq = np.clip(np.where(group, p + shift, p - shift), 0.01, 0.99)
calls = (r.random((V, S, 2)) < freq[:, :, None]).astype(np.int8)
missing = ds["call_genotype_mask"].values
assert missing.any(), "sgkit simulated no missing call"
calls[missing] = -1
ds["call_genotype"] = (("variants", "samples", "ploidy"), calls)

# The exact PCA: dosages standardized with the allele frequency of the present calls, a
# missing call (any allele missing) at the mean; monomorphic variants dropped.
absent = (calls < 0).any(axis=2)
dosage = np.where(absent, 0, calls.sum(axis=2)).astype(np.float64)
present = (~absent).sum(axis=1, keepdims=True)
f = dosage.sum(axis=1, keepdims=True) / (2 * present)
used = ((f > 0) & (f < 1))[:, 0]
x = (dosage - 2 * f) / np.sqrt(2 * f * (1 - f))
x[absent] = 0
x = x[used].T  # samples × variants
uu, ss, _ = np.linalg.svd(x, full_matrices=False)
exact_pcs, exact_ratio = uu[:, :K], (ss[:K] / ss[0]) ** 2


def scores(pcs, eig):
    pcs = np.asarray(pcs) / np.linalg.norm(pcs, axis=0)
    corr = float(np.min(np.abs(np.sum(pcs * exact_pcs, axis=0))))
    ratio = np.asarray(eig) / eig[0]
    return corr, float(np.max(np.abs(ratio - exact_ratio) / exact_ratio))


res = rankwise.pca(ds, K, seed=9, panel_rows=CHUNK)
assert res.converged, res.residuals
assert res.variants_used == int(used.sum()), (res.variants_used, int(used.sum()))
assert res.sample_ids == [str(s) for s in ds["sample_id"].values]
corr, err = scores(res.pcs, res.eigenvalues)
assert corr > 0.99999, corr
assert err < 1e-6, err

# Saved by sgkit, read by the command line: the same bits in the same panels.
store = os.path.join(TMP, "sim.zarr")
sgkit.save_dataset(ds.chunk({"variants": CHUNK}), store)
out = os.path.join(TMP, "o.zarr")
subprocess.run([BIN, "pca", "--vcf-zarr", store, "-k", str(K), "--sketch-seed", "9",
                "--out", out, "--zarr-format", "2"], check=True, capture_output=True)
group = zarr.open_group(out, mode="r")
assert np.array_equal(group["eigenvalues"][:], res.eigenvalues)
assert np.array_equal(group["S"][:], res.singular_values)
cli = sgkit.load_dataset(out)
mine_x = res.to_xarray()
for name in ("sample_pca_projection", "sample_pca_explained_variance_ratio"):
    assert np.array_equal(cli[name].values, mine_x[name].values), name

# sgkit's own PCA (no missing calls: sgkit.pca has no rule for them).
full = ds.copy()
full["call_genotype"] = (("variants", "samples", "ploidy"), np.where(calls < 0, 0, calls))
full["call_genotype_mask"] = (("variants", "samples", "ploidy"), np.zeros(calls.shape, bool))
mine = rankwise.pca(full, K, seed=9)
theirs = sgkit.pca(full.chunk({"variants": CHUNK}), n_components=K, merge=False).compute()
a = mine.pcs / np.linalg.norm(mine.pcs, axis=0)
b = theirs["sample_pca_projection"].values
b = b / np.linalg.norm(b, axis=0)
sg_corr = float(np.min(np.abs(np.sum(a * b, axis=0))))
assert sg_corr > 0.9999, sg_corr
np.testing.assert_allclose(mine.explained_variance_ratio,
                           theirs["sample_pca_explained_variance_ratio"].values, rtol=1e-4)

# The result as sgkit's variables, merged into the Dataset.
merged = xr.merge([ds, res.to_xarray()], compat="override")
assert merged["sample_pca_projection"].dims == ("samples", "components")
assert merged["sample_pca_projection"].shape == (S, K)

print(json.dumps({"variants": V, "samples": S, "k": K, "min_abs_corr": corr,
                  "max_eig_ratio_err": err, "sgkit_min_abs_corr": sg_corr}))
