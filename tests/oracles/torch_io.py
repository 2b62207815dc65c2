"""Bit-preserving NumPy <-> torch conversion for the oracles, written independently of
``tilesim.shared.interop`` (raw integer views, no tilesim import)."""

from __future__ import annotations

import numpy as np


def _torch():
    import torch

    return torch


def t_of(a: np.ndarray):
    """NumPy/ml_dtypes array -> torch tensor with the same bits (bf16, fp8 via raw views)."""
    torch = _torch()
    a = np.ascontiguousarray(a)
    name = a.dtype.name
    if name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if name == "float8_e4m3fn":
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(a)


def np_of(t) -> np.ndarray:
    """torch tensor -> NumPy (bf16 via ml_dtypes); NumPy arrays pass through."""
    import ml_dtypes

    if isinstance(t, np.ndarray):
        return t
    torch = _torch()
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
