"""Dask reference for rankwise's randomized SVD workloads (`da.linalg.svd_compressed`).

Runs in the harness's virtualenv (./bench-venv), one workload per process so that its peak
RSS is its own; the result is one JSON object written to --out (or stdout).

    python benches/reference_rsvd.py --workload float64 --rows 20000 --cols 2000 \
        --row-chunk 2000 --col-chunk 500 -k 10 --oversample 10 --power-iters 2 --reps 3 \
        --blas-threads 1 --out result.json

`float64`: `x = da.random.random((rows, cols), chunks=(row_chunk, col_chunk))` (Dask's
legacy RandomState, as `da.random.random`, but seeded) built lazily; each timed repetition
is `da.linalg.svd_compressed(x, k, ...)` then `dask.compute(u, s, v)`, so generation is
inside the timed graph, as in Dask's own svd_compressed example.

`genotype`: a uint8 matrix of 0/1/2 genotypes (per variant, i.e. per row, an allele
frequency p ~ U(0.05, 0.5) and binomial(2, p) draws) is generated and persisted in memory
first (not timed). The timed part is the PLINK-style standardization per row, lazy in
Dask — mean 2p̂ and sd sqrt(2p̂(1 − p̂)) with p̂ estimated from the data, rows with sd 0 set
to 0, as float64 — followed by `svd_compressed`.

Both use the threaded scheduler with --workers threads (default 2). `--blas-threads 1`
sets OPENBLAS/OMP/MKL/... _NUM_THREADS=1 before NumPy is imported; `default` leaves the
environment alone (OpenBLAS then starts one thread per core in each Dask worker thread).

svd_compressed in Dask 2026.8.0:
    svd_compressed(a, k, iterator="power", n_power_iter=0, n_oversamples=10, seed=None,
                   compute=False, coerce_signs=True)
The subspace size is compression_level(min(m, n), k, n_oversamples) =
min(max(20, k + n_oversamples), min(m, n)). With the default iterator="power" the q power
iterations are plain products H = A (Aᵀ H) with no re-orthonormalization in between: a
single TSQR of H at the end (iterator="QR" would do a TSQR after every product). The test
matrix Ω is `default_rng(seed).standard_normal((n, l))`, chunked like A's columns.
compute=False (the default) makes the whole factorization one graph in which every pass
over A uses the same chunk keys, so the threaded scheduler keeps each generated chunk of A
in memory until its last pass: for `float64`, A is generated once per repetition and all
of it is resident (peak RSS ≈ 8·m·n bytes + ~70 MiB measured at small shapes), which at
200,000 × 20,000 (32 GB) is killed for memory on a 24 GiB machine. `--compute` passes
compute=True, Dask's documented setting for inputs larger than memory: H (and the
compression matrix) is persisted between passes and A is regenerated in every pass.
coerce_signs=True applies svd_flip to U and V.

Peak RSS (ru_maxrss) is read right after the timed repetitions, before the accuracy check
(not timed). For `genotype` it includes the persisted uint8 input and, for the same reason
as above, the whole standardized float64 matrix during the factorization. Accuracy: the relative
Frobenius residual sqrt(max(0, ‖A‖_F² − Σσᵢ²)) / ‖A‖_F (exact for the rank-k projection
UΣVᵀ = U Uᵀ A that svd_compressed returns, up to the orthogonality of U; ‖A‖_F² computed
with Dask, regenerating A from the same seeds) and max |UᵀU − I|.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

BLAS_ENV = (
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=["float64", "genotype"], required=True)
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--cols", type=int, required=True)
    p.add_argument("--row-chunk", type=int, required=True)
    p.add_argument("--col-chunk", type=int, required=True)
    p.add_argument("-k", "--k", type=int, default=10)
    p.add_argument("--oversample", type=int, default=10)
    p.add_argument("--power-iters", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--blas-threads", choices=["1", "default"], default="default")
    p.add_argument("--workers", type=int, default=2, help="Dask threads (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--compute",
        action="store_true",
        help="svd_compressed(compute=True): persist between passes, regenerate A per pass",
    )
    p.add_argument("--out", help="JSON output file (default: stdout)")
    args = p.parse_args(argv)
    for name in ("rows", "cols", "row_chunk", "col_chunk", "k", "reps", "workers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.oversample < 0 or args.power_iters < 0:
        p.error("--oversample and --power-iters must not be negative")
    if args.k > min(args.rows, args.cols):
        p.error("-k must not exceed min(rows, cols)")
    return args


# Parse first: the BLAS thread count must be in the environment before NumPy (and its
# OpenBLAS) is loaded.
ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.blas_threads == "1":
    for _name in BLAS_ENV:
        os.environ[_name] = "1"

import numpy as np  # noqa: E402
import dask  # noqa: E402
import dask.array as da  # noqa: E402
from dask.base import wait  # noqa: E402


def peak_rss_bytes():
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def float64_matrix(args):
    # Same generator as `da.random.random` (legacy RandomState), but with a fixed seed.
    return da.random.RandomState(args.seed).random_sample(
        (args.rows, args.cols), chunks=(args.row_chunk, args.col_chunk)
    )


def _genotype_block(block_info=None, seed=0):
    info = block_info[None]
    (r0, r1), (c0, c1) = info["array-location"]
    i, j = info["chunk-location"]
    # The allele frequency of a row depends only on its row block, so that every column
    # block of a row sees the same p.
    p = np.random.default_rng([seed, 0, i]).uniform(0.05, 0.5, size=(r1 - r0, 1))
    g = np.random.default_rng([seed, 1, i, j]).binomial(2, p, size=(r1 - r0, c1 - c0))
    return g.astype(np.uint8)


def genotype_matrix(args):
    """0/1/2 genotypes, uint8, rows = variants; deterministic in (seed, chunking)."""
    return da.map_blocks(
        _genotype_block,
        chunks=da.core.normalize_chunks(
            (args.row_chunk, args.col_chunk), (args.rows, args.cols)
        ),
        dtype=np.uint8,
        meta=np.empty((0, 0), dtype=np.uint8),
        seed=args.seed,
    )


def standardize(g):
    """PLINK-style per-row standardization, lazy: (g − 2p̂) / sqrt(2p̂(1 − p̂)), 0 where sd = 0."""
    mean = g.mean(axis=1, dtype=np.float64)  # 2p̂
    p = mean / 2.0
    var = 2.0 * p * (1.0 - p)
    ok = var > 0
    # No division by zero (and no RuntimeWarning): monomorphic rows get scale 0.
    scale = da.where(ok, 1.0 / da.sqrt(da.where(ok, var, 1.0)), 0.0)
    return (g.astype(np.float64) - mean[:, None]) * scale[:, None]


def run(args):
    kw = dict(scheduler="threads", num_workers=args.workers)
    # compute=True persists between passes with the default scheduler: the same one.
    dask.config.set(scheduler="threads", num_workers=args.workers)
    if args.workload == "float64":
        x = float64_matrix(args)
    else:
        g = genotype_matrix(args)
        # Not timed. With a local scheduler persist() computes before it returns; wait()
        # is a no-op then, kept in case a distributed client is ever in use.
        g = g.persist(**kw)
        wait(g)

    times = []
    for rep in range(args.reps):
        t = time.perf_counter()
        if args.workload == "genotype":
            x = standardize(g)
        u_, s_, v_ = da.linalg.svd_compressed(
            x,
            args.k,
            n_power_iter=args.power_iters,
            n_oversamples=args.oversample,
            seed=args.seed,
            compute=args.compute,
        )
        u, s, v = dask.compute(u_, s_, v_, **kw)
        times.append(time.perf_counter() - t)
        if rep + 1 < args.reps:
            del u, s, v, u_, s_, v_
    peak = peak_rss_bytes()

    # Accuracy (not timed). ‖A‖_F² regenerates A from the graph's seeds (float64) or the
    # persisted genotypes (genotype), so it is the same A.
    (norm2,) = dask.compute((x * x).sum(), **kw)
    norm2 = float(norm2)
    s = np.asarray(s, dtype=np.float64)
    resid2 = max(0.0, norm2 - float(np.sum(s * s)))
    u = np.asarray(u)
    gram = u.T @ u
    ortho = float(np.max(np.abs(gram - np.eye(gram.shape[0]))))

    return {
        "peer": f"Dask {dask.__version__} da.linalg.svd_compressed",
        "workload": args.workload,
        "shape": [args.rows, args.cols],
        "chunks": [args.row_chunk, args.col_chunk],
        "k": args.k,
        "oversample": args.oversample,
        "power_iters": args.power_iters,
        "blas_threads": args.blas_threads,
        "compute": args.compute,
        "workers": args.workers,
        "seed": args.seed,
        "times": times,
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "peak_rss_bytes": peak,
        "singular_values": s.tolist(),
        "relative_residual": (resid2**0.5) / (norm2**0.5) if norm2 > 0 else 0.0,
        "u_orthogonality": ortho,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dask": dask.__version__,
    }


def main():
    result = run(ARGS)
    text = json.dumps(result) + "\n"
    if ARGS.out:
        with open(ARGS.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
