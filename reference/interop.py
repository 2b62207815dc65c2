"""Zero-copy exchange of BF16 / FP8 E4M3FN data between NumPy (ml_dtypes) and torch.

torch cannot wrap an ml_dtypes array directly (``torch.from_numpy`` rejects bfloat16 and
float8), so both directions go through a same-width integer view of the same memory:
``np.bfloat16 <-> torch.bfloat16`` via 16-bit views and ``float8_e4m3fn <-> torch.float8_e4m3fn``
via 8-bit views. No bytes are copied; the result shares memory with the input (CPU tensors
only; non-contiguous inputs are made contiguous first, which does copy).
"""

from __future__ import annotations

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
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(FP8_E4M3)
    return t.numpy()


def is_torch_tensor(x) -> bool:
    """True for a torch.Tensor, without importing torch when it is not loaded."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)
