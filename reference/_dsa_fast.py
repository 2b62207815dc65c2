"""The speed path of the DeepSeek-V3.2 golden (:mod:`tilesim.reference.dsa`, switch ``_POOL``).

The batch and query-token loops change no numbers: each token reads shared inputs only and
writes only its own output rows. :func:`run_tokens` runs the tokens on the worker pool of
:mod:`tilesim.reference.util.blas_pool` (NumPy drops the GIL in matmuls and ufuncs) and hands their
results to ``emit`` in token order from the calling thread, so the trace records keep the
kernel's order. Same bits, same records as the readable serial loop of ``_run``.
"""

from __future__ import annotations

from collections.abc import Callable

from tilesim.reference.util.blas_pool import map_in_order


def run_tokens(token: Callable[[int], list], n_tokens: int, emit: Callable[[list], None]) -> None:
    """``emit(token(r))`` for ``r = 0 .. n_tokens-1`` in order, ``token`` running on the pool.
    On an error (in a token or in ``emit``) the tokens not started are cancelled and the
    running ones awaited before it propagates."""
    done = map_in_order(token, range(n_tokens))
    try:
        for records in done:
            emit(records)
    finally:
        done.close()


__all__ = ["run_tokens"]
