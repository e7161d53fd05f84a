"""rankwise: distributed SVD and PCA of matrices too large for one machine.

Its calls, each a thin client of the rankwise library (the same code as the
``rankwise`` command line and the C library):

* :func:`svd` -- the exact SVD (TSQR) of a tall matrix;
* :func:`rsvd` -- the rank-``k`` randomized SVD, iterated until every component has
  converged (LOBPCG; block Lanczos for :func:`pca`) or for a fixed number of power
  iterations;
* :func:`pca` -- the genotype PCA of a PLINK fileset, a VCF Zarr store, a Zarr array of
  dosages, an sgkit/xarray Dataset or an int8 numpy array, on PLINK 2's scale;
* :func:`project` -- new samples on the axes of an earlier PCA;
* :func:`calibrate` and :func:`plan` -- a job's predicted time and memory per rank on a
  cluster, from the rates measured on one of its nodes.

Inputs are read where they lie: a float64 or float32 numpy array in place (no copy), a
Zarr array or store by its path or URL (``s3://``, ``gs://``, ``http(s)://``), a
zarr-python ``Array`` and a dask array from Zarr by their store. With ``comm=`` (an mpi4py
communicator) every rank of a ``mpirun``/``srun`` job takes part, each holding its own
row block of a numpy matrix.

The work runs without the GIL; Ctrl-C raises :class:`KeyboardInterrupt` once the
actors have stopped. Errors are :class:`ValueError` (a bad argument),
:class:`FileNotFoundError` (a missing input) or :class:`RankwiseError`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np


# Code that loads the extension from its file (`sys.argv[1]`) as `x`, without this package,
# whose import chooses the BLAS kernels: what a child interpreter runs to ask OpenBLAS's
# own choice (below), or to measure other kernels (`machine_limit`, from the extension).
_EXTENSION_ALONE = ("import importlib.machinery as m, importlib.util as u, sys\n"
                    "l = m.ExtensionFileLoader('rankwise._rankwise', sys.argv[1])\n"
                    "x = u.module_from_spec(u.spec_from_loader('rankwise._rankwise', l))\n"
                    "l.exec_module(x)\n")


def _blas_kernels_to_load() -> Optional[str]:
    """The ``OPENBLAS_CORETYPE`` that the ``rankwise`` command line would run with here, or
    None where OpenBLAS's own choice is kept.

    OpenBLAS chooses its kernels once, when it is loaded, and the command line starts
    itself again with layout-independent ones where OpenBLAS would choose AVX-512 kernels
    (whose results depend on the operands' addresses, so that runs on different numbers
    of ranks differ in the last bits) or its generic SSE3 ones (on a CPU model it does not
    know). This package cannot start Python again: it asks a short process of this
    interpreter, which loads the extension with OpenBLAS's own choice
    (``_rankwise.blas_kernels``), before it loads the extension itself.
    """
    if "OPENBLAS_CORETYPE" in os.environ:
        return None
    import importlib.machinery
    import subprocess
    import sys

    spec = importlib.machinery.PathFinder.find_spec("_rankwise", __path__)
    if spec is None or not spec.origin or not sys.executable:
        return None
    code = _EXTENSION_ALONE + "print(x.blas_kernels()[1] or '')\n"
    try:
        out = subprocess.run([sys.executable, "-c", code, spec.origin], capture_output=True,
                             text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    return lines[-1] if out.returncode == 0 and lines else None


def _load_extension():
    chosen_by_user = "OPENBLAS_CORETYPE" in os.environ
    core = _blas_kernels_to_load()
    if core is not None:
        os.environ["OPENBLAS_CORETYPE"] = core
    try:
        from . import _rankwise as ext
    finally:
        # Only this load reads it: a library loaded later keeps its own choice.
        if core is not None:
            del os.environ["OPENBLAS_CORETYPE"]
    loaded, wanted = ext.blas_kernels()
    if wanted is not None and not chosen_by_user:
        # OpenBLAS was loaded before (by another module linked to the same library), or
        # the process that asks could not run.
        logging.getLogger(__name__).warning(
            "OpenBLAS runs its %s kernels in this process: results may differ in the last "
            "bits between numbers of ranks and from the rankwise command line, which runs "
            "%s; set OPENBLAS_CORETYPE=%s before Python starts", loaded, wanted, wanted)
    return ext


_rankwise = _load_extension()

__all__ = [
    "svd",
    "rsvd",
    "pca",
    "project",
    "plan",
    "calibrate",
    "SVDResult",
    "PCAResult",
    "ProjectionResult",
    "RankwiseError",
    "__version__",
]

__version__ = _rankwise.version()

log = logging.getLogger("rankwise")


class RankwiseError(RuntimeError):
    """A failure of a rankwise call: a source that cannot be read, a run that did not
    converge where convergence was required, another rank's failure.

    Attributes:
        rank: the rank where the failure happened: this one, or, when another rank
            failed first (``cause`` ``"transport"``), that rank.
        cause: what failed: ``"input"`` (a file, store, chunk or value that cannot be
            used), ``"not-converged"``, ``"transport"`` (another rank's failure, a lost
            connection), ``"runtime"`` or ``"compute"``.
    """

    def __init__(self, message: str, rank: int = 0, cause: str = "compute"):
        super().__init__(message)
        self.rank = rank
        self.cause = cause


@dataclass
class SVDResult:
    """A (truncated) SVD ``A ≈ U diag(s) Vᵀ``.

    Attributes:
        u: left singular vectors, ``m × k`` (with ``comm=``: this rank's rows of ``U``,
            the rows listed in ``u_rows``).
        s: singular values, descending.
        vt: right singular vectors as rows, ``k × n``.
        u_rows: the global row of each row of ``u``.
        residuals: each component's residual ``‖Aᵀuᵢ − σᵢvᵢ‖₂ / σ₁`` (randomized SVD).
        converged: whether every component met the tolerance (always True for the
            exact SVD).
        report: the rest: the convergence report, passes, bytes read, and `phases`
            (this rank's phases: name, seconds, `flops`, the floating-point operations
            of its products with the whole matrix, and `produced_bytes`, the matrix
            values this rank produced in it at 8 bytes a value).
    """

    u: np.ndarray
    s: np.ndarray
    vt: np.ndarray
    u_rows: np.ndarray
    residuals: Optional[np.ndarray] = None
    converged: bool = True
    report: dict = field(default_factory=dict)

    def __iter__(self):
        # `u, s, vt = rankwise.rsvd(a, k)`, as numpy.linalg.svd unpacks.
        return iter((self.u, self.s, self.vt))


@dataclass
class PCAResult:
    """A genotype PCA, as ``plink2 --pca`` gives it.

    Attributes:
        pcs: the principal components, samples × k, unit columns (``.eigenvec``).
        eigenvalues: eigenvalues of the genetic relationship matrix (``.eigenval``).
        explained_variance_ratio: each component's share of the total variance.
        singular_values: of the standardized genotype matrix.
        sample_ids: the samples, in row order of ``pcs``.
        family_ids: their family IDs (a PLINK fileset's FIDs), else None.
        residuals: each component's residual against the tolerance.
        converged: whether every component met it.
        variants_used: variants after selection and filters.
        report: the convergence report, the passes, this rank's ``phases`` (name,
            seconds, ``flops`` of the products with the whole matrix) and, with
            ``machine_limit``, ``gemm_peak_flops`` (with ``gemm_kernels`` and
            ``gemm_loaded_flops``, as for :func:`svd`).
        loadings: sgkit's ``sample_pca_loading`` rows that this rank holds (all of them
            in one process): variants × k, ``U`` scaled by ``√(explained variance)``.
        loading_rows: the variant index of each row of ``loadings``.
    """

    pcs: np.ndarray
    eigenvalues: np.ndarray
    explained_variance_ratio: np.ndarray
    singular_values: np.ndarray
    sample_ids: list
    family_ids: Optional[list]
    residuals: np.ndarray
    converged: bool
    variants_used: int
    report: dict = field(default_factory=dict)
    loadings: Optional[np.ndarray] = None
    loading_rows: Optional[np.ndarray] = None

    def to_xarray(self):
        """The result as an xarray Dataset with sgkit's names: ``sample_pca_projection``
        (samples × components: the scores, ``pcs · σ``), ``sample_pca_explained_variance``
        (``σ² / (samples − 1)``), ``sample_pca_explained_variance_ratio``, the
        ``sample_id`` coordinate, ``sample_pca_loading`` (variants × components) when
        this rank holds every variant's row (always in one process), and rankwise's
        ``sample_pca_eigenvalue`` (PLINK 2's scale) and ``sample_pca_residual``."""
        import xarray as xr

        n = self.pcs.shape[0]
        s = np.asarray(self.singular_values)
        loading = {}
        rows = self.loading_rows
        if self.loadings is not None and rows is not None and \
                np.array_equal(rows, np.arange(len(rows))):
            loading["sample_pca_loading"] = (("variants", "components"), self.loadings)
        return xr.Dataset(
            {
                **loading,
                "sample_pca_projection": (("samples", "components"), self.pcs * s),
                "sample_pca_explained_variance": (("components",), s**2 / max(n - 1, 1)),
                "sample_pca_explained_variance_ratio": (
                    ("components",),
                    np.asarray(self.explained_variance_ratio),
                ),
                "sample_pca_eigenvalue": (("components",), np.asarray(self.eigenvalues)),
                "sample_pca_residual": (("components",), np.asarray(self.residuals)),
                "sample_id": (("samples",), np.asarray(self.sample_ids, dtype=object)),
            },
            attrs={"converged": int(self.converged), "variants_used": self.variants_used},
        )


@dataclass
class ProjectionResult:
    """New samples' PCs on the axes of an earlier PCA (``plink2 --score`` with its
    variant weights), on the scale of that PCA's ``pcs``.

    Attributes:
        pcs: samples × k.
        sample_ids: the samples, in row order of ``pcs``.
        family_ids: their family IDs (a PLINK fileset's FIDs), else None.
        matched: weighted variants found with a matching allele; flipped: of those,
            matched through the other allele; absent: weighted variants the data lacks;
            allele_mismatches: weighted variants with neither allele; unnamed: variants
            of the data without an ID; weighted: weighted variants in all.
    """

    pcs: np.ndarray
    sample_ids: list
    family_ids: Optional[list]
    matched: int
    flipped: int
    absent: int
    allele_mismatches: int
    unnamed: int
    weighted: int


# ---------------------------------------------------------------------------------------
# Inputs


def _zarr_spec(a) -> Optional[str]:
    """The ``PATH[:ARRAY]`` of a zarr-python Array in a local, fsspec or object store, or
    None when rankwise cannot open its store itself."""
    store = getattr(a, "store", None)
    if store is None:
        return None
    root = getattr(store, "root", None)  # LocalStore
    if root is None and hasattr(store, "fs"):  # FsspecStore (dask's from_zarr opens one)
        fs = getattr(store.fs, "sync_fs", store.fs)
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        path = str(store.path)
        if protocol in ("file", "local"):
            root = path
        elif protocol in ("s3", "s3a"):
            root = "s3://" + path
        elif protocol in ("gs", "gcs"):
            root = "gs://" + path
        elif protocol in ("http", "https"):
            root = path
    if root is None:
        url = getattr(store, "url", None)
        if not isinstance(url, str) or "://" not in url:
            return None
        root = url
    path = getattr(a, "path", "") or ""
    root = str(root)
    return f"{root}:{path}" if path else root


def _is_zarr_array(a) -> bool:
    return type(a).__module__.startswith("zarr") and hasattr(a, "store") and hasattr(a, "shape")


def _is_dask_array(a) -> bool:
    return type(a).__module__.startswith("dask.array") and hasattr(a, "dask")


def _dask_origin(x):
    """What a dask array reads unchanged, or None: the zarr Array of ``da.from_zarr``
    (one zarr Array of the same shape in a ``from-zarr`` graph), or the numpy array of
    ``da.from_array`` (every chunk of the graph a view of one array, at its place)."""
    hlg = x.__dask_graph__()
    layers = getattr(hlg, "layers", {})
    graph = dict(hlg)
    if x.name.startswith("from-zarr") and len(layers) <= 2:
        arrays = {id(v): v for v in graph.values() if _is_zarr_array(v)}
        if len(arrays) == 1:
            z = next(iter(arrays.values()))
            if tuple(z.shape) == tuple(x.shape):
                return z
        return None
    if len(layers) != 1 or x.ndim != 2:
        return None
    starts = [np.concatenate([[0], np.cumsum(c)[:-1]]) for c in x.chunks]
    base = None
    for key, v in graph.items():
        if not (isinstance(key, tuple) and len(key) == 3 and isinstance(v, np.ndarray)):
            return None
        # The chunk's nearest ancestor of the array's shape.
        b = v.base
        while isinstance(b, np.ndarray) and b.shape != tuple(x.shape):
            b = b.base
        if not isinstance(b, np.ndarray):
            return None
        if base is None:
            base = b
        if b is not base or base.shape != tuple(x.shape) or base.dtype != v.dtype:
            return None
        i, j = key[1], key[2]
        at = (base.__array_interface__["data"][0] + int(starts[0][i]) * base.strides[0]
              + int(starts[1][j]) * base.strides[1])
        if (v.__array_interface__["data"][0] != at or v.strides != base.strides
                or v.shape != (x.chunks[0][i], x.chunks[1][j])):
            return None
    n_chunks = len(x.chunks[0]) * len(x.chunks[1])
    return base if base is not None and len(graph) == n_chunks else None


class _Pulled:
    """A dask array with no Zarr origin, computed one panel of rows at a time as the
    actors read it (``fetch``): memory stays within a few panels and dask's chunks, and
    nothing is written anywhere. Panels follow the array's chunks of rows, so each chunk
    is computed once per pass (or once, when the plan keeps panels in memory)."""

    def __init__(self, x):
        if x.dtype != np.float64:
            x = x.astype(np.float64)
        self.x = x
        self.shape = (int(x.shape[0]), int(x.shape[1]))

    def panel_rows(self) -> Optional[int]:
        """Rows per panel that follow the chunks of rows (whole chunks, at least as many
        rows as columns), or None when the chunks are ragged."""
        chunks = self.x.chunks[0]
        if len(chunks) == 0 or any(c != chunks[0] for c in chunks[:-1]) or chunks[0] == 0:
            return None
        c = int(chunks[0])
        return c * -(-self.shape[1] // c)

    def fetch(self, start: int, stop: int) -> np.ndarray:
        return np.ascontiguousarray(self.x[start:stop].compute(), dtype=np.float64)

    def __str__(self) -> str:
        return (f"the dask array {self.x.name} ({self.shape[0]} × {self.shape[1]}, "
                f"chunks of {self.x.chunksize[0]} rows)")


class _Input:
    """What `_rankwise.run` is given: a spec string or an array, and how to read its
    result back (transposed or not)."""

    def __init__(self, source, transposed=False, keep=None, cleanup=None):
        self.source = source
        self.transposed = transposed
        self.keep = keep  # an array the call reads: alive until it returns
        self.cleanup = cleanup

    def panel_rows(self, requested: Optional[int], comm) -> Optional[int]:
        """The panel rows to ask for: the caller's, else, for a dask array computed panel
        by panel, its chunks of rows when every rank's agree and divide the rows of every
        rank but the last (else the library's default)."""
        if requested is not None or not isinstance(self.source, _Pulled):
            return requested
        p = self.source.panel_rows()
        if comm is None:
            return p
        ps = comm.allgather(p)
        rows = comm.allgather(self.source.shape[0])
        if ps[0] is None or any(q != ps[0] for q in ps) or any(r % ps[0] for r in rows[:-1]):
            return None
        return ps[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.cleanup is not None:
            self.cleanup.__exit__(*exc)


def _matrix_input(a, comm) -> _Input:
    if isinstance(a, (str, os.PathLike)):
        return _Input(os.fspath(a))
    if _is_zarr_array(a):
        spec = _zarr_spec(a)
        if spec is not None:
            return _Input(spec)
        a = np.asarray(a[...])
    if _is_dask_array(a):
        origin = _dask_origin(a)
        if isinstance(origin, np.ndarray):
            a = origin  # read in place, below
        elif origin is not None and _zarr_spec(origin) is not None:
            return _Input(_zarr_spec(origin))
        else:
            if a.ndim != 2:
                raise ValueError(f"`a`: {a.ndim} dimensions, not 2")
            # A short-and-fat matrix is factored through its transpose, as in memory.
            transposed = comm is None and a.shape[0] < a.shape[1]
            return _Input(_Pulled(a.T if transposed else a), transposed=transposed)
    if not isinstance(a, np.ndarray):
        raise TypeError(
            f"a must be a numpy array, a Zarr or dask array, or a path, not {type(a).__name__}"
        )
    if a.ndim != 2:
        raise ValueError(f"`a`: {a.ndim} dimensions, not 2")
    if a.dtype not in (np.float64, np.float32):
        # Read as float64, as the library computes; the one copy a conversion needs.
        a = a.astype(np.float64)
    elif not a.flags.aligned:
        # Values read in place must be aligned to their size (a buffer at an odd offset).
        a = a.copy()
    if comm is None and a.shape[0] < a.shape[1]:
        # A short-and-fat matrix is factored through its transpose (a view: no copy).
        return _Input(a.T, transposed=True, keep=a)
    return _Input(a, keep=a)


def _genotype_input(source) -> tuple:
    """(source, sample_ids) for `_rankwise.run`'s PCA."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source), None
    if hasattr(source, "data_vars") and "call_genotype" in getattr(source, "variables", {}):
        ds = source
        # Its calls as they are now (a Dataset keeps its store's encoding through `isel`
        # and the like, so the store is not read in its place). A store too large for
        # memory is better named by its path.
        g = np.asarray(ds["call_genotype"].values)
        if g.ndim != 3 or g.dtype != np.int8:
            raise ValueError("`source`: call_genotype must be variants × samples × ploidy int8")
        mask = None
        if "call_genotype_mask" in ds:
            mask = np.asarray(ds["call_genotype_mask"].values)
            if mask.dtype != np.bool_:
                mask = mask.astype(np.bool_)
        ids = None
        if "sample_id" in ds:
            ids = [str(v) for v in np.asarray(ds["sample_id"].values)]
        # Read in place: each call's dosage is counted as rankwise reads it.
        return (g, mask), ids
    if _is_dask_array(source):
        origin = _dask_origin(source)
        if origin is not None and _is_zarr_array(origin) and _zarr_spec(origin) is not None:
            return _zarr_spec(origin), None
        # Dosages are int8: one byte per call, computed once.
        source = origin if isinstance(origin, np.ndarray) else np.asarray(source.compute())
    if _is_zarr_array(source):
        spec = _zarr_spec(source)
        if spec is not None:
            return spec, None
        source = np.asarray(source[...])
    if isinstance(source, np.ndarray):
        if source.ndim != 2:
            raise ValueError(f"`source`: {source.ndim} dimensions, not 2 (variants × samples)")
        if source.dtype != np.int8:
            if not np.issubdtype(source.dtype, np.integer):
                raise ValueError(
                    f"`source`: dtype {source.dtype}: dosages are integers 0-2, -1 missing"
                )
            source = source.astype(np.int8)
        return source, None
    raise TypeError(
        "source must be a path (PLINK prefix, VCF Zarr store, Zarr array), an xarray "
        f"Dataset with call_genotype, or an int8 array of dosages, not {type(source).__name__}"
    )


# ---------------------------------------------------------------------------------------
# Settings


def _bytes(v, name: str = "memory_per_actor") -> Optional[int]:
    if v is None or isinstance(v, int):
        return v
    s = str(v).strip()
    units = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
             "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
             "kb": 1000, "mb": 10**6, "gb": 10**9, "tb": 10**12}
    num = s.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ")
    unit = s[len(num):].strip().lower()
    if unit not in units:
        raise ValueError(f"`{name}`: {v!r} is not a size (e.g. 4GiB)")
    return int(float(num) * units[unit])


def _world(comm, actors, threads_per_actor, memory_per_actor, pin, device, endpoint_url,
           io_concurrency, io_retries) -> dict:
    w = {
        "actors": actors,
        "threads_per_actor": threads_per_actor,
        "memory_per_actor": _bytes(memory_per_actor),
        "pin": pin,
        "device": device,
        "endpoint_url": endpoint_url,
        "io_concurrency": io_concurrency,
        "io_retries": io_retries,
    }
    if comm is not None:
        if not hasattr(comm, "py2f"):
            raise TypeError(f"comm must be an mpi4py communicator, not {type(comm).__name__}")
        w["comm"] = comm.py2f()
    return w


def _call(command, source, options, world, ids, progress, mask=None) -> dict:
    """`_rankwise.run` with the progress display set up and closed."""
    bars: list = []
    try:
        return _rankwise.run(command, source, options, world, ids, _progress(progress, bars),
                             mask)
    finally:
        for bar in bars:
            bar.close()


def _progress(progress, bar_ref: list) -> Optional[Callable[[dict], None]]:
    """The callback the native call makes every half second on this thread."""
    if progress is None or progress is False:
        if not log.isEnabledFor(logging.INFO):
            return None

        def to_log(p):
            log.info(_progress_text(p))

        return to_log
    if callable(progress):
        return progress
    if progress is True or progress == "tqdm":
        try:
            from tqdm import tqdm
        except ImportError:  # no tqdm: the log
            def to_log(p):
                log.warning(_progress_text(p))
            return to_log
        bar = tqdm(total=None, unit="pass", dynamic_ncols=True)
        # Closed by _call when the call returns.
        bar_ref.append(bar)

        def to_bar(p):
            if p.get("max_passes"):
                bar.total = p["max_passes"]
            bar.n = p["pass"]
            bar.set_postfix_str(_progress_text(p), refresh=True)

        return to_bar
    raise ValueError(f"`progress`: {progress!r} is not a callable, True or 'tqdm'")


def _progress_text(p: dict) -> str:
    text = f"pass {p['pass']}"
    if p.get("max_passes"):
        text += f"/{p['max_passes']}"
    if p.get("jobs"):
        text += f", panels {p['jobs_done']}/{p['jobs']}"
    if p.get("residual") is not None:
        text += f", residual {p['residual']:.1e} (tol {p['tol']:.0e})"
    return text


def _unpack_svd(out: dict, transposed: bool) -> SVDResult:
    # The library factors a short-and-fat matrix through its transpose: U and V swap.
    factor, wt = out["factor"], out["wt"]
    swap = transposed != out["transposed"]
    if swap:
        u, vt = wt.T, factor.T
    else:
        u, vt = factor, wt
    conv = out.get("convergence")
    report = {k: v for k, v in out.items() if k not in ("s", "wt", "factor", "factor_rows")}
    return SVDResult(
        u=np.ascontiguousarray(u),
        s=out["s"],
        vt=np.ascontiguousarray(vt),
        u_rows=np.arange(u.shape[0]) if swap else out["factor_rows"],
        residuals=None if conv is None else np.asarray(conv["residuals"]),
        converged=True if conv is None else bool(conv["converged"]),
        report=report,
    )


_WORLD_DOC = """
        comm: an mpi4py communicator: every rank of it calls, and with a numpy matrix
            each passes its own row block (blocks stack in rank order).
        actors, threads_per_actor: actors on this rank (default: one per NUMA domain)
            and worker threads of each.
        memory_per_actor: the budget of each actor, bytes or a size ("4GiB"); a plan
            that needs more is refused before any work.
        pin: pin actor threads to their cores (default True).
        device: "cpu" (the default), "gpu" (one actor per GPU; an error naming what is
            missing where there is none) or "auto" (GPUs where CUDA, cuBLAS, NVRTC and a
            device are all present, else the CPUs, as the command line's default).
        endpoint_url, io_concurrency, io_retries: object-store settings for URLs.
        progress: a callable given a dict every half second, True (a tqdm bar), or
            None (log lines on the "rankwise" logger at INFO)."""


def svd(a, *, check: bool = False, panel_rows: Optional[int] = None, comm=None,
        actors: Optional[int] = None, threads_per_actor: Optional[int] = None,
        memory_per_actor=None, pin: Optional[bool] = None, device: Optional[str] = None,
        endpoint_url: Optional[str] = None,
        io_concurrency: Optional[int] = None, io_retries: Optional[int] = None,
        progress=None, machine_limit: bool = False) -> SVDResult:
    """The exact SVD of ``a`` by TSQR: every singular value, ``U`` and ``Vᵀ``.

    Args:
        a: a 2-D numpy array (read in place when float64 or float32), a zarr-python
            Array, a dask array, or a path or URL of a Zarr array (``PATH[:ARRAY]``).
        check: also measure ``‖A − UΣVᵀ‖/‖A‖`` and the factors' orthogonality (one more
            pass), in ``report``.
        panel_rows: rows per panel (default: the stored chunks; in memory, panels of at
            most 8 MiB where they can be no shorter than the array is wide).
        machine_limit: after the run, measure the machine's GEMM rate and the rate at
            which it produces the matrix (every rank's compute threads at once) into
            ``report["gemm_peak_flops"]`` and ``report["production_peak_bytes_per_s"]``:
            a phase's ``flops`` and ``produced_bytes`` (``report["phases"]``) at those
            rates are its machine limit (``rankwise svd --machine-limit``). The GEMM rate
            is that of the best BLAS kernels the CPU runs, each measured in a process of
            this interpreter: ``report["gemm_kernels"]`` names them, and
            ``report["gemm_loaded_flops"]`` is the rate of the kernels this process runs
            where those are slower (else None).
    """
    world = _world(comm, actors, threads_per_actor, memory_per_actor, pin, device,
                   endpoint_url, io_concurrency, io_retries)
    with _matrix_input(a, comm) as inp:
        options = {"check": check, "panel_rows": inp.panel_rows(panel_rows, comm),
                   "machine_limit": machine_limit}
        out = _call("svd", inp.source, options, world, None, progress)
        return _unpack_svd(out, inp.transposed)


def rsvd(a, k: int = 10, *, oversample: int = 10, power_iters: Optional[int] = None,
         method: Optional[str] = None, tol: float = 1e-6, max_passes: int = 250,
         precision: str = "auto", seed: int = 0, probes: int = 4,
         require_converged: bool = False, panel_rows: Optional[int] = None, comm=None,
         actors: Optional[int] = None, threads_per_actor: Optional[int] = None,
         memory_per_actor=None, pin: Optional[bool] = None, device: Optional[str] = None,
        endpoint_url: Optional[str] = None,
         io_concurrency: Optional[int] = None, io_retries: Optional[int] = None,
         progress=None, machine_limit: bool = False) -> SVDResult:
    """The rank-``k`` randomized SVD of ``a``, with each component's residual.

    By default LOBPCG iterates until every component's residual
    ``‖Aᵀuᵢ − σᵢvᵢ‖₂ / σ₁`` is at most ``tol`` (as ``rankwise rsvd``); with
    ``power_iters`` a fixed number of subspace iterations runs instead (Dask's
    ``svd_compressed``), and the residuals are still measured. ``converged`` says
    whether every component met ``tol``; ``require_converged=True`` raises
    :class:`RankwiseError` instead of returning unconverged components.

    Args:
        a: as for :func:`svd`.
        k: components.
        oversample: extra sketch columns.
        power_iters: a fixed iteration count instead of iterating to ``tol``.
        method: "lobpcg", "lanczos", "subspace" or "block-krylov" (default: lobpcg, or
            subspace with ``power_iters``).
        tol, max_passes: the tolerance and the most passes over the matrix.
        precision: "auto" (f32 passes while they improve, then f64), "f32" or "f64".
        seed: seed of the random test matrix (``rankwise rsvd --sketch-seed``).
        probes: Gaussian probes of the error estimate (0: none).
        machine_limit: after the run, measure the machine's GEMM rate and the rate at
            which it produces the matrix's tiles in the run's precision (every rank's
            compute threads at once, about 0.1–0.3 s) into ``report["gemm_peak_flops"]``
            and ``report["production_peak_bytes_per_s"]`` (8 bytes a value): a phase's
            ``flops`` and ``produced_bytes`` (``report["phases"]``, this rank's bytes) at
            those rates are its machine limit (``rankwise rsvd --machine-limit``).
    """
    world = _world(comm, actors, threads_per_actor, memory_per_actor, pin, device,
                   endpoint_url, io_concurrency, io_retries)
    options = {
        "k": k, "oversample": oversample, "power_iters": power_iters, "method": method,
        "tol": tol, "max_passes": max_passes, "precision": precision, "seed": seed,
        "probes": probes, "require_converged": require_converged, "panel_rows": panel_rows,
        "machine_limit": machine_limit,
    }
    with _matrix_input(a, comm) as inp:
        options["panel_rows"] = inp.panel_rows(panel_rows, comm)
        out = _call("rsvd", inp.source, options, world, None, progress)
        return _unpack_svd(out, inp.transposed)


def pca(source, k: int = 10, *, maf: Optional[float] = None, geno: Optional[float] = None,
        hwe: Optional[float] = None, hwe_midp: bool = False,
        keep: Optional[Sequence[str]] = None, remove: Optional[Sequence[str]] = None,
        extract: Optional[Sequence[str]] = None, exclude: Optional[Sequence[str]] = None,
        chromosomes: Optional[str] = None, not_chromosomes: Optional[str] = None,
        autosome: bool = False, non_autosomes: bool = False,
        oversample: int = 10, power_iters: Optional[int] = None, method: Optional[str] = None,
        tol: float = 1e-6, max_passes: int = 250, precision: str = "auto", seed: int = 0,
        require_converged: bool = False, panel_rows: Optional[int] = None,
        sample_ids: Optional[Sequence[str]] = None, weights=None, out=None,
        zarr_format: int = 3, comm=None,
        actors: Optional[int] = None, threads_per_actor: Optional[int] = None,
        memory_per_actor=None, pin: Optional[bool] = None, device: Optional[str] = None,
        endpoint_url: Optional[str] = None,
        io_concurrency: Optional[int] = None, io_retries: Optional[int] = None,
        progress=None, machine_limit: bool = False) -> PCAResult:
    """The genotype PCA of ``source``, as ``plink2 --pca`` computes it: each variant
    standardized by its allele frequency, missing calls mean-imputed, eigenvalues of
    the genetic relationship matrix on PLINK 2's scale.

    Args:
        source: a PLINK prefix, a VCF Zarr store (path or URL), a Zarr array of dosages
            (``PATH[:ARRAY]``), an sgkit/xarray Dataset with ``call_genotype``, or an
            int8 numpy array of dosages (variants × samples, -1 missing).
        k: components.
        maf, geno, hwe, hwe_midp: PLINK's QC filters (``--maf``, ``--geno``, ``--hwe``).
        keep, remove: sample IIDs to keep or drop; extract, exclude: variant IDs.
        chromosomes, not_chromosomes: PLINK's ``--chr``/``--not-chr`` lists ("1-22,X").
        autosome: autosomes only; non_autosomes: keep X, Y and MT, which PLINK 2's PCA
            leaves out.
        sample_ids: the samples' IDs, for a numpy array of dosages.
        oversample, power_iters, method, tol, max_passes, precision, seed: the solver,
            as for :func:`rsvd`.
        weights: a path prefix: write ``PREFIX.eigenvec.var`` (variant weights, as
            ``plink2 --pca var-wts``), ``PREFIX.afreq`` and ``PREFIX.eigenval`` there, what
            :func:`project` and ``plink2 --score`` read to project new samples.
        out: publish the results as ``rankwise pca --out`` does, all or nothing on every
            rank: the Zarr group ``out`` in sgkit's layout (``sgkit.load_dataset`` reads
            it), PLINK 2's ``OUT.eigenvec`` and ``OUT.eigenval``, and ``OUT.eigenvec.var``
            and ``OUT.afreq`` for :func:`project` (instead of ``weights``). Existing
            results are never overwritten.
        zarr_format: the group's Zarr format, 3 or 2 (sgkit 0.10 reads only 2).
        machine_limit: after the run, measure the machine's GEMM rate in the solver's
            precision (every rank's compute threads at once) into
            ``report["gemm_peak_flops"]``: a phase's ``flops / seconds``
            (``report["phases"]``) over it is its share of the machine limit, as
            ``rankwise pca --machine-limit`` prints (a genotype pass's products read packed
            codes, so the GEMM rate alone is its limit).
    """
    world = _world(comm, actors, threads_per_actor, memory_per_actor, pin, device,
                   endpoint_url, io_concurrency, io_retries)
    src, ids = _genotype_input(source)
    if sample_ids is not None:
        ids = [str(s) for s in sample_ids]
    options = {
        "k": k, "maf": maf, "geno": geno, "hwe": hwe, "hwe_midp": hwe_midp,
        "keep": None if keep is None else [str(s) for s in keep],
        "remove": None if remove is None else [str(s) for s in remove],
        "extract": None if extract is None else [str(s) for s in extract],
        "exclude": None if exclude is None else [str(s) for s in exclude],
        "chromosomes": chromosomes, "not_chromosomes": not_chromosomes,
        "autosome": autosome, "non_autosomes": non_autosomes,
        "oversample": oversample, "power_iters": power_iters, "method": method, "tol": tol,
        "max_passes": max_passes, "precision": precision, "seed": seed,
        "require_converged": require_converged, "panel_rows": panel_rows,
        "weights": None if weights is None else os.fspath(weights),
        "out": None if out is None else os.fspath(out),
        "zarr_format": zarr_format, "machine_limit": machine_limit,
    }
    mask = None
    if isinstance(src, tuple):
        src, mask = src
    out = _call("pca", src, options, world, ids, progress, mask)
    conv = out["convergence"]
    return PCAResult(
        pcs=out["pcs"],
        eigenvalues=out["eigenvalues"],
        explained_variance_ratio=out["explained_variance_ratio"],
        singular_values=out["singular_values"],
        sample_ids=list(out["sample_ids"]),
        family_ids=out["family_ids"],
        residuals=np.asarray(conv["residuals"]),
        converged=bool(conv["converged"]),
        variants_used=int(out["variants_used"]),
        report={"convergence": conv, "passes": out["passes"], "phases": out["phases"],
                "gemm_peak_flops": out["gemm_peak_flops"],
                "gemm_kernels": out["gemm_kernels"],
                "gemm_loaded_flops": out["gemm_loaded_flops"]},
        loadings=out.get("loadings"),
        loading_rows=out.get("loading_rows"),
    )


def project(source, pca, *, panel_rows: Optional[int] = None,
            sample_ids: Optional[Sequence[str]] = None, comm=None,
            actors: Optional[int] = None, threads_per_actor: Optional[int] = None,
            memory_per_actor=None, pin: Optional[bool] = None, device: Optional[str] = None,
            endpoint_url: Optional[str] = None, io_concurrency: Optional[int] = None,
            io_retries: Optional[int] = None, progress=None) -> ProjectionResult:
    """The PCs of the samples of ``source`` on the axes of an earlier PCA, as
    ``plink2 --score`` projects them with that PCA's variant weights: variants match by
    ID and allele, each standardized by the PCA's allele frequency, a missing call adding
    nothing.

    Args:
        source: genotypes, as for :func:`pca`.
        pca: the prefix the PCA wrote its weights at (``pca(..., weights=PREFIX)``,
            ``rankwise pca --out PREFIX``, or ``plink2 --pca var-wts --freq --out PREFIX``).
        panel_rows: variants per panel.
        sample_ids: the samples' IDs, for a numpy array of dosages.
    """
    world = _world(comm, actors, threads_per_actor, memory_per_actor, pin, device,
                   endpoint_url, io_concurrency, io_retries)
    src, ids = _genotype_input(source)
    if sample_ids is not None:
        ids = [str(s) for s in sample_ids]
    mask = None
    if isinstance(src, tuple):
        src, mask = src
    options = {"weights": os.fspath(pca), "panel_rows": panel_rows}
    out = _call("project", src, options, world, ids, progress, mask)
    return ProjectionResult(
        pcs=out["pcs"],
        sample_ids=list(out["sample_ids"]),
        family_ids=out["family_ids"],
        **{key: int(out[key]) for key in ("matched", "flipped", "absent",
                                          "allele_mismatches", "unnamed", "weighted")},
    )


def calibrate(out=None, *, values: Optional[int] = None, actors: Optional[int] = None,
              threads_per_actor: Optional[int] = None, memory_per_actor=None,
              pin: Optional[bool] = None, device: Optional[str] = None) -> dict:
    """Measures this machine's rates for :func:`plan`, as ``rankwise calibrate`` does: the
    exact SVD at nine widths, the randomized passes of float64 matrices and of genotypes
    in both precisions, LOBPCG's Rayleigh–Ritz step, per core of CPU actors (or per GPU
    with ``device="gpu"``). About a minute on 2 cores at the default ``values``. Run it on
    one node of the cluster to be sized, without MPI.

    Args:
        out: a path to write the rates to as ``rankwise calibrate --out`` does (a new
            file, whole or not at all), or None.
        values: matrix values per measurement (default 2**26; at least 65,536).

    Returns:
        The rates as a dict, which :func:`plan` takes as ``calibration``.
    """
    if out is not None:
        out = os.fspath(out)
        if os.path.lexists(out):
            raise FileExistsError(f"`out`: {out} exists: the rates never replace a file")
    world = _world(None, actors, threads_per_actor, memory_per_actor, pin, device, None,
                   None, None)
    text = _call("calibrate", "", {"values": values}, world, None, None)["rates"]
    if out is not None:
        tmp = f"{out}.tmp-{os.getpid()}"
        try:
            with open(tmp, "x", encoding="utf-8") as f:
                f.write(text)
            if os.path.lexists(out):
                raise FileExistsError(f"`out`: {out} exists: the rates never replace a file")
            os.rename(tmp, out)
        finally:
            if os.path.lexists(tmp):
                os.remove(tmp)
    return json.loads(text)


def plan(rows: int, cols: int, *, calibration, job: str = "pca", nodes: int = 1,
         network: str = "100,2us", ranks_per_node: int = 1, actors_per_rank: int = 1,
         cores_per_node: Optional[int] = None, memory_per_node=None, gpus_per_node: int = 0,
         transport: str = "mpi", read_gbps: Optional[float] = None, k: int = 10,
         oversample: int = 10, passes: int = 10, solver: Optional[str] = None,
         panel_rows: Optional[int] = None) -> dict:
    """The predicted time and memory per rank of a job on a cluster, as
    ``rankwise plan --nodes`` prints them: the code's own planner run over the described
    world (panels, residency, passes, message sizes), each phase's compute and network
    time from the rates of a calibration. Nothing runs.

    Args:
        rows, cols: the matrix (variants × samples for a PCA).
        calibration: the rates :func:`calibrate` returned, or the path of a file it (or
            ``rankwise calibrate --out FILE``) wrote.
        job: ``"svd"``, ``"rsvd"`` or ``"pca"``.
        nodes: nodes of the cluster.
        network: the links between nodes, ``"GBPS,LATENCY[,EAGER]"``: ``"100,2us"``,
            ``"10,5ms,1M"`` (the MPI library's eager limit, default 64K).
        ranks_per_node, actors_per_rank: MPI ranks per node, actors per rank.
        cores_per_node, memory_per_node: each node's (default: this machine's); memory
            in bytes or as ``"256G"``.
        gpus_per_node: GPUs per node, each rank taking the same number.
        transport: ``"mpi"`` or ``"ucx"``.
        read_gbps: storage bandwidth per node in GB/s (default: reads not counted).
        k, oversample, passes, solver: the randomized job: components, extra sketch
            columns, passes over the matrix (a run's report says how many it made),
            ``"lanczos"``, ``"lobpcg"`` or ``"power_iters"`` (default: as the job runs,
            ``"lanczos"`` for ``"pca"``, ``"lobpcg"`` for ``"rsvd"``).
        panel_rows: rows per panel (default: the command line's for a generated matrix).

    Returns:
        A dict: ``seconds``, ``memory_per_rank`` (bytes), ``fits`` (within the node's
        memory), ``dominant`` (the largest cost), ``phases`` (each with
        ``compute_seconds``, ``comm_seconds``, ``read_seconds`` …), ``ranks``,
        ``panels``, ``panel_rows``, ``passes``, ``resident`` and ``notes``.
    """
    for name, v in (("rows", rows), ("cols", cols)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"`{name}`: {v!r}: the matrix needs at least one")
    if isinstance(calibration, dict):
        text = json.dumps(calibration)
    elif isinstance(calibration, (str, os.PathLike)):
        with open(calibration, encoding="utf-8") as f:
            text = f.read()
    else:
        raise TypeError("calibration must be a path or a dict of rates, not "
                        f"{type(calibration).__name__}")
    options = {
        "calibration": text, "job": job, "nodes": nodes, "network": network,
        "ranks_per_node": ranks_per_node, "actors_per_rank": actors_per_rank,
        "cores_per_node": cores_per_node,
        "memory_per_node": _bytes(memory_per_node, "memory_per_node"),
        "gpus_per_node": gpus_per_node, "transport": transport, "read_gbps": read_gbps,
        "k": k, "oversample": oversample, "passes": passes, "solver": solver,
        "panel_rows": panel_rows,
    }
    return json.loads(_rankwise.plan(rows, cols, options))


for _f in (svd, rsvd, pca, project):
    _f.__doc__ = (_f.__doc__ or "").rstrip() + "\n" + _WORLD_DOC
del _f
