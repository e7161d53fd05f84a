"""rankwise from Python against its Python peers, in one run (benches/python.sh):

1. `rankwise.dask.svd_compressed` against `dask.array.linalg.svd_compressed` on the same
   dask array, in memory (`da.from_array`), from a Zarr store (`da.from_zarr`) and
   computed (no origin: rankwise computes it one panel of rows at a time), with the same
   power iterations and oversampling;
2. the cost of the Python call against the command line on the same work (`rsvd` of the
   same Zarr store, same options and seed).

Accuracy of both sides: the largest relative error of the top K singular values against
LAPACK's (numpy.linalg.svd of the whole matrix), and the largest residual
‖Avᵢ − σᵢuᵢ‖₂/σ₁ of the returned factors, computed here by numpy for both tools alike.
A sketch's accuracy depends on its random matrix as much as on the tool (one seed can be
ten times worse than the next for either), so each tool runs SEEDS seeds: the rows give
the median time and the median of each accuracy figure.

    python benches/python.py BIN WORKDIR ROWS COLS CHUNK_ROWS K   → JSON lines on stdout
"""

import json
import os
import subprocess
import sys
import time

import dask
import dask.array as da
import numpy as np
import zarr

import rankwise
import rankwise.dask

BIN, WORK = sys.argv[1], sys.argv[2]
ROWS, COLS, CHUNK, K = (int(v) for v in sys.argv[3:7])
Q, P, SEED = 2, 10, 7
SEEDS = range(1, 6)
os.makedirs(WORK, exist_ok=True)


def matrix():
    """ROWS × COLS: a decaying spectrum (σⱼ = 0.9ʲ) over noise, so that two power
    iterations separate the top K only partly: the accuracy columns tell them apart."""
    r = np.random.default_rng(1)
    u, _ = np.linalg.qr(r.standard_normal((ROWS, COLS)))
    v, _ = np.linalg.qr(r.standard_normal((COLS, COLS)))
    s = 0.9 ** np.arange(COLS)
    return (u * s) @ v.T


def accuracy(a, exact, u, s, vt):
    s = np.asarray(s)
    err = float(np.max(np.abs(s - exact[: len(s)]) / exact[: len(s)]))
    res = a @ vt.T - u * s
    residual = float(np.max(np.linalg.norm(res, axis=0)) / exact[0])
    return err, residual


def timed(f, repeat=3):
    best, out = None, None
    for _ in range(repeat):
        t = time.perf_counter()
        out = f()
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    return best, out


def emit(**row):
    print(json.dumps(row), flush=True)


a = matrix()
exact = np.linalg.svd(a, compute_uv=False)
store = os.path.join(WORK, "a.zarr")
z = zarr.create_array(store, shape=a.shape, chunks=(CHUNK, COLS), dtype="f8", overwrite=True)
z[...] = a

def seeds(run):
    """Median time and median accuracy over SEEDS seeds of `run(seed) -> (u, s, vt)`."""
    times, errs, residuals = [], [], []
    for seed in SEEDS:
        t = time.perf_counter()
        u, s, vt = run(seed)
        times.append(time.perf_counter() - t)
        e, r = accuracy(a, exact, u, s, vt)
        errs.append(e)
        residuals.append(r)
    return (float(np.median(times)), float(np.median(errs)), float(np.median(residuals)))


for source, x in (
    ("memory (da.from_array)", da.from_array(a, chunks=(CHUNK, COLS))),
    ("Zarr (da.from_zarr)", da.from_zarr(store)),
    # No origin to read: rankwise computes it one panel of rows at a time.
    ("computed (from_array * 1.0)", da.from_array(a, chunks=(CHUNK, COLS)) * 1.0),
):
    t, err, res = seeds(lambda seed: dask.compute(*da.linalg.svd_compressed(
        x, K, n_power_iter=Q, n_oversamples=P, seed=seed)))
    emit(what="svd_compressed", tool="dask", source=source, seconds=t, max_rel_err=err,
         max_residual=res, k=K, q=Q, seeds=len(SEEDS))
    t, err, res = seeds(lambda seed: dask.compute(*rankwise.dask.svd_compressed(
        x, K, n_power_iter=Q, n_oversamples=P, seed=seed)))
    emit(what="svd_compressed", tool="rankwise.dask", source=source, seconds=t,
         max_rel_err=err, max_residual=res, k=K, q=Q, seeds=len(SEEDS))

# The Python call against the command line: the same rsvd of the same store (the same
# bits: python/tests' test_rsvd_and_svd_of_a_zarr_array_have_the_command_lines_bits).
cli = [BIN, "rsvd", "--zarr", store, "-k", str(K), "--power-iters", str(Q),
       "--sketch-seed", str(SEED)]
t_cli, _ = timed(lambda: subprocess.run(cli, check=True, capture_output=True), repeat=5)
t_py, r = timed(lambda: rankwise.rsvd(store, K, power_iters=Q, seed=SEED), repeat=5)
err, res = accuracy(a, exact, r.u, r.s, r.vt)
emit(what="rsvd call", tool="rankwise CLI", source="Zarr", seconds=t_cli, k=K, q=Q,
     max_rel_err=err, max_residual=res)
emit(what="rsvd call", tool="rankwise Python", source="Zarr", seconds=t_py, k=K, q=Q,
     max_rel_err=err, max_residual=res, overhead=(t_py - t_cli) / t_cli)
