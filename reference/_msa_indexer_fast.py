"""The speed path of the MSA lightning-indexer golden (:mod:`tilesim.reference.msa_indexer`,
private; taken when its switch ``_FAST`` is True).

:func:`scores` forms the product for the 4 real index-head rows only, on
``TILESIM_BLAS_THREADS`` BLAS threads (:func:`tilesim.reference.util.blas_pool.blas_threads`),
where the golden's plain path forms the kernel's 16-row product (4 heads + 12 zero rows,
computed and then dropped). Each output row is its own dot products (rows do not interact),
so both give the same bits (tested on every named indexer case,
``tests/reference/test_msa_speed_paths.py``).
"""

from __future__ import annotations

import numpy as np
from tilesim.reference.util.arith import F64, matmul_fp32
from tilesim.reference.util.blas_pool import blas_threads
from tilesim.reference.util.msa_common import K_STEP


def scores(q: np.ndarray, kt: np.ndarray) -> np.ndarray:
    """FP32 ``[4, nb*128]``: ``fp32(q @ kt) * 1.0`` for host BF16 ``q [4, 128]`` and the
    float64 transposed keys ``kt [128, nb*128]`` (one K step). The caller sets the errstate."""
    with blas_threads():  # a small GEMM: extra BLAS threads only wait on a busy machine
        s = matmul_fp32(q.astype(F64), kt, k_tile=K_STEP)
    return s * np.float32(1.0)


__all__ = ["scores"]
