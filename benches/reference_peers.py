"""Heat and Cubed on rankwise's workloads (benches/peers.sh).

Runs in ./peers-venv (tools/peers-venv.sh). One workload per process, so that its peak RSS
is its own; the result is one JSON object written to --out (by rank 0 under mpirun).

    python benches/reference_peers.py cubed-svd --rows 10000000 --cols 20 --chunk-rows 625000
    python benches/reference_peers.py cubed-reduce --n 50000 --chunk 10000
    mpirun -np 2 python benches/reference_peers.py heat-svd --rows 10000000 --cols 20
    mpirun -np 2 python benches/reference_peers.py heat-rsvd --rows 100000 --cols 20000 -k 10
    mpirun -np 2 python benches/reference_peers.py heat-rsvd --zarr STORE.zarr -k 10

Cubed: `cubed.random.random` (uniform float64, generated inside the plan, as rankwise
generates inside its job) with the given chunks, on Cubed's default local executor
(`threads`) with --workers workers and `allowed_mem` --allowed-mem per task; intermediates
go to a temporary work_dir under --work-dir, as Cubed writes them (Zarr on disk).
`cubed-svd` times `cubed.compute(u, s, vh)` of `xp.linalg.svd(x, full_matrices=False)`
(Cubed's TSQR); `cubed-reduce` times `xp.sum((x + 1)[::2, ::2])`. Cubed has no normal
generator, so its reduce sums uniform values (rankwise's `reduce --dist uniform` is its
counterpart); z is the sum's distance from count · 1.5 in standard deviations
(sqrt(count / 12)).

Heat (one MPI process per rank, `torch.set_num_threads(--threads)`): the matrix is a
DNDarray split along its rows. `heat-svd` times `ht.random.random` then `ht.linalg.svd`
(tall-skinny: Heat's TSQR); `heat-rsvd` times `ht.random.random` (or `ht.load_zarr`) then
`ht.linalg.rsvd(x, k, n_oversamples, power_iter)`. Heat holds the whole matrix in memory
(split across ranks), so the two steps are timed apart as well as together: "seconds" is
the whole job, as for rankwise, which generates or reads inside its passes.

Peak RSS: ru_maxrss of each process (each rank, gathered), read right after the timed
repetitions, before the accuracy check. Accuracy: ‖A − UΣVᵀ‖_F/‖A‖_F for the exact SVDs;
(‖A‖_F² − Σσ²)^½/‖A‖_F for the randomized one (‖A‖_F from the data).
"""

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time


def peak_rss_bytes():
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timing(times):
    return {
        "times": times,
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
    }


def write(out, result):
    text = json.dumps(result) + "\n"
    if out:
        tmp = f"{out}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, out)
    else:
        sys.stdout.write(text)


# --------------------------------------------------------------------------------------
# Cubed


def cubed_setup(args):
    import cubed
    from cubed.runtime.create import create_executor

    work = tempfile.mkdtemp(prefix="cubed-", dir=args.work_dir)
    spec = cubed.Spec(work_dir=work, allowed_mem=args.allowed_mem)
    executor = create_executor("threads", {"max_workers": args.workers})
    return cubed, spec, executor, work


def cubed_versions(cubed):
    import numpy as np

    return {"python": platform.python_version(), "cubed": cubed.__version__, "numpy": np.__version__}


def run_cubed_svd(args):
    import numpy as np

    cubed, spec, executor, work = cubed_setup(args)
    import cubed.array_api as xp
    import cubed.random

    try:
        times = []
        u = s = vh = None
        for _ in range(args.reps):
            # The last repetition's results go before this one's are made, so that the
            # peak RSS is one repetition's.
            u = s = vh = None
            x = cubed.random.random((args.rows, args.cols), chunks=(args.chunk_rows, args.cols),
                                    spec=spec)
            t = time.perf_counter()
            u_, s_, vh_ = xp.linalg.svd(x, full_matrices=False)
            u, s, vh = cubed.compute(u_, s_, vh_, executor=executor)
            times.append(time.perf_counter() - t)
        peak = peak_rss_bytes()
        # The array holds its chunks' seeds: computing it again yields the same values.
        a = np.asarray(x.compute(executor=executor))
        num = den = 0.0
        us = u * s
        for i in range(0, args.rows, args.chunk_rows):
            blk = a[i:i + args.chunk_rows]
            d = blk - us[i:i + args.chunk_rows] @ vh
            num += float(np.sum(d * d))
            den += float(np.sum(blk * blk))
        g = u.T @ u
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "peer": "cubed",
        **cubed_versions(cubed),
        "executor": f"threads, {args.workers} workers",
        "allowed_mem": args.allowed_mem,
        "shape": [args.rows, args.cols],
        "chunk_rows": args.chunk_rows,
        "seconds": timing(times),
        "peak_rss_bytes": peak,
        "relative_residual": (num / den) ** 0.5,
        "u_orthogonality": float(np.max(np.abs(g - np.eye(g.shape[0])))),
        "singular_values": [float(v) for v in s],
    }


