"""Dask references for `rankwise reduce` and `rankwise tasks` (benches/reduce.sh).

Runs in the harness's virtualenv (./bench-venv), one workload per process so that its peak
RSS is its own; the result is one JSON object written to --out (or stdout).

    python benches/reference_reduce.py reduce --n 10000 --chunk 2000 --reps 3 --workers 2
    python benches/reference_reduce.py tasks --tasks 100000 --reps 3 --workers 2

`reduce`: `x = da.random.default_rng(seed).standard_normal((n, n), chunks=(chunk, chunk))`,
then `(x + add)[::step, ::step].sum()` computed on the threaded scheduler with --workers
threads. Each timed repetition builds the graph and computes it (generation is inside the
graph, as in rankwise, which generates its values inside the job too). Dask generates every
value of each chunk and slices afterwards; rankwise generates only the selected ones.

`tasks`: the scheduler's cost per task, measured the way Dask's own documentation does
(docs/source/scripts/scheduling.py behind the "Shared Memory" page's scheduler overhead
figures): a raw task graph of no-op tasks run by `dask.threaded.get(dsk, keys,
num_workers=...)`, here one task per chunk of a grid of N chunks,
`{("noop", i): (noop, i) for i in range(N)}`, so there is no array code in the way; the
graph is built before the clock starts, as in that script, and its build time is reported
apart. `--form array` times the array idiom instead: `da.ones(N, chunks=1).map_blocks(noop)`
persisted (blockwise fusion leaves one task per chunk), graph construction included.

Accuracy of `reduce`: the sum of `count` values of mean `add` and variance 1 has expectation
`count · add` and standard deviation `sqrt(count)`; the z-score (sum − count·add)/sqrt(count)
is reported, as rankwise reports it, so both answers are seen to be the same quantity.
Peak RSS (ru_maxrss) is read right after the timed repetitions.
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
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
# Dask's workers are the parallelism: no library thread pools beside them (numpy's random
# generation and sums are single-threaded anyway; this only stops BLAS from starting its).
for _name in BLAS_ENV:
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402


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


def versions():
    import dask

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dask": dask.__version__,
    }


def run_reduce(args):
    import dask
    import dask.array as da

    times, total = [], None
    for _ in range(args.reps):
        t = time.perf_counter()
        x = da.random.default_rng(args.seed).standard_normal(
            (args.n, args.n), chunks=(args.chunk, args.chunk)
        )
        expr = (x + args.add)[:: args.step, :: args.step].sum()
        (total,) = dask.compute(expr, scheduler="threads", num_workers=args.workers)
        times.append(time.perf_counter() - t)
    peak = peak_rss_bytes()
    total = float(total)
    count = (-(-args.n // args.step)) ** 2
    return {
        "peer": f"Dask {dask.__version__} (x + {args.add:g})[::{args.step}, ::{args.step}].sum()",
        "shape": [args.n, args.n],
        "chunks": [args.chunk, args.chunk],
        "step": args.step,
        "add": args.add,
        "workers": args.workers,
        "sum": total,
        "count": count,
        "z_score": (total - count * args.add) / count**0.5,
        "generated_bytes": args.n * args.n * 8,
        "values_bytes": count * 8,
        "peak_rss_bytes": peak,
        **timing(times),
        **versions(),
    }


def noop(x):
    return x


def run_tasks(args):
    import dask
    import dask.threaded

    n = args.tasks
    build, times = [], []
    for _ in range(args.reps):
        if args.form == "graph":
            t = time.perf_counter()
            dsk = {("noop", i): (noop, i) for i in range(n)}
            keys = list(dsk)
            build.append(time.perf_counter() - t)
            t = time.perf_counter()
            out = dask.threaded.get(dsk, keys, num_workers=args.workers)
            times.append(time.perf_counter() - t)
            done = len(out)
            del dsk, keys, out
        else:
            import dask.array as da

            t = time.perf_counter()
            x = da.ones(n, chunks=1, dtype=np.int8).map_blocks(noop, dtype=np.int8)
            (y,) = dask.persist(x, scheduler="threads", num_workers=args.workers)
            times.append(time.perf_counter() - t)
            build.append(0.0)
            done = y.npartitions
            del x, y
        if done != n:
            sys.exit(f"reference_reduce.py tasks: {done} results for {n} tasks")
    peak = peak_rss_bytes()
    med = statistics.median(times)
    return {
        "peer": (
            f"Dask {dask.__version__} dask.threaded.get of {n} no-op tasks"
            if args.form == "graph"
            else f"Dask {dask.__version__} da.ones({n}, chunks=1).map_blocks(noop), persisted"
        ),
        "form": args.form,
        "tasks": n,
        "workers": args.workers,
        "build_seconds": build,
        "tasks_per_second": n / med,
        "microseconds_per_task": med / n * 1e6,
        "peak_rss_bytes": peak,
        **timing(times),
        **versions(),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reduce", help="(x + add)[::step, ::step].sum() of a normal matrix")
    r.add_argument("--n", type=int, required=True, help="rows and columns")
    r.add_argument("--chunk", type=int, required=True, help="rows and columns per chunk")
    r.add_argument("--step", type=int, default=2)
    r.add_argument("--add", type=float, default=1.0)
    r.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("tasks", help="N no-op tasks on the threaded scheduler")
    t.add_argument("--tasks", type=int, required=True)
    t.add_argument("--form", choices=["graph", "array"], default="graph")
    for s in (r, t):
        s.add_argument("--reps", type=int, default=3)
        s.add_argument("--workers", type=int, default=os.cpu_count())
        s.add_argument("--out", help="JSON output file (default: stdout)")
    args = p.parse_args()
    for name in ("n", "chunk", "step", "tasks", "reps", "workers"):
        if getattr(args, name, 1) < 1:
            p.error(f"--{name} must be at least 1")
    result = {"reduce": run_reduce, "tasks": run_tasks}[args.cmd](args)
    text = json.dumps(result) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
