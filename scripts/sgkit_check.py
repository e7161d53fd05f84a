"""sgkit against rankwise, both ways, in sgkit 0.10's environment (scripts/sgkit-venv.sh):
tests/zarr_interop.rs runs it around `rankwise pca --vcf-zarr … --zarr-format 2`.

    python scripts/sgkit_check.py write STORE SEED VARIANTS SAMPLES
        writes a genotype Dataset with `sgkit.save_dataset` (Zarr v2, as sgkit writes it:
        `variant_allele` as byte strings, `sample_id` as fixed-width unicode): sgkit's
        `simulate_genotype_call_dataset` with two groups of samples whose allele
        frequencies differ.

    python scripts/sgkit_check.py check STORE GROUP K
        opens rankwise's output GROUP with `sgkit.load_dataset` (no warning allowed),
        checks it against sgkit's variable specs, and compares it with `sgkit.pca` of
        STORE: the components (|corr|), the explained variance ratios, and the explained
        variances and loadings, which differ by sgkit's scaling (Patterson's, divided by n
        where rankwise divides by n − 1: a factor 2(n − 1)/n). Prints one JSON line.
"""

import json
import sys
import warnings

import numpy as np
import sgkit
from sgkit import variables


def write(store, seed, n_variants, n_samples):
    r = np.random.default_rng(seed)
    p = r.uniform(0.05, 0.95, size=(n_variants, 1))
    shift = r.normal(0, 0.15, size=(n_variants, 1))
    group = np.arange(n_samples) < n_samples // 3
    freq = np.clip(np.where(group, p + shift, p - shift), 0.02, 0.98)
    calls = (r.random((n_variants, n_samples, 2)) < freq[:, :, None]).astype(np.int8)
    ds = sgkit.simulate_genotype_call_dataset(n_variant=n_variants, n_sample=n_samples,
                                              seed=seed % 2**31)
    ds["call_genotype"] = (("variants", "samples", "ploidy"), calls)
    sgkit.save_dataset(ds.chunk({"variants": max(1, n_variants // 3)}), store)


def check(store, group, k):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = sgkit.load_dataset(group)
    variables.validate(
        ours,
        variables.sample_pca_projection_spec,
        variables.sample_pca_loading_spec,
        variables.sample_pca_explained_variance_spec,
        variables.sample_pca_explained_variance_ratio_spec,
        variables.sample_id_spec,
        variables.variant_position_spec,
        variables.variant_contig_spec,
    )
    ds = sgkit.load_dataset(store)
    assert ours["sample_id"].values.tolist() == ds["sample_id"].values.tolist()
    assert ours["variant_position"].values.tolist() == ds["variant_position"].values.tolist()
    assert ours.attrs["report"]["command"] == "pca"
    n = ds.sizes["samples"]

    theirs = sgkit.pca(ds, n_components=k, merge=False).compute()
    a = theirs["sample_pca_projection"].values.astype(np.float64)
    b = ours["sample_pca_projection"].values
    assert b.shape == a.shape, (b.shape, a.shape)
    corr = np.abs(np.sum(a * b, axis=0)) / np.linalg.norm(a, axis=0) / np.linalg.norm(b, axis=0)
    ratio_theirs = theirs["sample_pca_explained_variance_ratio"].values
    ratio_ours = ours["sample_pca_explained_variance_ratio"].values
    ratio_err = np.max(np.abs(ratio_ours / ratio_theirs - 1))
    scale = 2 * (n - 1) / n
    var_err = np.max(np.abs(theirs["sample_pca_explained_variance"].values
                            / ours["sample_pca_explained_variance"].values / scale - 1))
    la = theirs["sample_pca_loading"].values.astype(np.float64)
    lb = ours["sample_pca_loading"].values * np.sign(np.sum(a * b, axis=0)) * np.sqrt(scale)
    loading_err = np.max(np.abs(la - lb)) / np.max(np.abs(la))
    row = dict(min_abs_corr=float(corr.min()), max_ratio_err=float(ratio_err),
               max_variance_err=float(var_err), loading_err=float(loading_err),
               samples=n, variants=ds.sizes["variants"], k=k)
    print(json.dumps(row))
    # sgkit computes in float32: agreement to its precision, components and all.
    assert corr.min() > 0.9999, row
    assert ratio_err < 1e-5 and var_err < 1e-5 and loading_err < 1e-4, row


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], *(int(v) for v in sys.argv[3:6]))
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(f"usage: {sys.argv[0]} write STORE SEED VARIANTS SAMPLES | check STORE GROUP K")
