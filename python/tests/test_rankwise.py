"""The Python package against numpy, scikit-learn, dask, xarray, the command line and
mpi4py, and its behaviour as an extension (GIL, Ctrl-C, exceptions, the wheel).

Run by `make test` (tests/python.rs) in the environment scripts/python-venv.sh builds;
RANKWISE_BIN names the release binary, RANKWISE_WHEEL the wheel under test."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc

import numpy as np
import pytest

import rankwise

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("RANKWISE_BIN", os.path.join(ROOT, "target", "release", "rankwise"))
# Fresh shapes and seeds on every run, printed so that a failure can be replayed.
SEED = int(os.environ.get("RANKWISE_TEST_SEED", time.time_ns() % 2**32))
print(f"RANKWISE_TEST_SEED={SEED}", file=sys.stderr)


def rng(i=0):
    return np.random.default_rng([SEED, i])


def traced_peak(f):
    """f() and the peak of numpy's (and Python's) allocations while it ran."""
    tracemalloc.start()
    try:
        out = f()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, peak


def low_rank(r, m, n, k=8, decay=0.5, noise=1e-3):
    """m × n with k leading singular values decaying by `decay`, then noise."""
    u, _ = np.linalg.qr(r.standard_normal((m, k)))
    v, _ = np.linalg.qr(r.standard_normal((n, k)))
    s = 10.0 * decay ** np.arange(k)
    return (u * s) @ v.T + noise * r.standard_normal((m, n))


def same_subspace(a, b):
    """max over columns of 1 − |cos| between matching singular vectors."""
    a = a / np.linalg.norm(a, axis=0)
    b = b / np.linalg.norm(b, axis=0)
    return float(np.max(1 - np.abs(np.sum(a * b, axis=0))))


def run_cli(*args, cwd):
    p = subprocess.run([BIN, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p


def read_group(path, name):
    import zarr

    return np.asarray(zarr.open_array(os.path.join(path, name), mode="r")[...])


# ---------------------------------------------------------------------------------------
# Accuracy


@pytest.mark.parametrize("case", range(4))
def test_svd_matches_lapack_on_fresh_shapes(case):
    r = rng(case)
    m = int(r.integers(300, 20000))
    n = int(r.integers(2, 60))
    order = "F" if case % 2 else "C"
    a = np.asarray(r.standard_normal((m, n)), order=order)
    res = rankwise.svd(a)
    u, s, vt = np.linalg.svd(a, full_matrices=False)
    assert res.converged
    np.testing.assert_allclose(res.s, s, rtol=0, atol=1e-12 * s[0])
    assert res.u.shape == (m, n) and res.vt.shape == (n, n)
    assert same_subspace(res.u, u) < 1e-9
    assert same_subspace(res.vt.T, vt.T) < 1e-9
    np.testing.assert_allclose((res.u * res.s) @ res.vt, a, atol=1e-10 * s[0])


def test_short_and_fat_matrices_are_factored_through_their_transpose():
    r = rng(10)
    a = r.standard_normal((int(r.integers(5, 40)), int(r.integers(500, 3000))))
    res = rankwise.svd(a)
    u, s, vt = np.linalg.svd(a, full_matrices=False)
    np.testing.assert_allclose(res.s, s, atol=1e-12 * s[0])
    assert res.u.shape == u.shape and res.vt.shape == vt.shape
    np.testing.assert_allclose((res.u * res.s) @ res.vt, a, atol=1e-10 * s[0])
    k = min(a.shape) // 2
    rr = rankwise.rsvd(a, k, seed=3, oversample=min(a.shape) - k)
    assert rr.converged, rr.residuals
    np.testing.assert_allclose(rr.s, s[:k], rtol=1e-6)
    assert rr.u.shape == (a.shape[0], k) and rr.vt.shape == (k, a.shape[1])


@pytest.mark.parametrize("case", range(3))
def test_rsvd_converges_to_lapack_and_says_so(case):
    r = rng(20 + case)
    m, n = int(r.integers(2000, 15000)), int(r.integers(40, 150))
    k = int(r.integers(2, 8))
    a = low_rank(r, m, n, k=12)
    res = rankwise.rsvd(a, k, seed=int(r.integers(1 << 30)))
    u, s, vt = np.linalg.svd(a, full_matrices=False)
    assert res.converged and np.all(res.residuals <= 1e-6)
    np.testing.assert_allclose(res.s, s[:k], rtol=1e-8)
    assert same_subspace(res.u, u[:, :k]) < 1e-8
    assert same_subspace(res.vt.T, vt[:k].T) < 1e-8
    # float32 input: read in place, the same answer.
    a32 = a.astype(np.float32)
    res32 = rankwise.rsvd(a32, k, seed=1)
    s32 = np.linalg.svd(a32.astype(np.float64), compute_uv=False)
    np.testing.assert_allclose(res32.s, s32[:k], rtol=1e-6)


@pytest.mark.parametrize("order", ["C", "F"])
def test_float32_arrays_are_read_in_place_with_their_widened_copys_bits(order):
    r = rng(40 + (order == "F"))
    m, n = int(r.integers(3000, 9000)), int(r.integers(520, 900))
    a32 = np.asarray(low_rank(r, m, n, k=15) + 0.01 * r.standard_normal((m, n)),
                     dtype=np.float32, order=order)
    a64 = a32.astype(np.float64)
    # Fixed iterations take f32 tiles for stored f32 values, as for a float32 Zarr array;
    # the array is not copied (a float64 copy would be twice its bytes).
    x, peak = traced_peak(lambda: rankwise.rsvd(a32, 6, power_iters=1, seed=5))
    assert peak < a32.nbytes / 4, (peak, a32.nbytes)
    y = rankwise.rsvd(a64, 6, power_iters=1, seed=5, precision="f32")
    assert x.report["convergence"]["pass_precisions"] == ["f32"] * len(
        x.report["convergence"]["pass_precisions"])
    for f in ("s", "u", "vt"):
        np.testing.assert_array_equal(getattr(x, f), getattr(y, f), err_msg=f)
    # Iterating to the tolerance: the same bits as the widened copy, and converged.
    x = rankwise.rsvd(a32, 6, seed=5)
    y = rankwise.rsvd(a64, 6, seed=5)
    assert x.converged
    for f in ("s", "u", "vt"):
        np.testing.assert_array_equal(getattr(x, f), getattr(y, f), err_msg=f)
    s = np.linalg.svd(a64, compute_uv=False)
    np.testing.assert_allclose(x.s, s[:6], rtol=1e-6)
    # Values at an odd byte offset are not aligned: read from an aligned copy.
    raw = np.zeros(a32.nbytes + 1, dtype=np.uint8)
    odd = np.frombuffer(raw.data, dtype=np.float32, count=a32.size, offset=1).reshape(a32.shape)
    odd[...] = a32
    assert not odd.flags.aligned
    z = rankwise.rsvd(odd, 6, power_iters=1, seed=5)
    x = rankwise.rsvd(a32, 6, power_iters=1, seed=5)
    np.testing.assert_array_equal(z.s, x.s)


def test_a_fixed_iteration_count_reports_unconverged_components():
    r = rng(30)
    # A flat spectrum: two power iterations cannot separate the components.
    a = r.standard_normal((4000, 200))
    res = rankwise.rsvd(a, 10, power_iters=0, oversample=2, seed=1)
    assert not res.converged
    assert res.report["convergence"]["met"].count(False) > 0
    with pytest.raises(rankwise.RankwiseError) as e:
        rankwise.rsvd(a, 10, power_iters=0, oversample=2, seed=1, require_converged=True)
    assert e.value.cause == "not-converged" and e.value.rank == 0


def test_the_report_gives_each_pass_its_products_flops():
    r = rng(35)
    m, n = int(r.integers(3000, 9000)), int(r.integers(50, 300))
    k, q = int(r.integers(2, 6)), int(r.integers(0, 3))
    a = r.standard_normal((m, n))
    res = rankwise.rsvd(a, k, power_iters=q, seed=4)
    phases = res.report["phases"]
    passes = [p for p in phases if p["flops"] > 0]
    # The first pass, q iterations and the residual check multiply the whole matrix.
    assert len(passes) >= 2 + q, phases
    for p in passes:
        columns = p["flops"] / (2.0 * m * n)
        assert columns >= 1 and abs(columns - round(columns)) < 1e-9, p
        assert p["seconds"] > 0, p
    # The residual check multiplies by V: k columns.
    assert passes[-1]["flops"] == 2.0 * m * n * k, passes[-1]
    assert res.report["gemm_peak_flops"] is None
    assert res.report["production_peak_bytes_per_s"] is None
    # Every pass read every value of the matrix (8 bytes each): a numpy matrix's rows are
    # read again from it, never kept twice.
    assert all(p["produced_bytes"] == m * n * 8 for p in passes), passes
    # With the machine's GEMM rate and the rate it produces tiles at, each pass's limit.
    limited = rankwise.rsvd(a, k, power_iters=q, seed=4, machine_limit=True)
    peak = limited.report["gemm_peak_flops"]
    production = limited.report["production_peak_bytes_per_s"]
    assert np.isfinite(peak) and peak > 1e8, peak
    assert np.isfinite(production) and production > 1e7, production
    np.testing.assert_array_equal(limited.s, res.s)
    for p in limited.report["phases"]:
        if p["flops"] > 0:
            limit = p["flops"] / peak + p["produced_bytes"] / production
            assert 0 < limit / p["seconds"] < 10, (p, peak, production)


def test_the_exact_svd_reports_each_passs_flops_bytes_and_machine_limit():
    r = rng(36)
    m, n = int(r.integers(20000, 60000)), int(r.integers(2, 30))
    a = r.standard_normal((m, n))
    res = rankwise.svd(a, panel_rows=int(r.integers(2000, 8000)))
    assert res.report["gemm_peak_flops"] is None
    assert res.report["production_peak_bytes_per_s"] is None
    limited = rankwise.svd(a, panel_rows=4096, machine_limit=True)
    np.testing.assert_allclose(limited.s, res.s, rtol=1e-13)
    gemm = limited.report["gemm_peak_flops"]
    production = limited.report["production_peak_bytes_per_s"]
    assert np.isfinite(gemm) and gemm > 1e8, gemm
    assert np.isfinite(production) and production > 1e7, production
    phases = {p["phase"]: p for p in limited.report["phases"]}
    first = phases["pass 1: produce panels + panel QR"]
    # One Cholesky QR step's Gram matrix, of every value of the matrix, all produced.
    assert first["flops"] == m * n * (n + 1.0), first
    assert first["produced_bytes"] == m * n * 8, first
    second = phases["pass 2: form U"]
    assert second["flops"] == 2.0 * m * n * n, second
    for p in (first, second):
        limit = p["flops"] / gemm + p["produced_bytes"] / production
        assert 0 < limit / p["seconds"] < 10, (p, gemm, production)
    # The best kernels the CPU runs, each measured in a process of this interpreter,
    # named; where they are not this process's, its own rate is the lower one.
    kernels, loaded = limited.report["gemm_kernels"], limited.report["gemm_loaded_flops"]
    assert isinstance(kernels, str) and kernels, limited.report
    if loaded is None:
        assert kernels == rankwise._rankwise.blas_kernels()[0], limited.report
    else:
        assert 0 < loaded < gemm, limited.report


def _blas_in_fresh_interpreter(code, **env):
    """Runs `code` after `import rankwise` in a new interpreter without OPENBLAS_CORETYPE
    (plus `env`); its stdout's last line, and its stderr."""
    e = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1], out.stderr


