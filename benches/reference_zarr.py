"""Zarr input benchmark: writes the test store with zarr-python, and runs the Dask peer on it.

Runs in the harness's virtualenv (./bench-venv, made by tools/bench-venv.sh), one
workload per process so that its peak RSS is its own; each result is one JSON object
written to --out (or stdout). benches/zarr.sh drives it.

    python benches/reference_zarr.py write --store S.zarr --format 3 --rows 200000 \
        --cols 5000 --row-chunk 20000 [--seed 0]
    python benches/reference_zarr.py read --store S.zarr --reps 3 [--workers 2] --out r.json
    python benches/reference_zarr.py svd --store S.zarr -k 10 --power-iters 0 --reps 1 \
        [--oversample 10] [--workers 2] [--blas-threads 1|default] --out s.json

`write`: a float32 array of shape rows × cols, chunks row_chunk × cols, compressed with
Blosc lz4, bitshuffle, clevel 5 (zarr_format 3: the `blosc` codec after `bytes`; zarr_format
2: the numcodecs Blosc compressor). Values are uniform on [0, 1), one generator per chunk
(`default_rng([seed, chunk])`), written one chunk at a time so that memory stays at one
chunk. The store is written under STORE.tmp-PID and renamed when complete.

`read`: `x = da.from_zarr(store)`; each timed repetition opens the store and computes
`x.sum(dtype=float64)`: every chunk is read and decoded once. The sum is the accuracy
column (rankwise's `read` reports the same sum).

`svd`: `da.linalg.svd_compressed(da.from_zarr(store), k, n_power_iter=q,
n_oversamples=p, seed=0)` then `dask.compute(u, s, v)`, timed from opening the store.
Dask 2026.8.0's svd_compressed defaults to n_power_iter=0 and n_oversamples=10; with
compute=False (the default, used here) its passes over A share one graph, so the threaded
scheduler keeps decoded chunks of A in memory until their last pass. The product runs in
float32 (the array's dtype). Accuracy (not timed): the relative Frobenius residual
sqrt(max(0, ‖A‖_F² − Σσᵢ²)) / ‖A‖_F, with ‖A‖_F² from another pass in float64, and
max |UᵀU − I|.

Both use Dask's threaded scheduler with --workers threads (default: the CPU count).
`--blas-threads 1` sets OPENBLAS/OMP/MKL/... _NUM_THREADS=1 before NumPy is imported (one
BLAS thread per Dask worker); `default` leaves the environment alone. Peak RSS is ru_maxrss
right after the timed repetitions.
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
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the benchmark store with zarr-python")
    w.add_argument("--store", required=True)
    w.add_argument("--format", type=int, choices=[2, 3], required=True)
    w.add_argument("--rows", type=int, required=True)
    w.add_argument("--cols", type=int, required=True)
    w.add_argument("--row-chunk", type=int, required=True)
    w.add_argument("--seed", type=int, default=0)
    for name in ("read", "svd"):
        s = sub.add_parser(name)
        s.add_argument("--store", required=True)
        s.add_argument("--reps", type=int, default=3)
        s.add_argument("--workers", type=int, default=os.cpu_count())
        s.add_argument("--blas-threads", choices=["1", "default"], default="1")
        s.add_argument("--out", help="JSON output file (default: stdout)")
        if name == "svd":
            s.add_argument("-k", "--k", type=int, default=10)
            s.add_argument("--oversample", type=int, default=10)
            s.add_argument("--power-iters", type=int, default=0)
    args = p.parse_args(argv)
    for name in ("rows", "cols", "row_chunk", "reps", "workers", "k"):
        if getattr(args, name, 1) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


# Parse first: the BLAS thread count must be in the environment before NumPy is loaded.
ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and getattr(ARGS, "blas_threads", None) == "1":
    for _name in BLAS_ENV:
        os.environ[_name] = "1"

import numpy as np  # noqa: E402
import zarr  # noqa: E402


def peak_rss_bytes():
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write(args):
    import shutil

    import numcodecs
    from zarr.codecs import BloscCodec

    if os.path.exists(args.store):
        sys.exit(f"reference_zarr.py: {args.store} exists already")
    tmp = f"{args.store}.tmp-{os.getpid()}"
    if args.format == 3:
        compressors = BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle")
    else:
        compressors = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.BITSHUFFLE)
    t = time.perf_counter()
    a = zarr.create_array(
        tmp,
        shape=(args.rows, args.cols),
        chunks=(args.row_chunk, args.cols),
        dtype="float32",
        compressors=compressors,
        zarr_format=args.format,
        attributes={"generator": f"benches/reference_zarr.py write --seed {args.seed}"},
    )
    total = 0.0
    for c, r0 in enumerate(range(0, args.rows, args.row_chunk)):
        r1 = min(r0 + args.row_chunk, args.rows)
        block = np.random.default_rng([args.seed, c]).random((r1 - r0, args.cols), dtype=np.float32)
        total += float(block.sum(dtype=np.float64))
        a[r0:r1, :] = block
    os.rename(tmp, args.store)
    stored = sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.store) for f in fs
    )
    return {
        "store": args.store,
        "zarr_format": args.format,
        "shape": [args.rows, args.cols],
        "chunks": [args.row_chunk, args.cols],
        "dtype": "float32",
        "codec": "blosc lz4 bitshuffle clevel 5",
        "seed": args.seed,
        "sum": total,
        "stored_bytes": stored,
        "decoded_bytes": args.rows * args.cols * 4,
        "seconds": time.perf_counter() - t,
        "zarr": zarr.__version__,
    }


def read(args):
    import dask
    import dask.array as da

    kw = dict(scheduler="threads", num_workers=args.workers)
    times, total, x = [], None, None
    for _ in range(args.reps):
        t = time.perf_counter()
        x = da.from_zarr(args.store)
        (total,) = dask.compute(x.sum(dtype=np.float64), **kw)
        times.append(time.perf_counter() - t)
    peak = peak_rss_bytes()
    return common(args, x, times, peak) | {
        "peer": f"Dask {dask.__version__} da.from_zarr(...).sum()",
        "sum": float(total),
    }


def svd(args):
    import dask
    import dask.array as da

    kw = dict(scheduler="threads", num_workers=args.workers)
    times = []
    for rep in range(args.reps):
        t = time.perf_counter()
        x = da.from_zarr(args.store)
        u_, s_, v_ = da.linalg.svd_compressed(
            x, args.k, n_power_iter=args.power_iters, n_oversamples=args.oversample, seed=0
        )
        u, s, v = dask.compute(u_, s_, v_, **kw)
        times.append(time.perf_counter() - t)
        if rep + 1 < args.reps:
            del u, s, v, u_, s_, v_
    peak = peak_rss_bytes()

    # Accuracy (not timed): ‖A‖_F² in float64 from another pass over the store.
    (norm2,) = dask.compute((x.astype(np.float64) ** 2).sum(), **kw)
    norm2 = float(norm2)
    s = np.asarray(s, dtype=np.float64)
    resid2 = max(0.0, norm2 - float(np.sum(s * s)))
    u = np.asarray(u, dtype=np.float64)
    gram = u.T @ u
    return common(args, x, times, peak) | {
        "peer": f"Dask {dask.__version__} da.linalg.svd_compressed",
        "k": args.k,
        "oversample": args.oversample,
        "power_iters": args.power_iters,
        "singular_values": s.tolist(),
        "relative_residual": (resid2**0.5) / (norm2**0.5) if norm2 > 0 else 0.0,
        "u_orthogonality": float(np.max(np.abs(gram - np.eye(gram.shape[0])))),
    }


def common(args, x, times, peak):
    import dask

    med = statistics.median(times)
    return {
        "store": args.store,
        "zarr_format": zarr.open_array(args.store, mode="r").metadata.zarr_format,
        "shape": list(x.shape),
        "chunks": [c[0] for c in x.chunks],
        "decoded_bytes": int(x.nbytes),
        "workers": args.workers,
        "blas_threads": args.blas_threads,
        "times": times,
        "median": med,
        "min": min(times),
        "max": max(times),
        "decoded_gb_per_s": x.nbytes / med / 1e9,
        "peak_rss_bytes": peak,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dask": dask.__version__,
        "zarr": zarr.__version__,
    }


def main():
    result = {"write": write, "read": read, "svd": svd}[ARGS.cmd](ARGS)
    text = json.dumps(result) + "\n"
    if getattr(ARGS, "out", None):
        with open(ARGS.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
