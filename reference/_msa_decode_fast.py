"""The speed path of the MSA block-sparse decode golden (:mod:`tilesim.reference.msa_decode`,
private; taken when its switch ``_FAST`` is True).

Two pieces, each giving the golden's plain path's values exactly (tested bit-equal on every
named decode case and on poisoned inputs, ``tests/reference/test_msa_speed_paths.py``):

* :func:`chunk_operands`: each chunk's K / V gathered straight from the paged cache and
  widened to float64 in one pass, into two buffers reused by every chunk (the plain path makes
  the kernel's compact BF16 gather, then widens each chunk: a BF16 copy and a fresh float64
  allocation per chunk cost more than the widening itself). Widening is exact.
* :func:`run_rows`: blocks of :data:`BATCH_BLOCK` batch rows on the reference worker pool
  (:func:`tilesim.reference.util.blas_pool.map_in_order`) on ``TILESIM_BLAS_THREADS`` BLAS
  threads. The batch rows share no reduction, so how they are grouped changes no bit.
"""

from __future__ import annotations

import numpy as np
from tilesim.reference.util.arith import F64
from tilesim.reference.util.blas_pool import blas_threads, map_in_order
from tilesim.reference.util.msa_common import zero_unread_rows

#: batch rows per work item (no numeric effect: rows share no reduction). Two rows keep a
#: chunk's float64 K and V (2 x 2 MB) in cache.
BATCH_BLOCK = 2


def widened_keys(src: np.ndarray, c, rows: slice, c0: int, out: np.ndarray) -> np.ndarray:
    """``out [n, HKV, w, D]`` (float64) = keys ``c0 .. c0+w`` of the gathered sequence of the
    batch rows ``rows`` (``c``: the golden's checked call), copied straight from the paged
    ``src [B, HKV, nb, BY, D]`` (exact widening), one block segment at a time. Returns ``out``."""
    by, ids, stop = c.d.by, c.d.ids, c0 + out.shape[2]
    for i, b in enumerate(range(rows.start, rows.stop)):
        pos = c0
        while pos < stop:  # the slots this chunk covers, first and last maybe in part
            slot, t0 = divmod(pos, by)
            t1 = min(by, t0 + stop - pos)
            dst = out[i, :, pos - c0 : pos - c0 + t1 - t0]
            np.copyto(dst, src[b, :, ids[b, slot], t0:t1], casting="unsafe")
            pos += t1 - t0
    return out


def chunk_operands(c, rows: slice):
    """Per chunk ``(c0, w, K_c^T [n, HKV, D, w], V_c [n, HKV, w, D])`` in float64, V rows of
    unread keys zeroed: the values of the golden's plain ``_chunk_operands``. A chunk's views
    are consumed before the next chunk refills the buffers."""
    d, n = c.d, rows.stop - rows.start
    shape = (n, d.hkv, max(w for _, w in c.bounds), d.dim)
    k_buf, v_buf = np.empty(shape, dtype=F64), np.empty(shape, dtype=F64)
    for c0, w in c.bounds:
        k_c = widened_keys(c.k, c, rows, c0, k_buf[:, :, :w])
        v_c = widened_keys(c.v, c, rows, c0, v_buf[:, :, :w])
        zero_unread_rows(v_c, c.read[rows, None, c0 : c0 + w])
        yield c0, w, k_c.swapaxes(-1, -2), v_c


def run_rows(rows_fn, batch: int) -> list:
    """``[rows_fn(slice), ...]`` over blocks of :data:`BATCH_BLOCK` batch rows, in order, on
    the worker pool."""
    blocks = [slice(b0, min(batch, b0 + BATCH_BLOCK)) for b0 in range(0, batch, BATCH_BLOCK)]
    with blas_threads():  # numbers do not depend on it, speed on a busy machine does
        return list(map_in_order(rows_fn, blocks))


__all__ = ["BATCH_BLOCK", "chunk_operands", "run_rows", "widened_keys"]
