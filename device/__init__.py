"""tilesim.device — PyPTO kernels for Ascend 910B and 950 with thin torch wrappers.

Importing this package needs neither torch, torch_npu nor pypto: every kernel module imports
them lazily when a kernel is first built or called, and raises an ``ImportError`` that says what
to install when they are missing.
"""

__all__: list[str] = []
