"""reference.arith.block_scaled_matmul_fp32: DeepSeek's fp8_gemm K-block accumulation."""

from __future__ import annotations

import numpy as np
from tilesim.reference.arith import block_scaled_matmul_fp32, matmul_fp32
from tilesim.shared.casts import to_fp8_e4m3
from tilesim.shared.quant import e4m3_to_fp32

F32 = np.float32


def _fp8_values(rng, shape) -> np.ndarray:
    return e4m3_to_fp32(to_fp8_e4m3(rng.standard_normal(shape).astype(F32)))


def test_one_block_with_unit_scales_is_one_matmul():
    rng = np.random.default_rng(0)
    a, b = _fp8_values(rng, (3, 128)), _fp8_values(rng, (128, 5))
    got = block_scaled_matmul_fp32(a, np.ones((3, 1), F32), b, np.ones((1, 1), F32), block=128)
    assert got.dtype == F32
    assert np.array_equal(got, matmul_fp32(a, b, k_tile=None))


def test_blocks_add_in_fp32_in_k_order_with_both_scales():
    """Per K block: the block's one-tile partial times FP32(row scale * column tile's scale),
    added to the FP32 accumulator in K order; the N tail narrower than a block reads the
    scale of its own tile."""
    rng = np.random.default_rng(1)
    m, k, n, blk = 4, 384, 130, 128
    a, b = _fp8_values(rng, (m, k)), _fp8_values(rng, (k, n))
    sa = np.ldexp(F32(1), rng.integers(-8, 8, (m, k // blk))).astype(F32)
    sb = np.ldexp(F32(1), rng.integers(-8, 8, (k // blk, 2))).astype(F32)
    got = block_scaled_matmul_fp32(a, sa, b, sb, block=blk)
    want = np.zeros((m, n), F32)
    for kb in range(k // blk):
        ks = slice(kb * blk, (kb + 1) * blk)
        part = matmul_fp32(a[:, ks], b[ks], k_tile=None)
        col_scale = np.concatenate([np.full(blk, sb[kb, 0]), np.full(n - blk, sb[kb, 1])])
        want = (want + part * (sa[:, kb : kb + 1] * col_scale.astype(F32))).astype(F32)
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