def test_the_package_loads_the_kernels_the_command_line_runs():
    # What OpenBLAS chooses by itself here, and what rankwise wants instead (None: the
    # same), asked of the extension loaded without the package.
    ext, _ = _blas_in_fresh_interpreter("import rankwise; print(rankwise._rankwise.__file__)")
    own = textwrap.dedent(f"""
        import importlib.machinery as m, importlib.util as u
        l = m.ExtensionFileLoader("rankwise._rankwise", {ext!r})
        x = u.module_from_spec(u.spec_from_loader("rankwise._rankwise", l))
        l.exec_module(x)
        print(repr(x.blas_kernels()))
        """)
    chosen, wanted = eval(_blas_in_fresh_interpreter(own)[0])
    # Through the package: the kernels rankwise wants, and the variable left as it was.
    after = textwrap.dedent("""
        import os, rankwise
        print(repr((rankwise._rankwise.blas_kernels(), "OPENBLAS_CORETYPE" in os.environ)))
        """)
    (loaded, still_wanted), env_left = eval(_blas_in_fresh_interpreter(after)[0])
    assert still_wanted is None and not env_left, (loaded, still_wanted, env_left)
    assert loaded == (wanted or chosen), (loaded, chosen, wanted)
    # A value the user set is kept, without a warning.
    user, err = _blas_in_fresh_interpreter(
        "import rankwise; print(rankwise._rankwise.blas_kernels()[0])",
        OPENBLAS_CORETYPE=chosen)
    assert user == chosen and "OpenBLAS runs" not in err, (user, err)
    if wanted is not None:
        # OpenBLAS loaded before the package (by another module): it keeps its choice,
        # and the package says what that costs.
        early, err = _blas_in_fresh_interpreter(
            "import ctypes; ctypes.CDLL('libopenblas.so.0'); import rankwise; "
            "print(rankwise._rankwise.blas_kernels()[0])")
        assert early == chosen, early
        assert f"OpenBLAS runs its {chosen} kernels" in err, err
        assert f"OPENBLAS_CORETYPE={wanted}" in err, err


