"""tilesim.reference — bit-accurate NumPy + ml_dtypes goldens of the fused operators.

Every op emulates its kernel's tile loop nest and rounding points (see ``docs/numerics.md`` and
``docs/ops/``). Needs only numpy and ml_dtypes; torch is optional (interop, test oracles).

The op modules are imported on first use of one of their names, so ``import
tilesim.reference`` stays cheap.
"""

from __future__ import annotations

from tilesim.reference.compare import CompareReport, compare
from tilesim.reference.numerics import (
    bf16_round_trip,
    to_bf16,
    to_fp8_e4m3,
    ulp_distance,
    widen_to_fp32,
)
from tilesim.shared.lazy import lazy_names
from tilesim.shared.ops import reference_names

# public name -> module (relative to this package) that defines it: each op's calls, its other
# names and its family's case builder (the registry of ops, tilesim.shared.ops), then the judge
_LAZY = {
    **reference_names(),
    # the one verdict of every output kind (docs/numerics.md, "Judging an output")
    "judge": "judge",
    "Verdict": "judge",
}


__getattr__, __dir__ = lazy_names("tilesim.reference", _LAZY, globals())

__all__ = [
    "CompareReport",
    "bf16_round_trip",
    "compare",
    "to_bf16",
    "to_fp8_e4m3",
    "ulp_distance",
    "widen_to_fp32",
    *_LAZY,
]
