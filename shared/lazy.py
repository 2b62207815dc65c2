"""Lazy public names of a package: ``{name: submodule}`` resolved on first use (PEP 562).

``tilesim.reference`` and ``tilesim.device`` keep ``import tilesim.<package>`` cheap (no op
module, no torch, no pypto) by listing their public names in a table and importing the
module that defines a name only when it is first read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_names(package: str, table: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package`` whose public ``name`` lives in the submodule
    ``table[name]``; a resolved value is cached in the package's ``namespace``."""

    def __getattr__(name: str):
        mod = table.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{mod}"), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__


__all__ = ["lazy_names"]