def test_the_pca_reports_its_phases_and_the_machine_limit():
    r = rng(41)
    variants, samples = int(r.integers(2000, 6000)), int(r.integers(60, 300))
    dosages = r.binomial(2, r.uniform(0.05, 0.95, size=(variants, 1)),
                         size=(variants, samples)).astype(np.int8)
    q = int(r.integers(0, 3))
    res = rankwise.pca(dosages, 3, power_iters=q, precision="f64", seed=3)
    assert res.report["gemm_peak_flops"] is None
    passes = [p for p in res.report["phases"] if p["flops"] > 0]
    # The first pass, q iterations and the residual check multiply the whole matrix.
    assert res.report["passes"] >= 2 + q and len(passes) >= 2 + q, res.report
    for p in passes:
        columns = p["flops"] / (2.0 * variants * samples)
        assert columns >= 1 and abs(columns - round(columns)) < 1e-9, p
    limited = rankwise.pca(dosages, 3, power_iters=q, precision="f64", seed=3,
                           machine_limit=True)
    np.testing.assert_array_equal(limited.eigenvalues, res.eigenvalues)
    peak = limited.report["gemm_peak_flops"]
    assert np.isfinite(peak) and peak > 1e8, peak
    for p in limited.report["phases"]:
        if p["flops"] > 0:
            assert 0 < p["flops"] / p["seconds"] / peak < 10, (p, peak)


def test_pca_matches_scikit_learn_on_standardized_dosages():
    from sklearn.decomposition import PCA

    r = rng(40)
    variants, samples = int(r.integers(800, 3000)), int(r.integers(60, 200))
    # Two populations: allele frequencies differ between them.
    p = r.uniform(0.05, 0.95, size=(variants, 1))
    shift = r.normal(0, 0.15, size=(variants, 1))
    group = np.arange(samples) < samples // 2
    freq = np.clip(np.where(group, p + shift, p - shift), 0.01, 0.99)
    dosages = r.binomial(2, freq).astype(np.int8)
    k = 4
    res = rankwise.pca(dosages, k, sample_ids=[f"s{i}" for i in range(samples)], seed=2)
    assert res.converged
    # PLINK's standardization: centre by 2p, scale by sqrt(2p(1-p)), per variant.
    x = dosages.astype(np.float64)
    f = x.mean(axis=1, keepdims=True) / 2
    keep = (f[:, 0] > 0) & (f[:, 0] < 1)
    z = ((x - 2 * f) / np.sqrt(2 * f * (1 - f)))[keep].T  # samples × variants
    sk = PCA(n_components=k, svd_solver="full").fit(z)
    scores = sk.transform(z)
    assert same_subspace(res.pcs, scores) < 1e-8
    np.testing.assert_allclose(res.singular_values, sk.singular_values_, rtol=1e-8)
    # Eigenvalues on PLINK 2's scale: σ² / variants.
    np.testing.assert_allclose(res.eigenvalues, sk.singular_values_**2 / keep.sum(), rtol=1e-8)
    assert res.sample_ids[:2] == ["s0", "s1"] and res.variants_used == keep.sum()


# ---------------------------------------------------------------------------------------
# The same bits as the command line


def test_rsvd_and_svd_of_a_zarr_array_have_the_command_lines_bits(tmp_path):
    import zarr

    r = rng(50)
    m, n = int(r.integers(2000, 6000)), int(r.integers(20, 60))
    a = low_rank(r, m, n, k=10)
    store = str(tmp_path / "a.zarr")
    z = zarr.create_array(store, shape=a.shape, chunks=(500, n), dtype="f8")
    z[...] = a
    seed = int(r.integers(1 << 30))
    run_cli("rsvd", "--zarr", store, "-k", "5", "--sketch-seed", str(seed), "--out", "o",
            cwd=tmp_path)
    out = str(tmp_path / "o")
    # A dask array from the store is read from the store, not copied to a temporary one.
    import dask.array as da

    assert rankwise._matrix_input(da.from_zarr(store), None).source == store
    for source in (store, z, da.from_zarr(store)):
        res = rankwise.rsvd(source, 5, seed=seed)
        assert np.array_equal(res.s, read_group(out, "S")), type(source)
        assert np.array_equal(res.vt, read_group(out, "Vt"))
        assert np.array_equal(res.u, read_group(out, "U"))
        assert np.array_equal(res.residuals, read_group(out, "residuals"))
    run_cli("svd", "--zarr", store, "--out", "e", cwd=tmp_path)
    res = rankwise.svd(store)
    assert np.array_equal(res.s, read_group(str(tmp_path / "e"), "S"))
    assert np.array_equal(res.vt, read_group(str(tmp_path / "e"), "Vt"))


