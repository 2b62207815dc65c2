"""Zero-copy exchange of BF16 / FP8 E4M3FN data between NumPy (ml_dtypes) and torch.

torch cannot wrap an ml_dtypes array directly (``torch.from_numpy`` rejects bfloat16 and
float8), so both directions go through a same-width integer view of the same memory:
``np.bfloat16 <-> torch.bfloat16`` via 16-bit views and ``float8_e4m3fn <-> torch.float8_e4m3fn``
via 8-bit views. No bytes are copied; the result shares memory with the input (CPU tensors
only; non-contiguous inputs are made contiguous first, which does copy).
"""

from __future__ import annotations

import sys

import numpy as np
from tilesim.shared.casts import BF16, FP8_E4M3


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ImportError(
            "tilesim interop needs torch; install it with `pip install tilesim[torch]` "
            "(the CPU build torch==2.13.0 is enough)"
        ) from e
    return torch


def to_torch(a):
    """NumPy/ml_dtypes array -> CPU torch tensor sharing its memory where possible."""
    torch = _torch()
    a = np.asarray(a)
    if a.dtype == BF16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    if a.dtype == FP8_E4M3:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(np.ascontiguousarray(a))


def to_numpy(t) -> np.ndarray:
    """CPU torch tensor -> NumPy/ml_dtypes array sharing its memory (BF16, FP8 included)."""
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        return np.asarray(t)
    if t.device.type != "cpu":
        raise ValueError(f"to_numpy: expected a CPU tensor, got device {t.device}")
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(FP8_E4M3)
    return t.numpy()


def is_torch_tensor(x) -> bool:
    """True for a torch.Tensor, without importing torch when it is not loaded."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def torch_dtype_to_numpy(dtype) -> np.dtype | None:
    """The NumPy / ml_dtypes dtype of a torch dtype (``None`` when NumPy has no twin)."""
    torch = _torch()
    table = {
        torch.bfloat16: BF16,
        torch.float8_e4m3fn: FP8_E4M3,
        torch.float16: np.dtype(np.float16),
        torch.float32: np.dtype(np.float32),
        torch.float64: np.dtype(np.float64),
        torch.int8: np.dtype(np.int8),
        torch.uint8: np.dtype(np.uint8),
        torch.int16: np.dtype(np.int16),
        torch.int32: np.dtype(np.int32),
        torch.int64: np.dtype(np.int64),
        torch.bool: np.dtype(np.bool_),
        torch.complex64: np.dtype(np.complex64),
        torch.complex128: np.dtype(np.complex128),
    }
    return table.get(dtype)


def numpy_dtype_to_torch(dtype):
    """The torch dtype of a NumPy / ml_dtypes dtype (``None`` when torch has no twin)."""
    torch = _torch()
    dtype = np.dtype(dtype)
    for t in (
        torch.bfloat16, torch.float8_e4m3fn, torch.float16, torch.float32, torch.float64,
        torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
    ):  # fmt: skip
        if torch_dtype_to_numpy(t) == dtype:
            return t
    return None


__all__ = [
    "is_torch_tensor",
    "numpy_dtype_to_torch",
    "to_numpy",
    "to_torch",
    "torch_dtype_to_numpy",
]
