import os
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

__version__: str

class RankwiseError(RuntimeError):
    rank: int
    cause: str
    def __init__(self, message: str, rank: int = ..., cause: str = ...) -> None: ...

@dataclass
class SVDResult:
    u: np.ndarray
    s: np.ndarray
    vt: np.ndarray
    u_rows: np.ndarray
    residuals: Optional[np.ndarray]
    converged: bool
    report: dict[str, Any]
    def __iter__(self) -> Any: ...

@dataclass
class PCAResult:
    pcs: np.ndarray
    eigenvalues: np.ndarray
    explained_variance_ratio: np.ndarray
    singular_values: np.ndarray
    sample_ids: list[str]
    family_ids: Optional[list[str]]
    residuals: np.ndarray
    converged: bool
    variants_used: int
    report: dict[str, Any]
    loadings: Optional[np.ndarray]
    loading_rows: Optional[np.ndarray]
    def to_xarray(self) -> Any: ...

class ProjectionResult:
    pcs: np.ndarray
    sample_ids: list[str]
    family_ids: Optional[list[str]]
    matched: int
    flipped: int
    absent: int
    allele_mismatches: int
    unnamed: int
    weighted: int

Progress = Union[None, bool, str, Callable[[dict[str, Any]], None]]

def svd(
    a: Any,
    *,
    check: bool = ...,
    panel_rows: Optional[int] = ...,
    comm: Any = ...,
    actors: Optional[int] = ...,
    threads_per_actor: Optional[int] = ...,
    memory_per_actor: Union[None, int, str] = ...,
    pin: Optional[bool] = ...,
    device: Optional[str] = ...,
    endpoint_url: Optional[str] = ...,
    io_concurrency: Optional[int] = ...,
    io_retries: Optional[int] = ...,
    progress: Progress = ...,
    machine_limit: bool = ...,
) -> SVDResult: ...
def rsvd(
    a: Any,
    k: int = ...,
    *,
    oversample: int = ...,
    power_iters: Optional[int] = ...,
    method: Optional[str] = ...,
    tol: float = ...,
    max_passes: int = ...,
    precision: str = ...,
    seed: int = ...,
    probes: int = ...,
    require_converged: bool = ...,
    panel_rows: Optional[int] = ...,
    comm: Any = ...,
    actors: Optional[int] = ...,
    threads_per_actor: Optional[int] = ...,
    memory_per_actor: Union[None, int, str] = ...,
    pin: Optional[bool] = ...,
    device: Optional[str] = ...,
    endpoint_url: Optional[str] = ...,
    io_concurrency: Optional[int] = ...,
    io_retries: Optional[int] = ...,
    progress: Progress = ...,
    machine_limit: bool = ...,
) -> SVDResult: ...
def pca(
    source: Any,
    k: int = ...,
    *,
    maf: Optional[float] = ...,
    geno: Optional[float] = ...,
    hwe: Optional[float] = ...,
    hwe_midp: bool = ...,
    keep: Optional[Sequence[str]] = ...,
    remove: Optional[Sequence[str]] = ...,
    extract: Optional[Sequence[str]] = ...,
    exclude: Optional[Sequence[str]] = ...,
    chromosomes: Optional[str] = ...,
    not_chromosomes: Optional[str] = ...,
    autosome: bool = ...,
    non_autosomes: bool = ...,
    oversample: int = ...,
    power_iters: Optional[int] = ...,
    method: Optional[str] = ...,
    tol: float = ...,
    max_passes: int = ...,
    precision: str = ...,
    seed: int = ...,
    require_converged: bool = ...,
    panel_rows: Optional[int] = ...,
    sample_ids: Optional[Sequence[str]] = ...,
    weights: Union[None, str, os.PathLike[str]] = ...,
    out: Union[None, str, os.PathLike[str]] = ...,
    zarr_format: int = ...,
    comm: Any = ...,
    actors: Optional[int] = ...,
    threads_per_actor: Optional[int] = ...,
    memory_per_actor: Union[None, int, str] = ...,
    pin: Optional[bool] = ...,
    device: Optional[str] = ...,
    endpoint_url: Optional[str] = ...,
    io_concurrency: Optional[int] = ...,
    io_retries: Optional[int] = ...,
    progress: Progress = ...,
    machine_limit: bool = ...,
) -> PCAResult: ...
def project(
    source: Any,
    pca: Union[str, os.PathLike[str]],
    *,
    panel_rows: Optional[int] = ...,
    sample_ids: Optional[Sequence[str]] = ...,
    comm: Any = ...,
    actors: Optional[int] = ...,
    threads_per_actor: Optional[int] = ...,
    memory_per_actor: Union[None, int, str] = ...,
    pin: Optional[bool] = ...,
    device: Optional[str] = ...,
    endpoint_url: Optional[str] = ...,
    io_concurrency: Optional[int] = ...,
    io_retries: Optional[int] = ...,
    progress: Progress = ...,
) -> ProjectionResult: ...
def plan(
    rows: int,
    cols: int,
    *,
    calibration: Union[str, os.PathLike[str], dict[str, Any]],
    job: str = ...,
    nodes: int = ...,
    network: str = ...,
    ranks_per_node: int = ...,
    actors_per_rank: int = ...,
    cores_per_node: Optional[int] = ...,
    memory_per_node: Union[int, str, None] = ...,
    gpus_per_node: int = ...,
    transport: str = ...,
    read_gbps: Optional[float] = ...,
    k: int = ...,
    oversample: int = ...,
    passes: int = ...,
    solver: Optional[str] = ...,
    panel_rows: Optional[int] = ...,
) -> dict[str, Any]: ...
def calibrate(
    out: Union[str, os.PathLike[str], None] = ...,
    *,
    values: Optional[int] = ...,
    actors: Optional[int] = ...,
    threads_per_actor: Optional[int] = ...,
    memory_per_actor: Union[None, int, str] = ...,
    pin: Optional[bool] = ...,
    device: Optional[str] = ...,
) -> dict[str, Any]: ...