def test_pca_of_stores_and_datasets_has_the_command_lines_bits(tmp_path):
    import xarray as xr

    run_cli("gen", "--out", "g.zarr", "--rows", "3000", "--cols", "150", "--chunk-rows", "500",
            "--dist", "genotype", "--seed", str(SEED % 1000), cwd=tmp_path)
    spec = str(tmp_path / "g.zarr") + ":call_dosage"
    run_cli("pca", "--zarr", spec, "-k", "4", "--sketch-seed", "9", "--out", "o", cwd=tmp_path)
    res = rankwise.pca(spec, 4, seed=9)
    import dask.array as da
    import zarr

    by_dask = rankwise.pca(da.from_zarr(str(tmp_path / "g.zarr"), component="call_dosage"), 4,
                           seed=9)
    assert np.array_equal(by_dask.eigenvalues, res.eigenvalues)
    dosages = zarr.open_array(str(tmp_path / "g.zarr"), path="call_dosage", mode="r")[...]
    in_memory = rankwise.pca(da.from_array(dosages, chunks=(500, 150)) + 0, 4, seed=9,
                             panel_rows=500)
    assert np.array_equal(in_memory.eigenvalues, res.eigenvalues)
    out = str(tmp_path / "o")
    assert np.array_equal(res.eigenvalues, read_group(out, "eigenvalues"))
    assert np.array_equal(res.singular_values, read_group(out, "S"))
    assert res.converged
    # The same genotypes as an xarray Dataset in memory (sgkit's variables).
    dos = np.asarray(xr.open_zarr(str(tmp_path / "g.zarr"), consolidated=False)["call_dosage"].values)
    ids = np.asarray(xr.open_zarr(str(tmp_path / "g.zarr"), consolidated=False)["sample_id"].values)
    gt = np.stack([(dos >= 1), (dos >= 2)], axis=2).astype(np.int8)
    gt[dos < 0] = -1
    ds = xr.Dataset(
        {"call_genotype": (("variants", "samples", "ploidy"), gt),
         "sample_id": (("samples",), ids)}
    )
    # The store's panels (its chunks of 500 variants): the same panels give the same bits.
    from_ds = rankwise.pca(ds, 4, seed=9, panel_rows=500)
    assert np.array_equal(from_ds.eigenvalues, res.eigenvalues)
    assert np.array_equal(from_ds.pcs, res.pcs)
    assert from_ds.sample_ids == [str(i) for i in ids]
    # Written as a VCF Zarr store (xarray's to_zarr), read from its path: the same bits;
    # a call_genotype_mask marks calls missing alike in memory and in the store.
    mask = np.zeros(gt.shape, dtype=bool)
    mask[::7, ::5, 0] = True
    masked = ds.assign(call_genotype_mask=(("variants", "samples", "ploidy"), mask))
    vcz = str(tmp_path / "c.vcz")
    masked.chunk({"variants": 500}).to_zarr(vcz, zarr_format=3, consolidated=False)
    from_store = rankwise.pca(vcz, 4, seed=9)
    from_memory = rankwise.pca(masked, 4, seed=9, panel_rows=500)
    assert np.array_equal(from_store.eigenvalues, from_memory.eigenvalues)
    assert not np.array_equal(from_store.eigenvalues, res.eigenvalues)
    x = from_ds.to_xarray()
    assert x["sample_pca_projection"].dims == ("samples", "components")
    assert x["sample_pca_projection"].shape == (150, 4)
    np.testing.assert_allclose(x["sample_pca_explained_variance_ratio"],
                               from_ds.explained_variance_ratio)


def test_pca_out_publishes_the_command_lines_group_and_files(tmp_path):
    run_cli("gen", "--out", "g.zarr", "--rows", "2400", "--cols", "90", "--chunk-rows", "600",
            "--dist", "genotype", "--populations", "2", "--seed", str(SEED % 1000),
            cwd=tmp_path)
    spec = str(tmp_path / "g.zarr") + ":call_dosage"
    res = rankwise.pca(spec, 3, seed=9, maf=0.01, out=tmp_path / "py")
    run_cli("pca", "--zarr", spec, "-k", "3", "--sketch-seed", "9", "--maf", "0.01",
            "--out", "o", cwd=tmp_path)
    for name in ("S", "U", "Vt", "eigenvalues", "sample_pca_loading",
                 "variant_counted_allele_frequency", "sample_pca_projection"):
        # (NaN: the frequency of a variant that did not enter.)
        assert np.array_equal(read_group(str(tmp_path / "py"), name),
                              read_group(str(tmp_path / "o"), name), equal_nan=True), name
    assert np.array_equal(read_group(str(tmp_path / "py"), "S"), res.singular_values)
    for ext in ("eigenvec", "eigenval", "eigenvec.var", "afreq"):
        with open(tmp_path / f"py.{ext}") as a, open(tmp_path / f"o.{ext}") as b:
            assert a.read() == b.read(), ext
    # The loadings come back as without out=, and results are never overwritten.
    assert res.loadings is not None and res.loadings.shape == (2400, 3)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match="never overwrites"):
        rankwise.pca(spec, 3, seed=9, out=tmp_path / "py")
    with pytest.raises(ValueError, match="zarr_format"):
        rankwise.pca(spec, 3, out=tmp_path / "v4", zarr_format=4)
    assert sorted(os.listdir(tmp_path)) == before


def test_projection_reproduces_the_pca_and_the_command_line(tmp_path):
    seed = str(SEED % 1000)
    for name, s in (("g.zarr", seed), ("new.zarr", str(SEED % 1000 + 1))):
        run_cli("gen", "--out", name, "--rows", "2000", "--cols", "120", "--chunk-rows", "400",
                "--dist", "genotype", "--populations", "2", "--missing", "0.01",
                "--seed", s, cwd=tmp_path)
    spec = str(tmp_path / "g.zarr") + ":call_dosage"
    new = str(tmp_path / "new.zarr") + ":call_dosage"
    res = rankwise.pca(spec, 3, seed=9, maf=0.01, weights=tmp_path / "w")
    run_cli("pca", "--zarr", spec, "-k", "3", "--sketch-seed", "9", "--maf", "0.01",
            "--out", "o", cwd=tmp_path)
    # The library writes the files the command line writes, to the bit.
    for ext in ("eigenvec.var", "afreq"):
        with open(tmp_path / f"w.{ext}") as a, open(tmp_path / f"o.{ext}") as b:
            assert a.read() == b.read(), ext
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "w.eigenval"), res.eigenvalues)
    # The PCA's own samples land where the PCA put them.
    back = rankwise.project(spec, tmp_path / "w")
    assert back.matched == back.weighted and back.absent == 0
    assert np.max(np.abs(back.pcs - res.pcs)) < 1e-6
    # New samples: the command line's numbers, from a path and from a numpy array.
    run_cli("project", "--zarr", new, "--pca", "o", "--out", "pr", cwd=tmp_path)
    with open(tmp_path / "pr.eigenvec") as f:
        cli = np.array([[float(x) for x in line.split()[-3:]] for line in f.readlines()[1:]])
    p = rankwise.project(new, tmp_path / "o")
    np.testing.assert_array_equal(p.pcs, cli)
    import zarr

    dosages = zarr.open_array(str(tmp_path / "new.zarr"), path="call_dosage", mode="r")[...]
    from_numpy = rankwise.project(np.asarray(dosages, dtype=np.int8), tmp_path / "o",
                                  panel_rows=400)
    np.testing.assert_array_equal(from_numpy.pcs, p.pcs)
    with pytest.raises(FileNotFoundError, match="nothing.eigenvec.var"):
        rankwise.project(new, tmp_path / "nothing")


