"""The speed path of :func:`tilesim.reference.moe_grouped_gemm` (private; chosen by
``tilesim.reference.moe._FAST``).

The golden's loop nest (:mod:`tilesim.reference.moe`) runs one product per ``loop_unroll``
chunk. Every output row depends only on its own input row and the K tiling, so here one
product covers all rows of an expert, its BF16 weights widened one K tile at a time
(:func:`~tilesim.reference.util.arith.matmul_fp32`, bounded memory:
``8 * k_tile * max(H, 2I)`` bytes per product), and the experts run as independent items on the
reference worker pool (one BLAS thread each). Same bits and the same trace records, in
schedule order (tests/reference/test_moe_speed_path.py).
"""

from __future__ import annotations

from tilesim.reference.util.arith import matmul_fp32
from tilesim.reference.util.blas_pool import blas_threads, map_in_order
from tilesim.shared.moe import emit_moe_schedule


def _expert(call, chunks: list, ffn) -> None:
    """One expert: its rows ``chunks[0].row0 : end of chunks[-1]`` in one ``ffn`` call
    (the golden's ``_expert_ffn``) on its BF16 weight slices, widened per K tile."""
    e, h, i = chunks[0].expert, call.dims.hidden_size, call.dims.intermediate_size
    rows = slice(chunks[0].row0, chunks[-1].row0 + chunks[-1].chunk)
    w13_e, w2_e = call.w13[e * h : (e + 1) * h], call.w2[e * i : (e + 1) * i]
    ffn(call, rows, w13_e, w2_e, matmul_fp32)


def run(call, experts: list[list], trace, ffn) -> None:
    """Write every expert's rows of ``call.result`` (``experts``: the schedule grouped by
    expert, :class:`~tilesim.shared.moe.MoeTileRecord` lists); the trace records are emitted
    in schedule order, as the chunk loop emits them."""
    with blas_threads():
        done = map_in_order(lambda chunks: _expert(call, chunks, ffn), experts)
        for chunks, _ in zip(experts, done, strict=True):
            emit_moe_schedule(trace, chunks, call.dims)
