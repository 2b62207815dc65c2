"""MiniMax expert weights: checkpoint (F.linear) layout <-> the grouped-GEMM kernel layout.

Checkpoint: ``gate_up_proj [E, 2I, H]`` (rows ``0..I-1`` gate = w1, ``I..2I-1`` up = w3) and
``down_proj [E, H, I]``. Kernel: ``w13_flat [E*H, 2I]`` with
``w13_flat[e*H + h, j] = gate_up_proj[e, j, h]`` and ``w2_flat [E*I, H]`` with
``w2_flat[e*I + i, h] = down_proj[e, h, i]``. Both directions are pure data movement (the dtype is
preserved, the result is a fresh contiguous array, the inputs are never modified).
"""

from __future__ import annotations

import numpy as np


def _shape_error(name: str, expected: str, actual) -> ValueError:
    return ValueError(f"{name}: expected shape {expected}, got {tuple(actual)}")


def convert_minimax_weights(gate_up_proj, down_proj) -> tuple[np.ndarray, np.ndarray]:
    """``(gate_up_proj [E,2I,H], down_proj [E,H,I]) -> (w13_flat [E*H,2I], w2_flat [E*I,H])``."""
    gu = np.asarray(gate_up_proj)
    dn = np.asarray(down_proj)
    if gu.ndim != 3:
        raise _shape_error("gate_up_proj", "[E, 2I, H]", gu.shape)
    e, two_i, h = gu.shape
    if two_i % 2 or two_i == 0:
        raise ValueError(f"gate_up_proj: dimension 1 must be even and > 0 (2I), got {two_i}")
    i = two_i // 2
    if dn.shape != (e, h, i):
        raise _shape_error("down_proj", f"[E, H, I] = {(e, h, i)}", dn.shape)
    if gu.dtype != dn.dtype:
        raise TypeError(
            f"down_proj: expected the dtype of gate_up_proj ({gu.dtype}), got {dn.dtype}"
        )
    # np.array(copy=True): a fresh array even when the transpose is already contiguous (H == 1)
    w13 = np.array(gu.transpose(0, 2, 1), order="C", copy=True).reshape(e * h, two_i)
    w2 = np.array(dn.transpose(0, 2, 1), order="C", copy=True).reshape(e * i, h)
    return w13, w2


def unconvert_minimax_weights(w13_flat, w2_flat, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`convert_minimax_weights`: back to ``([E,2I,H], [E,H,I])``."""
    w13 = np.asarray(w13_flat)
    w2 = np.asarray(w2_flat)
    if not isinstance(num_experts, (int, np.integer)) or isinstance(num_experts, bool):
        raise TypeError(f"num_experts: expected a positive int, got {num_experts!r}")
    num_experts = int(num_experts)
    if num_experts <= 0:
        raise ValueError(f"num_experts: expected a positive int, got {num_experts!r}")
    if w13.ndim != 2 or w13.shape[0] % num_experts or w13.shape[1] % 2:
        raise _shape_error("w13_flat", f"[E*H, 2I] with E = {num_experts}", w13.shape)
    e = num_experts
    h = w13.shape[0] // e
    two_i = w13.shape[1]
    i = two_i // 2
    if w2.shape != (e * i, h):
        raise _shape_error("w2_flat", f"[E*I, H] = {(e * i, h)}", w2.shape)
    if w2.dtype != w13.dtype:
        raise TypeError(f"w2_flat: expected the dtype of w13_flat ({w13.dtype}), got {w2.dtype}")
    gu = np.array(w13.reshape(e, h, two_i).transpose(0, 2, 1), order="C", copy=True)
    dn = np.array(w2.reshape(e, i, h).transpose(0, 2, 1), order="C", copy=True)
    return gu, dn