@pytest.mark.parametrize("zarr_format", ["3", "2"])
def test_the_pca_group_opens_in_xarray_without_a_warning(tmp_path, zarr_format):
    import warnings

    import xarray as xr

    run_cli("gen", "--out", "g.zarr", "--rows", "1500", "--cols", "90", "--chunk-rows", "500",
            "--dist", "genotype", "--populations", "3", "--seed", str(SEED % 1000), cwd=tmp_path)
    spec = str(tmp_path / "g.zarr") + ":call_dosage"
    run_cli("pca", "--zarr", spec, "-k", "3", "--sketch-seed", "9", "--out", "o.zarr",
            "--zarr-format", zarr_format, cwd=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = xr.open_zarr(str(tmp_path / "o.zarr"))
    assert ds["U"].dims == ("variants", "components")
    assert ds["Vt"].dims == ("components", "samples")
    assert ds["sample_pca_projection"].dims == ("samples", "components")
    ids = xr.open_zarr(str(tmp_path / "g.zarr"), consolidated=False)["sample_id"].values
    assert [str(x) for x in ds["sample_id"].values] == [str(x) for x in ids]
    assert [str(x) for x in ds["variant_id"].values[:3]] == ["v0", "v1", "v2"]
    s = ds["S"].values
    np.testing.assert_allclose(ds["sample_pca_projection"].values, ds["Vt"].values.T * s)
    np.testing.assert_allclose(ds["sample_pca_explained_variance"].values, s**2 / (90 - 1))
    # sgkit's loadings: U scaled so that each component's squares sum to its variance.
    loading = ds["sample_pca_loading"]
    assert loading.dims == ("variants", "components")
    np.testing.assert_allclose(loading.values, ds["U"].values * np.sqrt(s**2 / (90 - 1)))
    np.testing.assert_allclose((loading.values**2).sum(axis=0),
                               ds["sample_pca_explained_variance"].values)
    # The Python call returns the same loadings, to the bit, and so does its to_xarray.
    lib = rankwise.pca(spec, 3, seed=9)
    assert np.array_equal(lib.loading_rows, np.arange(1500))
    np.testing.assert_array_equal(lib.loadings, loading.values)
    np.testing.assert_array_equal(lib.to_xarray()["sample_pca_loading"].values, loading.values)
    assert lib.to_xarray()["sample_pca_loading"].dims == ("variants", "components")
    assert ds.attrs["report"]["command"] == "pca"
    assert ds.attrs["report"]["converged"] in (True, False)


# ---------------------------------------------------------------------------------------
# Inputs read where they lie


def test_a_numpy_matrix_is_read_in_place_neither_copied_nor_modified():
    r = rng(60)
    a = r.standard_normal((200_000, 16))  # 25.6 MB
    before = a.copy()
    a.flags.writeable = False  # read-only arrays are accepted
    res, peak = traced_peak(lambda: rankwise.rsvd(a, 3, seed=1, actors=1))
    assert res.converged
    # numpy's allocations are traced: a copy of `a` would show up (the results are small).
    assert peak < a.nbytes / 4, peak
    assert np.array_equal(a, before)


def test_a_dask_array_without_a_zarr_origin_is_computed_panel_by_panel():
    import dask.array as da

    r = rng(70)
    a = low_rank(r, 5000, 30, k=6)
    # from_array of a numpy array: that array, read in place.
    inplace = rankwise.rsvd(da.from_array(a, chunks=(700, 10)), 4, seed=5)
    assert np.array_equal(inplace.s, rankwise.rsvd(a, 4, seed=5).s)
    # A computed one: each chunk of rows computed as the actors read it, the panels its
    # chunks, with the bits of the same values in memory read in the same panels.
    computed = {}
    lock = threading.Lock()

    def count(b, block_info=None):
        with lock:
            i = block_info[0]["chunk-location"]
            computed[i] = computed.get(i, 0) + 1
        return b * 2.0

    x = da.from_array(a, chunks=(700, 10)).map_blocks(count, dtype=np.float64)
    before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    res = rankwise.rsvd(x, 4, seed=5, power_iters=2)
    same = rankwise.rsvd(2.0 * a, 4, seed=5, power_iters=2, panel_rows=700)
    assert np.array_equal(res.s, same.s) and np.array_equal(res.u, same.u)
    assert np.array_equal(res.vt, same.vt)
    # Nothing written: no temporary store.
    assert set(os.listdir(os.environ.get("TMPDIR", "/tmp"))) == before
    # Every chunk computed, and no more often than the passes over the matrix.
    assert len(computed) == 8 * 3, computed
    assert max(computed.values()) <= res.report["passes"] + 1, (computed, res.report["passes"])
    # The exact SVD of the same array, and of its short-and-fat transpose.
    sv = rankwise.svd(x)
    np.testing.assert_allclose(sv.s, np.linalg.svd(2.0 * a, compute_uv=False), rtol=1e-12)
    st = rankwise.svd(x.T)
    assert st.u.shape == (30, 30) and st.vt.shape == (30, 5000)
    np.testing.assert_allclose(st.s, sv.s, rtol=1e-12)
    # A dask array larger than what Python holds at once: 400,000 × 40 generated by dask
    # (128 MB), computed panel by panel; numpy's peak stays a few chunks.
    big = da.random.default_rng(7).standard_normal((400_000, 40), chunks=(20_000, 40))
    rb, peak = traced_peak(lambda: rankwise.rsvd(big, 3, power_iters=1, seed=2))
    assert peak < big.nbytes / 4, (peak, big.nbytes)
    assert rb.s[0] > 0


def test_a_dask_computation_that_raises_is_the_cause_of_the_error():
    import dask.array as da

    def fails(b, block_info=None):
        if block_info[0]["chunk-location"][0] == 2:
            raise ZeroDivisionError("chunk 2")
        return b

    x = da.from_array(low_rank(rng(71), 3000, 20, k=4), chunks=(500, 20))
    with pytest.raises(rankwise.RankwiseError) as e:
        rankwise.rsvd(x.map_blocks(fails, dtype=np.float64), 3)
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    assert e.value.cause == "input" and "rows 1000..1500" in str(e.value), str(e.value)
    # The message names the dask array.
    assert "the dask array" in str(e.value)


def test_dask_svd_compressed_is_a_drop_in(tmp_path):
    import dask.array as da
    import rankwise.dask as rd

    r = rng(80)
    a = low_rank(r, 6000, 50, k=10)
    x = da.from_array(a, chunks=(1000, 50))
    u, s, v = rd.svd_compressed(x, 5, n_power_iter=2, seed=3)
    du, ds, dv = da.linalg.svd_compressed(x, 5, n_power_iter=2, seed=3)
    assert isinstance(u, da.Array) and u.shape == du.shape and v.shape == dv.shape
    np.testing.assert_allclose(s.compute(), ds.compute(), rtol=1e-6)
    exact = np.linalg.svd(a, compute_uv=False)[:5]
    # The same iterations: about the same accuracy.
    dask_err = np.max(np.abs(ds.compute() - exact) / exact)
    assert np.max(np.abs(s.compute() - exact) / exact) <= 10 * dask_err + 1e-12


def test_a_store_in_an_s3_server_reads_as_it_does_from_disk(tmp_path, monkeypatch):
    import boto3
    import zarr

    # moto's S3 server on 127.0.0.1, stopped when its stdin closes (scripts/s3_server.py).
    server = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "s3_server.py")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        endpoint = f"http://127.0.0.1:{int(server.stdout.readline())}"
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_REGION": "us-east-1"}.items():
            monkeypatch.setenv(k, v)
        r = rng(55)
        a = low_rank(r, int(r.integers(2000, 5000)), 30, k=8)
        store = tmp_path / "a.zarr"
        z = zarr.create_array(str(store), shape=a.shape, chunks=(400, 30), dtype="f8")
        z[...] = a
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="data")
        for path in store.rglob("*"):
            if path.is_file():
                s3.upload_file(str(path), "data", "a.zarr/" + str(path.relative_to(store)))
        local = rankwise.rsvd(str(store), 4, seed=3)
        remote = rankwise.rsvd("s3://data/a.zarr", 4, seed=3, endpoint_url=endpoint)
        assert np.array_equal(local.s, remote.s) and np.array_equal(local.u, remote.u)
        with pytest.raises(FileNotFoundError):
            rankwise.rsvd("s3://data/missing.zarr", 4, endpoint_url=endpoint)
    finally:
        server.stdin.close()
        server.wait(timeout=30)


