"""The native module: `run` does the work of rankwise.svd, rsvd, pca, project and
calibrate, `plan` that of rankwise.plan."""

from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

def run(
    command: str,
    source: Union[str, np.ndarray],
    options: dict[str, Any],
    world: dict[str, Any],
    sample_ids: Optional[Sequence[str]] = None,
    progress: Optional[Callable[[dict[str, Any]], None]] = None,
) -> dict[str, Any]: ...
def plan(rows: int, cols: int, options: dict[str, Any]) -> str: ...
def version() -> str: ...
def serve_gemm_probe() -> Optional[int]: ...
def blas_kernels() -> tuple[str, Optional[str]]: ...
