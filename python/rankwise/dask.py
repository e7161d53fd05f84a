"""Drop-ins for dask.array's linear algebra, computed by rankwise.

``rankwise.dask.svd_compressed(x, k, ...)`` takes what
``dask.array.linalg.svd_compressed`` takes and returns what it returns: ``u`` (m × k),
``s`` (k) and ``v`` (k × n, the rows of Vᵀ) as dask arrays. The SVD itself runs in
rankwise: a dask array read from Zarr is read from its store by rankwise's actors, any
other is computed one panel of rows at a time as the actors read it (see
:func:`rankwise.rsvd`).
Unlike dask's, the result says how far each component is from converged:
:func:`svd_compressed_result` returns the :class:`rankwise.SVDResult` with its
residuals.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

import rankwise


def svd_compressed_result(x, k: int, n_power_iter: int = 0, n_oversamples: int = 10,
                          seed: Optional[int] = None, **kwargs) -> "rankwise.SVDResult":
    """:func:`svd_compressed`'s SVD as a :class:`rankwise.SVDResult` (numpy arrays,
    residuals and convergence); ``kwargs`` go to :func:`rankwise.rsvd`."""
    if seed is None:
        seed = int(np.random.default_rng().integers(1 << 62))
    elif not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or None, not {type(seed).__name__}")
    return rankwise.rsvd(x, k, oversample=n_oversamples, power_iters=n_power_iter,
                         method="subspace", seed=int(seed), **kwargs)


def svd_compressed(x, k: int, iterator: str = "power", n_power_iter: int = 0,
                   n_oversamples: int = 10, seed: Optional[int] = None,
                   compute: bool = False, coerce_signs: bool = True, **kwargs):
    """Randomly compressed rank-``k`` SVD of ``x``, as
    ``dask.array.linalg.svd_compressed``: returns ``u, s, v`` as dask arrays, ``v``
    holding the right singular vectors as rows.

    ``iterator`` must be "power" (rankwise's subspace iteration re-orthonormalizes at
    every half-step, as dask's "QR" iterator does); ``compute`` is accepted for the
    signature's sake (rankwise always computes once, here). With ``coerce_signs`` each
    pair of singular vectors is signed so that the largest entry of ``u``'s column is
    positive.
    """
    import dask.array as da

    if iterator not in ("power", "QR"):
        raise ValueError(f"`iterator`: {iterator!r} is neither 'power' nor 'QR'")
    del compute
    r = svd_compressed_result(x, k, n_power_iter, n_oversamples, seed, **kwargs)
    u, s, vt = r.u, r.s, r.vt
    if coerce_signs:
        idx = np.argmax(np.abs(u), axis=0)
        signs = np.sign(u[idx, np.arange(u.shape[1])])
        signs[signs == 0] = 1.0
        u = u * signs
        vt = vt * signs[:, None]
    row_chunks = x.chunks[0] if hasattr(x, "chunks") and isinstance(x.chunks, tuple) else "auto"
    return (
        da.from_array(u, chunks=(row_chunks, u.shape[1])),
        da.from_array(s, chunks=s.shape),
        da.from_array(vt, chunks=vt.shape),
    )
