"""Zero-copy NumPy <-> torch exchange; kept under this name for callers of
``tilesim.reference.interop``. The one implementation is :mod:`tilesim.shared.interop`."""

from tilesim.shared.interop import is_torch_tensor, to_numpy, to_torch

__all__ = ["is_torch_tensor", "to_numpy", "to_torch"]
