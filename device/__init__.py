"""tilesim.device — PyPTO kernels for Ascend 910B and 950 with thin torch wrappers.

Importing this package needs neither torch, torch_npu nor pypto: the kernel modules are
imported on first use of one of their public names (``_LAZY`` below), and they import the
device stack through :mod:`tilesim.device._lazy`, whose ``ImportError`` says what to install.
:mod:`tilesim.device.sim` runs any kernel on a CPU (PyPTO's interpreter + cost model).

Also public here (from :mod:`tilesim.device.backend`): ``compile_stats()`` -> {kernel name:
distinct compiled variants}, ``reset_compile_stats()``, and ``allow_in_graph()`` (registers
every wrapper with ``torch._dynamo.allow_in_graph`` for torch.compile).
"""

from __future__ import annotations

from tilesim.shared.lazy import lazy_names
from tilesim.shared.ops import device_names

# public name -> module of this package that defines it: each op's device calls (the registry
# of ops, tilesim.shared.ops: a call whose record says ``device=True``), then the backend's
_LAZY = {
    **device_names(),
    "compile_stats": "backend",
    "reset_compile_stats": "backend",
    "allow_in_graph": "backend",
}


__getattr__, __dir__ = lazy_names("tilesim.device", _LAZY, globals())

__all__ = [*_LAZY]