# ---------------------------------------------------------------------------------------
# Errors


def test_each_exception_type(tmp_path):
    a = np.ones((100, 5))
    with pytest.raises(ValueError, match="k"):
        rankwise.rsvd(a, 0)
    with pytest.raises(ValueError, match="method"):
        rankwise.rsvd(a, 2, method="magic")
    with pytest.raises(ValueError):
        rankwise.svd(np.ones((3, 4, 5)))
    with pytest.raises(TypeError):
        rankwise.svd([[1.0, 2.0]])
    with pytest.raises(FileNotFoundError):
        rankwise.rsvd(str(tmp_path / "missing.zarr"), 2)
    with pytest.raises(FileNotFoundError):
        rankwise.pca(str(tmp_path / "missing"), 2)
    # A store with a corrupt chunk: RankwiseError naming it.
    import zarr

    store = str(tmp_path / "bad.zarr")
    z = zarr.create_array(store, shape=(1000, 10), chunks=(250, 10), dtype="f8",
                          compressors=zarr.codecs.ZstdCodec())
    z[...] = 1.0
    with open(os.path.join(store, "c", "1", "0"), "wb") as f:
        f.write(b"not zstd")
    with pytest.raises(rankwise.RankwiseError, match="c/1/0") as e:
        rankwise.rsvd(store, 2, oversample=2)
    assert e.value.cause == "input"


def _has_gpu() -> bool:
    return any(n.startswith("nvidia") and n[6:].isdigit() for n in os.listdir("/dev"))


def test_device_picks_where_actors_compute():
    r = rng(95)
    a = r.standard_normal((20_000, 30)) @ np.diag(0.8 ** np.arange(30))
    cpu = rankwise.rsvd(a, 4, seed=3)
    same = rankwise.rsvd(a, 4, seed=3, device="cpu")
    np.testing.assert_array_equal(same.s, cpu.s)
    np.testing.assert_array_equal(same.u, cpu.u)
    with pytest.raises(ValueError, match="`device`.*not one of cpu, gpu, auto"):
        rankwise.rsvd(a, 4, device="tpu")
    auto = rankwise.rsvd(a, 4, seed=3, device="auto")
    if _has_gpu():
        # GPU actors: the same components to the tolerance, not the same bits.
        gpu = rankwise.rsvd(a, 4, seed=3, device="gpu")
        for res in (auto, gpu):
            np.testing.assert_allclose(res.s, cpu.s, rtol=1e-8)
            assert res.converged
    else:
        # Without a GPU, auto falls back to the CPU actors, and gpu says what is missing.
        np.testing.assert_array_equal(auto.s, cpu.s)
        with pytest.raises(rankwise.RankwiseError, match="`device` gpu needs") as e:
            rankwise.svd(a, device="gpu")
        assert "`device` cpu" in str(e.value), str(e.value)
    # pca and project take it too.
    d = r.integers(0, 3, size=(600, 40)).astype(np.int8)
    np.testing.assert_array_equal(rankwise.pca(d, 3, device="cpu").pcs, rankwise.pca(d, 3).pcs)


# ---------------------------------------------------------------------------------------
# A good extension: the GIL, Ctrl-C, the wheel


def test_other_python_threads_run_during_a_call():
    r = rng(90)
    a = r.standard_normal((400_000, 40))
    ticks = []
    done = threading.Event()

    def count():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.005)

    t = threading.Thread(target=count)
    t.start()
    start = time.perf_counter()
    rankwise.rsvd(a, 8, seed=1)
    end = time.perf_counter()
    done.set()
    t.join()
    during = [x for x in ticks if start < x < end]
    # The counter ticks through the call: the GIL was released.
    assert len(during) >= 0.5 * (end - start) / 0.005 * 0.5, (len(during), end - start)