def run_cubed_reduce(args):
    cubed, spec, executor, work = cubed_setup(args)
    import cubed.array_api as xp
    import cubed.random

    try:
        times, sums = [], []
        for _ in range(args.reps):
            x = cubed.random.random((args.n, args.n), chunks=(args.chunk, args.chunk), spec=spec)
            t = time.perf_counter()
            (total,) = cubed.compute(xp.sum((x + 1)[::2, ::2]), executor=executor)
            times.append(time.perf_counter() - t)
            sums.append(float(total))
        peak = peak_rss_bytes()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    count = ((args.n + 1) // 2) ** 2
    return {
        "peer": "cubed",
        **cubed_versions(cubed),
        "executor": f"threads, {args.workers} workers",
        "allowed_mem": args.allowed_mem,
        "n": args.n,
        "chunk": args.chunk,
        "count": count,
        "seconds": timing(times),
        "peak_rss_bytes": peak,
        "sum": sums[-1],
        "z": (sums[-1] - 1.5 * count) / (count / 12) ** 0.5,
    }


# --------------------------------------------------------------------------------------
# Heat


def heat_setup(args):
    import heat as ht
    import torch
    from mpi4py import MPI

    torch.set_num_threads(args.threads)
    ht.random.seed(args.seed)
    return ht, torch, MPI.COMM_WORLD


def heat_common(ht, torch, comm, args, peaks):
    import mpi4py
    from mpi4py import MPI

    return {
        "peer": "heat",
        "mpi4py": mpi4py.__version__,
        "python": platform.python_version(),
        "heat": ht.__version__,
        "torch": torch.__version__,
        "mpi": MPI.Get_library_version().splitlines()[0].strip().rstrip("\x00"),
        "ranks": comm.size,
        "threads_per_rank": args.threads,
        "per_rank_peak_rss_bytes": peaks,
        # The node's footprint: every rank's peak, added.
        "peak_rss_bytes": sum(peaks),
    }


def heat_reps(comm, reps, make, factor):
    """`reps` repetitions of `make()` (the matrix) then `factor(x)`, each step timed between
    barriers: the last matrix, the last result and both steps' times."""
    first, second = [], []
    x = result = None
    for _ in range(reps):
        # As in run_cubed_svd: one repetition's arrays at a time.
        x = result = None
        comm.Barrier()
        t = time.perf_counter()
        x = make()
        comm.Barrier()
        t1 = time.perf_counter()
        result = factor(x)
        comm.Barrier()
        first.append(t1 - t)
        second.append(time.perf_counter() - t1)
    return x, result, first, second


def run_heat_svd(args):
    ht, torch, comm = heat_setup(args)
    x, (u, s, vt), gen, fact = heat_reps(
        comm, args.reps,
        lambda: ht.random.random((args.rows, args.cols), dtype=ht.float64, split=0),
        ht.linalg.svd)
    peaks = comm.gather(peak_rss_bytes(), root=0)
    resid = ht.linalg.norm(x - (u * s) @ vt).item()
    norm = ht.linalg.norm(x).item()
    g = (u.T @ u).numpy()
    s_host = s.numpy().tolist()
    if comm.rank != 0:
        return None
    import numpy as np

    return {
        **heat_common(ht, torch, comm, args, peaks),
        "shape": [args.rows, args.cols],
        "generate_seconds": timing(gen),
        "svd_seconds": timing(fact),
        "seconds": timing([a + b for a, b in zip(gen, fact)]),
        "relative_residual": resid / norm,
        "u_orthogonality": float(np.max(np.abs(g - np.eye(g.shape[0])))),
        "singular_values": s_host,
    }


def run_heat_rsvd(args):
    ht, torch, comm = heat_setup(args)
    def make():
        if args.zarr:
            return ht.load_zarr(args.zarr, split=0)
        return ht.random.random((args.rows, args.cols), dtype=ht.float64, split=0)

    x, (u, s, vt), load, fact = heat_reps(
        comm, args.reps, make,
        lambda x: ht.linalg.rsvd(x, args.k, n_oversamples=args.oversample,
                                 power_iter=args.power_iters))
    peaks = comm.gather(peak_rss_bytes(), root=0)
    # Row blocks: a whole-array temporary would not fit beside the matrix.
    local = x.larray
    total = 0.0
    for i in range(0, local.shape[0], 4096):
        blk = local[i:i + 4096].double()
        total += float((blk * blk).sum())
    total = comm.allreduce(total)
    s_host = [float(v) for v in s.numpy()]
    if comm.rank != 0:
        return None
    captured = sum(v * v for v in s_host)
    return {
        **heat_common(ht, torch, comm, args, peaks),
        "shape": list(x.shape),
        "dtype": str(x.dtype.__name__),
        "source": args.zarr or "ht.random.random",
        "k": args.k,
        "oversample": args.oversample,
        "power_iters": args.power_iters,
        ("read_seconds" if args.zarr else "generate_seconds"): timing(load),
        "rsvd_seconds": timing(fact),
        "seconds": timing([a + b for a, b in zip(load, fact)]),
        "total_sum_squares": total,
        "relative_residual": max(total - captured, 0.0) ** 0.5 / total ** 0.5,
        "singular_values": s_host,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", choices=["cubed-svd", "cubed-reduce", "heat-svd", "heat-rsvd"])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--cols", type=int, default=20)
    p.add_argument("--chunk-rows", type=int, default=625_000)
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--chunk", type=int, default=10_000)
    p.add_argument("--zarr", help="heat-rsvd: read this Zarr array instead of generating")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--oversample", type=int, default=10)
    p.add_argument("--power-iters", type=int, default=0)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--allowed-mem", default="4GB")
    p.add_argument("--work-dir", default=tempfile.gettempdir())
    p.add_argument("--threads", type=int, default=1, help="torch threads per Heat rank")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out")
    args = p.parse_args()
    run = {
        "cubed-svd": run_cubed_svd,
        "cubed-reduce": run_cubed_reduce,
        "heat-svd": run_heat_svd,
        "heat-rsvd": run_heat_rsvd,
    }[args.workload]
    result = run(args)
    if result is not None:
        write(args.out, result)


if __name__ == "__main__":
    main()
