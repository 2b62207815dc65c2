"""tilesim — numerical ground truth and PyPTO kernels for MiniMax and DeepSeek inference on Ascend.

Layers: :mod:`tilesim.reference` (NumPy goldens), :mod:`tilesim.device` (PyPTO kernels, imported
lazily), :mod:`tilesim.shared` (constants, tilings, layouts).
"""

import os as _os
from importlib.metadata import PackageNotFoundError, version

# In a source checkout the layers live in sibling folders (reference/, device/, shared/) that the
# installed distribution maps into this package. When this folder is imported straight from the
# checkout (e.g. `python -m tilesim` run in the repository root, where the current directory comes
# first on sys.path), let the package find them there as well. In an installed copy the parent
# folder is site-packages, which holds no `reference/` package, so nothing changes.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "reference", "__init__.py")) and _os.path.isfile(
    _os.path.join(_checkout, "shared", "__init__.py")
):
    __path__.append(_checkout)  # noqa: F821 - __path__ is defined for packages

try:
    __version__ = version("tilesim")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
