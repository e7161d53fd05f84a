"""Reference runs for benches/run.sh: NumPy's LAPACK and Dask on the main job's matrix.

Runs in the harness's virtualenv (./bench-venv). Each workload runs in its own process so
that its peak RSS is its own; the result is one JSON object on stdout.

    python benches/reference.py numpy --rows 10000000 --cols 20 --reps 3
    python benches/reference.py dask  --rows 10000000 --cols 20 --chunk-rows 625000 --reps 3
    python benches/reference.py dgemm --n 4000 --reps 3

`numpy`: generates a uniform float64 matrix in memory (NumPy's default generator, timed
separately), then times `np.linalg.svd(x, full_matrices=False)` (LAPACK gesdd in NumPy's
bundled OpenBLAS; OPENBLAS_NUM_THREADS sets its threads).

`dask`: times `dask.compute(u, s, v)` of `da.linalg.svd` of
`da.random.random((rows, cols), chunks=(chunk_rows, cols))` (Dask's TSQR) on the threaded
scheduler with `--workers` threads; generation happens inside the graph, as in rankwise.

Peak RSS is read right after the timed repetitions, before the accuracy check (which is
not timed and allocates more). The check is ‖A − UΣVᵀ‖_F / ‖A‖_F and max |UᵀU − I|.
"""

import argparse
import json
import resource
import statistics
import sys
import time

import numpy as np


def peak_rss_bytes():
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def summary(times):
    return {
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "all": times,
    }


def orthogonality(u):
    g = u.T @ u
    return float(np.max(np.abs(g - np.eye(g.shape[0]))))


def run_numpy(args):
    gen, fact = [], []
    for rep in range(args.reps):
        t = time.perf_counter()
        x = np.random.default_rng(args.seed + rep).random((args.rows, args.cols))
        gen.append(time.perf_counter() - t)
        t = time.perf_counter()
        u, s, vt = np.linalg.svd(x, full_matrices=False)
        fact.append(time.perf_counter() - t)
        if rep + 1 < args.reps:
            del x, u, s, vt
    peak = peak_rss_bytes()
    # Residual block by block, so the check does not need another full-size temporary.
    num = 0.0
    us = u * s
    for i in range(0, args.rows, 625_000):
        d = x[i : i + 625_000] - us[i : i + 625_000] @ vt
        num += float(np.sum(d * d))
    flat = x.ravel()
    den = float(flat @ flat)
    return {
        "peer": "numpy",
        "numpy": np.__version__,
        "generate_seconds": summary(gen),
        "svd_seconds": summary(fact),
        "total_seconds": summary([g + f for g, f in zip(gen, fact)]),
        "peak_rss_bytes": peak,
        "relative_residual": (num / den) ** 0.5,
        "u_orthogonality": orthogonality(u),
        "singular_values": s.tolist(),
    }


def run_dask(args):
    import dask
    import dask.array as da

    times = []
    for rep in range(args.reps):
        x = da.random.random((args.rows, args.cols), chunks=(args.chunk_rows, args.cols))
        t = time.perf_counter()
        u_, s_, v_ = da.linalg.svd(x)
        u, s, vt = dask.compute(u_, s_, v_, scheduler="threads", num_workers=args.workers)
        times.append(time.perf_counter() - t)
        if rep + 1 < args.reps:
            del x, u, s, vt
    peak = peak_rss_bytes()
    # The graph of `x` holds its chunks' seeds, so computing it again yields the same values.
    ud = da.from_array(u * s, chunks=(args.chunk_rows, args.cols))
    resid = da.linalg.norm(x - ud @ vt)
    norm = da.linalg.norm(x)
    resid, norm = dask.compute(resid, norm, scheduler="threads", num_workers=args.workers)
    return {
        "peer": "dask",
        "dask": dask.__version__,
        "numpy": np.__version__,
        "workers": args.workers,
        "seconds": summary(times),
        "peak_rss_bytes": peak,
        "relative_residual": float(resid / norm),
        "u_orthogonality": orthogonality(u),
        "singular_values": np.asarray(s).tolist(),
    }


def run_dgemm(args):
    rng = np.random.default_rng(args.seed)
    a = rng.random((args.n, args.n))
    b = rng.random((args.n, args.n))
    np.dot(a, b)  # warm-up
    times = []
    for _ in range(args.reps):
        t = time.perf_counter()
        np.dot(a, b)
        times.append(time.perf_counter() - t)
    best = min(times)
    return {
        "peer": "numpy-dgemm",
        "numpy": np.__version__,
        "n": args.n,
        "seconds": best,
        "gflops": 2.0 * args.n**3 / best / 1e9,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", choices=["numpy", "dask", "dgemm"])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--cols", type=int, default=20)
    p.add_argument("--chunk-rows", type=int, default=625_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    run = {"numpy": run_numpy, "dask": run_dask, "dgemm": run_dgemm}[args.workload]
    json.dump(run(args), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
