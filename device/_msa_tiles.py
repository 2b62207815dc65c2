"""PyPTO building blocks shared by the MSA kernels (lightning indexer, decode, main branch).

Private to the MSA kernel modules: each function emits PyPTO tensor operations inside a
``@pypto.frontend.jit`` body and takes the ``pypto`` module as its first argument, so that
importing this module needs no pypto.
"""

from __future__ import annotations

#: the runtime options the seeds set on every MSA kernel (indexer, decode, main branch:
#: hicann/pypto-gym:src/pypto_gym/ops/pypto_tensor/minimax/*msa*_impl.py), the common head of
#: each kernel's ``SEED_JIT`` spec (:func:`jit_options`)
SEED_RUNTIME = (
    ("runtime", "device_sched_mode", 1),
    ("runtime", "stitch_function_max_num", 64),
)


def l0_tile(w: int, cap: int) -> int:
    """Largest of 256/128/64/32/16 (at most ``cap``) dividing ``w``: PyPTO wants L1 % L0 == 0."""
    return next(t for t in (256, 128, 64, 32, 16) if t <= cap and w % t == 0)


#: ``cube_l1_reuse_setting`` of each body of the batch loop in the ``"device"`` and ``"paged"``
#: variants, ``((rows per body, N), ...)``, set at the start of the body (PyPTO 0.2.0 reads a
#: loop body's pass options when the body's function ends): the L1ReuseMerge pass may put N
#: matmuls that read the same GM data into one task -- here C1's page matmuls, which all read
#: the pair's Q. 4: one C1 task per 512-key chunk (the latency of B 1); 16 in the 4-row body:
#: one C1 task per pair, 16 per body instead of 64, the fewest tasks for the batches that run
#: many 4-row bodies one after another (the B 64 / B 4 figures: docs/ops/msa_decode.md#kernel)
L1_REUSE_BY_ROWS = ((4, 16), (2, 4), (1, 4))


def page_pieces(c0: int, w: int, block: int) -> tuple:
    """``((slot, t0, n), ...)``: the keys ``c0 .. c0+w-1`` of a row's selected ``topk*block``
    keys (slot ``s`` holds keys ``s*block ..``) cut at the page edges, in key order: keys
    ``t0 .. t0+n-1`` of slot ``slot``'s page, whose rows are contiguous in the paged cache.
    The decode's C1 issues one matmul per piece (a whole page for the default NTILE)."""
    pieces, pos = [], c0
    while pos < c0 + w:
        slot, t0 = divmod(pos, block)
        n = min(block - t0, c0 + w - pos)
        pieces.append((slot, t0, n))
        pos += n
    return tuple(pieces)


def c1_cube_tiles(g: int, n: int) -> tuple:
    """Cube tiles (M, K, N lists) of one C1 piece ``S = Q[g, 128] @ K[n, 128]^T``."""
    return [g, g], [128, 128], [l0_tile(n, 256), n]


def c2_cube_tiles(g: int, w: int) -> tuple:
    """Cube tiles (M, K, N lists) of one chunk's ``O_c = P[g, w] @ V_c[w, 128]``."""
    return [g, g], [l0_tile(w, 128), w], [128, 128]


__all__ = [
    "L1_REUSE_BY_ROWS",
    "SEED_RUNTIME",
    "c1_cube_tiles",
    "c2_cube_tiles",
    "l0_tile",
    "page_pieces",
]
