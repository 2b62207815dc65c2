"""Paged-cache row readers of the DeepSeek-V3.2 golden (:mod:`tilesim.reference.dsa`).

:class:`PackedCache` / :class:`SplitCache` fetch rows of a packed (``pypto`` / ``flashmla``) or
kv_split cache and dequantize them: ``kn = bf16(fp32(q) * scale_g)`` (BF16 ``[n, 512]``), ``kr``
BF16 ``[n, 64]`` as stored; no other rounding happens here
(:func:`tilesim.shared.quant.dequantize_latent`). Which rows a query token reads is planned on
the host by :mod:`tilesim.shared.dsa` (shared with the kernel wrapper).
"""

from __future__ import annotations

import numpy as np
from tilesim.shared.layouts.mla_cache import LAYOUTS, MlaCacheRows, unpack_rows
from tilesim.shared.quant import dequantize_latent


class PackedCache:
    """A packed ``[rows, 656]`` cache (FP8 E4M3 or INT8) in the ``pypto`` or ``flashmla`` order."""

    def __init__(self, cache: np.ndarray, layout: str):
        if layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
        self.cache = cache
        self.layout = layout
        self.rows = cache.shape[0]
        self.dtype = cache.dtype

    def fields(self, phys: np.ndarray) -> MlaCacheRows:
        """The fields of physical rows ``phys`` (fresh arrays)."""
        return unpack_rows(self.cache[phys], self.layout)

    def keys(self, phys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(kn bf16 [n, 512], kr bf16 [n, 64])`` of physical rows ``phys``."""
        f = self.fields(phys)
        return dequantize_latent(f.nope, f.scales), f.rope


class SplitCache:
    """The kv_split triple ``kn_quant [rows, 512]``, ``kr [rows, 64]``, ``kn_scales [rows, 4]``."""

    def __init__(self, kn_quant: np.ndarray, kr: np.ndarray, kn_scales: np.ndarray):
        self.kn_quant = kn_quant
        self.kr = kr
        self.kn_scales = kn_scales
        self.rows = kn_quant.shape[0]
        self.dtype = kn_quant.dtype

    def fields(self, phys: np.ndarray) -> MlaCacheRows:
        return MlaCacheRows(self.kn_quant[phys], self.kr[phys], self.kn_scales[phys])

    def keys(self, phys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        f = self.fields(phys)
        return dequantize_latent(f.nope, f.scales), f.rope


__all__ = ["PackedCache", "SplitCache"]