def test_progress_reaches_a_callback_and_the_log(caplog):
    import logging

    r = rng(95)
    a = r.standard_normal((600_000, 40))
    seen = []
    # Reports come every half second. Twenty power iterations: about 2.5 s on 2 cores,
    # several reports; ten (about 1.3 s) for the calls that need one.
    rankwise.rsvd(a, 10, power_iters=20, seed=1, progress=seen.append)
    assert len(seen) >= 2, seen
    assert {"pass", "max_passes", "jobs", "jobs_done", "residual", "tol"} <= set(seen[-1])
    assert 1 <= seen[0]["pass"] <= seen[-1]["pass"]
    with caplog.at_level(logging.INFO, logger="rankwise"):
        rankwise.rsvd(a, 10, power_iters=10, seed=1)
    assert any(rec.getMessage().startswith("pass ") for rec in caplog.records)
    # A tqdm bar, drawn on stderr and closed when the call returns.
    import io
    import contextlib

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rankwise.rsvd(a, 10, power_iters=10, seed=1, progress=True)
    assert "pass" in err.getvalue()


def test_ctrl_c_raises_keyboard_interrupt_and_leaves_nothing_behind(tmp_path):
    # A fixed number of subspace iterations (about 0.5 s each here): a run to a tolerance
    # may stop early (LOBPCG stopped this flat spectrum after 3 passes, 1.4 s, and so
    # finished before the signal came).
    script = textwrap.dedent(
        """
        import sys, time, numpy as np, rankwise
        a = np.random.default_rng(1).standard_normal((1_500_000, 40))
        print("ready", flush=True)
        t = time.time()
        try:
            rankwise.rsvd(a, 20, method="subspace", power_iters=200, seed=1)
        except KeyboardInterrupt:
            print(f"interrupted after {time.time() - t:.2f}", flush=True)
            sys.exit(3)
        print("finished", flush=True)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                         cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.stdout.readline().strip() == "ready"
    time.sleep(1.5)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 3, out
    assert "interrupted after" in out
    assert os.listdir(tmp_path) == []


def test_the_wheel_installs_into_a_fresh_venv(tmp_path):
    wheel = os.environ.get("RANKWISE_WHEEL")
    if not wheel:
        pytest.fail("RANKWISE_WHEEL names the wheel under test (scripts/python-venv.sh)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    p = subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        wheel], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    p = subprocess.run(
        [py, "-c", "import numpy as np, rankwise; "
         "r = rankwise.svd(np.arange(12.0).reshape(4, 3) ** 2); print(r.s.shape, rankwise.__version__)"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[0] == "(3,)"
    help_text = subprocess.run([py, "-c", "import rankwise; help(rankwise.pca)"],
                               capture_output=True, text=True, cwd=tmp_path,
                               env={**os.environ, "PAGER": "cat"}).stdout
    assert "plink2 --pca" in help_text and "comm:" in help_text


# ---------------------------------------------------------------------------------------
# MPI through mpi4py


MPI_SCRIPT = """
import sys, numpy as np
from mpi4py import MPI
import rankwise
comm = MPI.COMM_WORLD
a = np.load(sys.argv[1])
# Each rank's messages go to a file of its own: mpirun forwards the ranks' stdout through
# one pipe, where two ranks' lines written at once can arrive joined.
def say(line):
    with open(sys.argv[3].replace(".npy", f"-rank{comm.rank}.log"), "a") as f:
        f.write(line + "\\n")
store = sys.argv[2]
# Each rank holds its own row block: 1000 rows each, the rest on the last.
rows = 1000
lo = comm.rank * rows
hi = a.shape[0] if comm.rank == comm.size - 1 else lo + rows
mine = np.ascontiguousarray(a[lo:hi])
r = rankwise.rsvd(mine, 4, seed=11, comm=comm, actors=1, pin=False)
assert np.array_equal(r.u_rows, np.arange(lo, hi)), r.u_rows[:3]
us = comm.gather(r.u, root=0)
z = rankwise.rsvd(store, 4, seed=11, comm=comm, actors=1, pin=False)
if comm.rank == 0:
    np.save(sys.argv[3], np.concatenate(us))
    np.save(sys.argv[3].replace(".npy", "-s.npy"), r.s)
    np.save(sys.argv[3].replace(".npy", "-vt.npy"), r.vt)
    np.save(sys.argv[3].replace(".npy", "-zs.npy"), z.s)
# A bad argument on one rank is every rank's error, and no rank hangs.
try:
    rankwise.rsvd(mine if comm.rank != 1 else mine[:, :3], 2, comm=comm, actors=1, pin=False)
except ValueError as e:
    say(f"rank {comm.rank}: ValueError: {e}")
# Each rank's block as a dask array with no origin: computed panel by panel where it is.
import dask.array as da
x = da.from_array(mine, chunks=(250, 24)) * 1.0
d = rankwise.rsvd(x, 4, seed=11, comm=comm, actors=1, pin=False)
ds = comm.gather(d.u, root=0)
if comm.rank == 0:
    np.save(sys.argv[3].replace(".npy", "-dask-u.npy"), np.concatenate(ds))
    np.save(sys.argv[3].replace(".npy", "-dask-s.npy"), d.s)
# A dask computation that raises on rank 2 mid-run fails every rank, naming rank 2.
def fails(b, block_info=None):
    if comm.rank == 2 and block_info[0]["chunk-location"][0] == 3:
        raise ZeroDivisionError("chunk 3 of rank 2")
    return b
try:
    rankwise.rsvd(x.map_blocks(fails, dtype=np.float64), 4, comm=comm, actors=1, pin=False)
except rankwise.RankwiseError as e:
    say(f"rank {comm.rank}: RankwiseError rank={e.rank} cause={e.__cause__!r}: {e}")
"""


def test_mpi4py_under_mpirun_gives_the_embedded_bits(tmp_path):
    import zarr

    if shutil.which("mpirun") is None:
        pytest.fail("mpirun is missing: scripts/install-deps.sh installs Open MPI")
    r = rng(100)
    a = low_rank(r, 3500, 24, k=8)
    np.save(tmp_path / "a.npy", a)
    store = str(tmp_path / "a.zarr")
    z = zarr.create_array(store, shape=a.shape, chunks=(500, 24), dtype="f8")
    z[...] = a
    (tmp_path / "job.py").write_text(MPI_SCRIPT)
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    p = subprocess.run(
        ["mpirun", "-np", "3", "--oversubscribe", sys.executable, str(tmp_path / "job.py"),
         str(tmp_path / "a.npy"), store, str(tmp_path / "u.npy")],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    embedded = rankwise.rsvd(a, 4, seed=11, panel_rows=1000)
    assert np.array_equal(np.load(tmp_path / "u-s.npy"), embedded.s)
    assert np.array_equal(np.load(tmp_path / "u-vt.npy"), embedded.vt)
    assert np.array_equal(np.load(tmp_path / "u.npy"), embedded.u)
    assert np.array_equal(np.load(tmp_path / "u-zs.npy"), rankwise.rsvd(store, 4, seed=11).s)
    said = {rank: (tmp_path / f"u-rank{rank}.log").read_text()
            if (tmp_path / f"u-rank{rank}.log").exists() else "" for rank in range(3)}
    for rank in range(3):
        assert f"rank {rank}: ValueError" in said[rank], (said, p.stdout + p.stderr)
    # The dask blocks: the embedded call's bits with the same panels (their chunks).
    dask_embedded = rankwise.rsvd(a, 4, seed=11, panel_rows=250)
    assert np.array_equal(np.load(tmp_path / "u-dask-s.npy"), dask_embedded.s)
    assert np.array_equal(np.load(tmp_path / "u-dask-u.npy"), dask_embedded.u)
    # The failing computation: every rank ends with rank 2's failure.
    lines = {rank: next((ln for ln in said[rank].splitlines()
                         if ln.startswith(f"rank {rank}: RankwiseError")), None)
             for rank in range(3)}
    assert all(lines.values()), (said, p.stdout + p.stderr)
    assert "ZeroDivisionError('chunk 3 of rank 2')" in lines[2], lines[2]
    for rank in range(3):
        assert "rank=2" in lines[rank] and "chunk 3 of rank 2" in lines[rank], lines[rank]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """Rates measured once for the sizing tests: the file ``calibrate`` wrote, and the
    dict it returned."""
    out = tmp_path_factory.mktemp("calibration") / "rates.json"
    return out, rankwise.calibrate(out, values=262144, device="cpu")


def test_plan_predicts_what_the_command_line_does(calibrated):
    rates = calibrated[0]
    import json

    for job, extra in (("svd", []), ("pca", ["-k", "20", "--passes", "30"]),
                       ("rsvd", ["--solver", "power-iters", "--passes", "4"])):
        cli = subprocess.run(
            [BIN, "plan", "--rows", "2000000", "--cols", "500", "--chunk-rows", "0",
             "--nodes", "8", "--ranks-per-node", "4", "--cores-per-node", "32",
             "--memory-per-node", "64G", "--network", "25,5us,1M", "--transport", "ucx",
             "--read-gbps", "2", "--job", job, "--calibration", str(rates), "--json",
             *extra],
            check=True, capture_output=True, text=True)
        want = json.loads(cli.stdout)
        kw = {"-k": "k", "--passes": "passes", "--solver": "solver"}
        options = {kw[extra[i]]: (extra[i + 1] if extra[i] == "--solver" else int(extra[i + 1]))
                   for i in range(0, len(extra), 2)}
        for calibration in (rates, json.loads(rates.read_text())):
            got = rankwise.plan(2_000_000, 500, calibration=calibration, job=job, nodes=8,
                                ranks_per_node=4, cores_per_node=32, memory_per_node="64G",
                                network="25,5us,1M", transport="ucx", read_gbps=2.0,
                                **options)
            assert got == want, job
    assert want["seconds"] > 0 and want["dominant"]
    with pytest.raises(ValueError, match="`network`"):
        rankwise.plan(1000, 10, calibration=rates, nodes=2, network="fast")
    with pytest.raises(ValueError, match="`nodes`"):
        rankwise.plan(1000, 10, calibration=rates, nodes=0)
    with pytest.raises(ValueError, match="`cores_per_node`"):
        rankwise.plan(1000, 10, calibration=rates, cores_per_node=0)
    with pytest.raises(ValueError, match="`rows`"):
        rankwise.plan(-1, 10, calibration=rates)
    # A node too small for one panel's workspace: its memory is what to raise.
    with pytest.raises(ValueError, match="`memory_per_node`: 1.0 MiB a node"):
        rankwise.plan(10_000_000, 500, calibration=rates, job="svd", memory_per_node="1M")
    # Rates no calibration makes: named as this call names them.
    edited = json.loads(rates.read_text())
    edited["svd"][0]["pass1"] = -1.0
    with pytest.raises(ValueError, match=r"`calibration`: `svd\[0\].pass1` is -1.0"):
        rankwise.plan(1000, 10, calibration=edited, job="svd")
    with pytest.raises(ValueError, match="`calibration`: not the rates"):
        rankwise.plan(1000, 10, calibration={"cores": 2})
    with pytest.raises(ValueError, match="`memory_per_node`"):
        rankwise.plan(1000, 10, calibration=rates, memory_per_node="lots")
    with pytest.raises(TypeError):
        rankwise.plan(1000, 10, calibration=3)


def test_calibrate_measures_the_rates_plan_takes(calibrated):
    import json

    out, rates = calibrated
    assert rates == json.loads(out.read_text())
    assert rates["unit"] == "core" and rates["cores"] >= 1
    widths = [w["cols"] for w in rates["svd"]]
    assert widths == sorted(widths) and len(widths) == 9
    assert all(w["pass1"] > 0 and w["pass2"] > 0 for w in rates["svd"])
    p = rankwise.plan(1_000_000, 2000, calibration=rates, nodes=4, network="10,5us")
    assert p["seconds"] > 0 and p["ranks"] == 4
    # Never over an existing file, checked before the measuring; nothing else left.
    with pytest.raises(FileExistsError, match="`out`"):
        rankwise.calibrate(out, values=65536)
    with pytest.raises(ValueError, match="`values`"):
        rankwise.calibrate(values=1000)
    assert sorted(os.listdir(out.parent)) == ["rates.json"]
