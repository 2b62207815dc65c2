"""Split-KV (flash-decoding) planning, written once for every op that splits its key loop.

A work item (a DeepSeek query token, an MSA (batch row, KV head) pair) reads its keys in
``units`` consecutive key tiles (DeepSeek: ``s_kv_tile``-wide KV tiles; MSA decode: NTILE-wide
chunks). With ``kv_splits = k`` the units are cut into ranges of ``ceil(units / k)``
consecutive units (:func:`split_ranges`; the last range may be shorter, empty ranges are not
formed). Each range folds its units into its own FP32 softmax state ``(O, l, m)``; the states
are then folded in range order ``0, 1, ..`` (:data:`MERGE_ORDER`) with the same online-merge
formulas as the units inside a range (``tilesim.reference.util.arith.SoftmaxMerge``). The layout
depends on ``units`` and ``k`` only, never on the data, so the golden and the kernel cut alike.

:func:`default_kv_splits` is the one rule that picks ``k`` for a call: the smallest split count
with the shortest dependent merge chain among those that give every range a cube core. The
chain model is the op's (its kernel's dependency structure): :func:`loop_merge_chain` for a
kernel that merges unit after unit and then folds the ranges one by one; an op whose kernel
folds differently passes its own. Each split op states its policy once as a :class:`SplitRule`
(chain model, most splits, fewest units worth a split) and calls the rule through it, on the
SoC's cube cores: :meth:`SplitRule.kv_splits` (the count) and :meth:`SplitRule.split_tiling`
(a tiling with that count).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tilesim.shared.soc import get_soc
from tilesim.shared.validate import check_pos_int

#: the ranges' states are folded in this order: range 0 first, then 1, 2, ...
MERGE_ORDER = "ascending"


def split_ranges(units: int, kv_splits: int) -> list[tuple[int, int]]:
    """``[(first, stop), ...]`` unit ranges of the non-empty splits: ``ceil(units /
    kv_splits)`` consecutive units each, the last one maybe shorter. ``units = 4, kv_splits =
    3`` gives ``[(0, 2), (2, 4)]``."""
    units = check_pos_int(units, "units")
    per = -(-units // check_pos_int(kv_splits, "kv_splits"))
    return [(u, min(units, u + per)) for u in range(0, units, per)]


def units_per_split(units: int, kv_splits: int) -> int:
    """Units per range: ``ceil(units / kv_splits)``."""
    return -(-check_pos_int(units, "units") // check_pos_int(kv_splits, "kv_splits"))


def effective_kv_splits(units: int, kv_splits: int) -> int:
    """How many non-empty ranges :func:`split_ranges` gives (``<= kv_splits``)."""
    return -(-check_pos_int(units, "units") // units_per_split(units, kv_splits))


def loop_merge_chain(units: int, kv_splits: int) -> int:
    """Dependent merges on one item's longest chain when a kernel merges unit by unit inside a
    range and then folds the other ranges one by one into range 0: ``(per - 1) + (ranges -
    1)``."""
    per = units_per_split(units, kv_splits)
    return (per - 1) + (effective_kv_splits(units, kv_splits) - 1)


def default_kv_splits(
    *,
    items: int,
    units: int,
    cores: int,
    chain: Callable[[int, int], int] = loop_merge_chain,
    max_splits: int | None = None,
    min_units: int = 2,
) -> int:
    """The split count of a call: a pure function of its shape and the SoC's cube cores.

    ``items`` independent work items of ``units`` key tiles each. When the items fill the cube
    cores (``items >= cores``) or an item has fewer than ``min_units`` units, 1. Otherwise the
    smallest ``k <= min(units, cores // items, max_splits)`` with the shortest ``chain(units,
    k)``, returned as the number of non-empty ranges it gives."""
    items = check_pos_int(items, "items")
    units = check_pos_int(units, "units")
    cores = check_pos_int(cores, "cores")
    if items >= cores or units < max(min_units, 2):
        return 1
    want = min(units, cores // items)
    if max_splits is not None:
        want = min(want, check_pos_int(max_splits, "max_splits"))
    best = min(range(1, want + 1), key=lambda k: (chain(units, k), k))
    return effective_kv_splits(units, best)


@dataclass(frozen=True)
class SplitRule:
    """One op's split-KV policy, the one wrapper of :func:`default_kv_splits`: the op's merge
    chain model ``chain(units, k)``, the most splits it allows (``max_splits``, ``None``: no
    cap) and the fewest units per work item worth a split (``min_units``)."""

    chain: Callable[[int, int], int] = loop_merge_chain
    max_splits: int | None = None
    min_units: int = 2

    def kv_splits(self, *, items: int, units: int, soc: str) -> int:
        """:func:`default_kv_splits` for ``items`` work items of ``units`` units each on the
        cube cores of ``soc`` (:func:`tilesim.shared.soc.get_soc`)."""
        return default_kv_splits(
            items=items,
            units=units,
            cores=get_soc(soc).aic_cores,
            chain=self.chain,
            max_splits=self.max_splits,
            min_units=self.min_units,
        )

    def split_tiling(self, tiling, *, items: int, units: int, soc: str):
        """``tiling`` (a tiling dataclass with ``kv_splits`` and ``replace``) with
        ``kv_splits`` set by :meth:`kv_splits`."""
        return tiling.replace(kv_splits=self.kv_splits(items=items, units=units, soc=soc))


__all__ = [
    "MERGE_ORDER",
    "SplitRule",
    "default_kv_splits",
    "effective_kv_splits",
    "loop_merge_chain",
    "split_ranges",
    "units_per_split",
]
