"""tilesim — numerical ground truth and PyPTO kernels for MiniMax and DeepSeek inference on Ascend.

Layers: :mod:`tilesim.reference` (NumPy goldens), :mod:`tilesim.device` (PyPTO kernels, imported
lazily), :mod:`tilesim.shared` (constants, tilings, layouts).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tilesim")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
