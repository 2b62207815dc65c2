"""Lazy public names of a package: ``{name: submodule}`` resolved on first use (PEP 562).

``tilesim.reference`` and ``tilesim.device`` keep ``import tilesim.<package>`` cheap (no op
module, no torch, no pypto) by listing their public names in a table and importing the
module that defines a name only when it is first read.

A public name may also be the name of a submodule (``tilesim.reference.msa_indexer`` is the
op ``msa_indexer`` and the module that defines it). Python's import machinery binds a loaded
submodule as an attribute of its package, which would hide the op behind the module; the
package's module class therefore refuses to bind a submodule over a public name, so
``from tilesim.reference import msa_indexer`` is always the op. Reach such a module with
``importlib.import_module("tilesim.reference.msa_indexer")``.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable


class _PublicNamesFirst(types.ModuleType):
    """A package module whose public (lazy) names are never shadowed by a submodule."""

    def __setattr__(self, name: str, value) -> None:
        table = self.__dict__.get("_LAZY", {})
        if isinstance(value, types.ModuleType) and name in table:
            return  # the op of that name stays what the package exports
        super().__setattr__(name, value)


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

    module = sys.modules.get(namespace.get("__name__", ""))
    if module is not None and type(module) is types.ModuleType:
        module.__class__ = _PublicNamesFirst
    return __getattr__, __dir__


__all__ = ["lazy_names"]
