"""Lazy imports of the device stack (torch, pypto, torch_npu) with errors that say what to install.

``import tilesim.device`` must work on a machine with none of them; a kernel needs them only
when it is built or called. Every kernel module goes through these helpers instead of a
top-level ``import torch`` / ``import pypto``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

INSTALL_SIM = "pip install 'tilesim[device]'  (pypto==0.2.0 and the CPU build torch==2.13.0)"
INSTALL_NPU = "pip install 'tilesim[device,npu]' on a host with CANN (torch_npu matching torch)"

_HINTS = {
    "torch": "torch is needed by tilesim.device: " + INSTALL_SIM,
    "pypto": "PyPTO is needed to build tilesim.device kernels: " + INSTALL_SIM,
    "torch_npu": "torch_npu is needed to run a kernel on an Ascend NPU: " + INSTALL_NPU,
}


def require(name: str) -> ModuleType:
    """Import ``name`` ('torch', 'pypto', 'torch_npu'); ImportError naming the install if absent."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        hint = _HINTS.get(name, f"{name} is needed by tilesim.device")
        raise ImportError(f"{hint} (import of {name!r} failed: {e})") from e


def require_torch() -> ModuleType:
    return require("torch")


def require_pypto() -> ModuleType:
    """Import pypto. With ``ASCEND_HOME_PATH`` unset pypto runs in SIM mode (CPU)."""
    return require("pypto")


def have_module(name: str) -> bool:
    """True when ``name`` is importable (checked without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def npu_available() -> bool:
    """True only on a host with torch_npu, CANN (``ASCEND_HOME_PATH``) and at least one NPU."""
    if not os.environ.get("ASCEND_HOME_PATH") or not have_module("torch_npu"):
        return False
    try:
        torch = require_torch()
        importlib.import_module("torch_npu")
        return bool(torch.npu.is_available() and torch.npu.device_count() > 0)
    except Exception:  # noqa: BLE001 -- a broken driver stack means "no NPU here"
        return False


__all__ = [
    "INSTALL_NPU",
    "INSTALL_SIM",
    "have_module",
    "npu_available",
    "require",
    "require_pypto",
    "require_torch",
]
