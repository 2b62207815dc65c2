"""MiniMax expert weights: checkpoint (F.linear) layout <-> the grouped-GEMM kernel layout.

Checkpoint: ``gate_up_proj [E, 2I, H]`` (rows ``0..I-1`` gate = w1, ``I..2I-1`` up = w3) and
``down_proj [E, H, I]``. Kernel: ``w13_flat [E*H, 2I]`` with
``w13_flat[e*H + h, j] = gate_up_proj[e, j, h]`` and ``w2_flat [E*I, H]`` with
``w2_flat[e*I + i, h] = down_proj[e, h, i]``. Both directions are pure data movement (the dtype is
preserved, the result is a fresh contiguous array, the inputs are never modified).

Arguments follow :mod:`tilesim.shared.validate`: NumPy arrays or torch tensors (BF16/FP8 and
``requires_grad`` tensors included) of a real dtype; the results are NumPy arrays.
"""

from __future__ import annotations

import numpy as np
from tilesim.shared.validate import check_int, check_real, host_data, shape_of

_EXPERT_BOUND = 2**20  #: far above any model (MiniMax M3: 256 experts); bounds num_experts


def _shape_error(name: str, expected: str, actual) -> ValueError:
    return ValueError(f"{name}: expected shape {expected}, got {tuple(actual)}")


def convert_minimax_weights(gate_up_proj, down_proj) -> tuple[np.ndarray, np.ndarray]:
    """``(gate_up_proj [E,2I,H], down_proj [E,H,I]) -> (w13_flat [E*H,2I], w2_flat [E*I,H])``."""
    gu_dt = check_real(gate_up_proj, "gate_up_proj", bool_ok=False)
    dn_dt = check_real(down_proj, "down_proj", bool_ok=False)
    gu_shape = shape_of(gate_up_proj, "gate_up_proj")
    if len(gu_shape) != 3:
        raise _shape_error("gate_up_proj", "[E, 2I, H]", gu_shape)
    e, two_i, h = gu_shape
    if two_i % 2 or two_i == 0:
        raise ValueError(f"gate_up_proj: dimension 1 must be even and > 0 (2I), got {two_i}")
    i = two_i // 2
    dn_shape = shape_of(down_proj, "down_proj")
    if dn_shape != (e, h, i):  # the message names both: either may be the wrong one
        raise _shape_error(
            "down_proj", f"[E, H, I] = {(e, h, i)} (from gate_up_proj {gu_shape})", dn_shape
        )
    if gu_dt != dn_dt:
        raise TypeError(f"down_proj: expected the dtype of gate_up_proj ({gu_dt}), got {dn_dt}")
    gu = host_data(gate_up_proj, "gate_up_proj")
    dn = host_data(down_proj, "down_proj")
    # np.array(copy=True): a fresh array even when the transpose is already contiguous (H == 1)
    w13 = np.array(gu.transpose(0, 2, 1), order="C", copy=True).reshape(e * h, two_i)
    w2 = np.array(dn.transpose(0, 2, 1), order="C", copy=True).reshape(e * i, h)
    return w13, w2


def unconvert_minimax_weights(w13_flat, w2_flat, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`convert_minimax_weights`: back to ``([E,2I,H], [E,H,I])``."""
    w13_dt = check_real(w13_flat, "w13_flat", bool_ok=False)
    w2_dt = check_real(w2_flat, "w2_flat", bool_ok=False)
    e = check_int(num_experts, "num_experts", lo=1, hi=_EXPERT_BOUND)
    w13_shape = shape_of(w13_flat, "w13_flat")
    if len(w13_shape) == 2 and w13_shape[0] % e:
        raise ValueError(
            f"num_experts: expected a divisor of w13_flat's {w13_shape[0]} rows (E*H), got {e}"
        )
    if len(w13_shape) != 2 or w13_shape[0] % e or w13_shape[1] % 2:
        raise _shape_error("w13_flat", f"[E*H, 2I] with E = {e}", w13_shape)
    h = w13_shape[0] // e
    two_i = w13_shape[1]
    i = two_i // 2
    if shape_of(w2_flat, "w2_flat") != (e * i, h):
        raise _shape_error("w2_flat", f"[E*I, H] = {(e * i, h)}", w2_flat.shape)
    if w2_dt != w13_dt:
        raise TypeError(f"w2_flat: expected the dtype of w13_flat ({w13_dt}), got {w2_dt}")
    w13 = host_data(w13_flat, "w13_flat")
    w2 = host_data(w2_flat, "w2_flat")
    gu = np.array(w13.reshape(e, h, two_i).transpose(0, 2, 1), order="C", copy=True)
    dn = np.array(w2.reshape(e, i, h).transpose(0, 2, 1), order="C", copy=True)
    return gu, dn
