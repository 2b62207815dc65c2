"""The record of one op: what every registry of tilesim reads about it, written once.

Each op's contract module ``tilesim.shared.<op>`` exports one :class:`OpRecord` as ``RECORD``;
:mod:`tilesim.shared.registry.ops` holds them in order. The record names:

* the op's **public calls** (:class:`Call`): the reference callable, the module of
  :mod:`tilesim.reference` that defines it, its input prototypes (the leading parameters its
  golden and wrapper write out, held equal by ``tests/test_op_records.py``), its outputs
  (:class:`Output`: name, kind, axes), how the judge reads them, whether a named case's
  golden is a call of it and whether :mod:`tilesim.device` exports it too;
* the **case family** whose ``tilesim.reference.cases.<family>`` module builds its cases;
* the other public names of :mod:`tilesim.reference` it adds (``{name: module}``);
* its one FLOP / byte counter, ``cost``;
* its **value checks** (the contract's functions that read data, split by what a wrapper's
  ``validate=`` reads: :attr:`OpRecord.int_checks`, :attr:`OpRecord.scan_checks`), which a
  wrapper runs through :meth:`OpRecord.value_checks`;
* its **device budgets** (the sim tests' pass figures), where its kernel has them.

Whether the op has a device wrapper and kernel (``device/<op>.py``, ``device/_<op>_kernel.py``)
follows from its calls: :attr:`OpRecord.kernel` is true when one of them is exported by
:mod:`tilesim.device`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tilesim.shared.validate import check_choice

#: what an output holds: a float tensor, ids, quantized codes (with their scales), a cache
OUTPUT_KINDS = ("float", "ids", "codes", "cache")
#: what a wrapper's ``validate=`` reads (``tilesim.device.backend.validate_level``): nothing,
#: the small integer inputs, every value
VALUE_LEVELS = ("meta", "ints", "full")
#: how the judge reads a call's outputs (``tilesim.reference.judging.plans``): one rule per
#: output kind under the case's tolerance, the ids-first indexer rule, or stage by stage
JUDGED_BY = ("kind", "indexer", "stages")


@dataclass(frozen=True)
class Output:
    """One output of a call: its ``name`` in the golden, its ``kind`` (:data:`OUTPUT_KINDS`),
    the names of its leading ``axes`` (the judge's report coordinates; ``None``: unnamed) and
    whether a device dump may leave it out (``optional``)."""

    name: str
    kind: str
    axes: tuple[str, ...] | None = None
    optional: bool = False

    def __post_init__(self) -> None:
        check_choice(self.kind, f"Output({self.name!r}).kind", OUTPUT_KINDS)


@dataclass(frozen=True)
class Call:
    """One public callable of an op.

    ``name``: the callable (the same in :mod:`tilesim.reference` and, when ``device``, in
    :mod:`tilesim.device`); ``module``: the :mod:`tilesim.reference` module defining it;
    ``signature``: its input prototypes in the contract module (``()``: none written);
    ``outputs``: in the op's order; ``judge_kind``: the judge's ``kind`` that names the
    coordinates of its (first) output (``None``: none); ``judged_by``: :data:`JUDGED_BY`;
    ``golden``: a named case's golden may be a call of it; ``device``: :mod:`tilesim.device`
    exports it;
    ``l2_units``: the judge's calibrated relative-L2 bound of its float output, one multiple of
    the unit roundoff of the rounding the output carries for the whole tensor and for each row
    (set between the worst correct output and the smallest fault, docs/numerics.md
    "Calibration"; ``None``: the judge's rule for the output dtype, 4u per tensor, 8u per row).
    """

    name: str
    module: str
    outputs: tuple[Output, ...]
    signature: tuple[Callable, ...] = ()
    judge_kind: str | None = None
    judged_by: str = "kind"
    golden: bool = True
    device: bool = False
    l2_units: float | None = None

    def __post_init__(self) -> None:
        check_choice(self.judged_by, f"Call({self.name!r}).judged_by", JUDGED_BY)
        u = self.l2_units
        if u is not None and not (
            isinstance(u, int | float) and not isinstance(u, bool) and 0 < u < math.inf
        ):
            raise ValueError(
                f"Call({self.name!r}).l2_units: expected a finite positive multiple of u, got "
                f"{self.l2_units!r}"
            )

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs)

    @property
    def optional_outputs(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs if o.optional)


#: the sim tests' pass figures of a kernel that rounds where its golden rounds (BF16 outputs):
#: at least 99 % of the elements bit-exact, every row within 1 ULP of its largest |golden|
#: (docs/numerics.md, "Judging an output"; each op page's "Budget")
ROUNDS_LIKE_GOLDEN = {"bit_exact": 0.99, "row_ulp": 1.0}


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class OpRecord:
    """One op (module docstring): ``name`` (its five files' name), ``calls``, ``cost``,
    ``family`` (its case family; ``None``: its own name), ``names`` (its other public names of
    :mod:`tilesim.reference`, ``{name: module}``), ``budgets`` (``{figure: value}`` of its
    kernel's sim tests) and its value checks: ``int_checks``, the contract's check of the small
    integer inputs the kernel reads on the host anyway (a wrapper runs it by default), and
    ``scan_checks``, its bulk scan of caches, weights, activations or masks (``validate="full"``
    only); each ``Args -> Args`` on the contract's ``check_meta`` result, ``None``: none."""

    name: str
    calls: tuple[Call, ...]
    cost: Callable
    family: str | None = None
    names: Mapping[str, str] = field(default_factory=dict)
    budgets: Mapping[str, object] = field(default_factory=dict)
    int_checks: Callable | None = None
    scan_checks: Callable | None = None

    def __post_init__(self) -> None:
        if self.family is None:
            object.__setattr__(self, "family", self.name)
        object.__setattr__(self, "names", _frozen(self.names))
        object.__setattr__(self, "budgets", _frozen(self.budgets))
        if not self.calls:
            raise ValueError(f"OpRecord({self.name!r}): expected at least one call")

    @property
    def call_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.calls)

    @property
    def kernel(self) -> bool:
        """The op has a device wrapper and a kernel: one of its calls is a device call."""
        return any(c.device for c in self.calls)

    def value_checks(self, args, level: str):
        """The op's value checks that ``level`` (:data:`VALUE_LEVELS`) asks for, on its
        contract's checked ``args``: none for ``"meta"``, :attr:`int_checks` for ``"ints"``,
        then :attr:`scan_checks` too for ``"full"``; returns ``args`` after them."""
        check_choice(level, "level", VALUE_LEVELS)
        if level != "meta" and self.int_checks is not None:
            args = self.int_checks(args)
        if level == "full" and self.scan_checks is not None:
            args = self.scan_checks(args)
        return args

    def call(self, name: str) -> Call:
        """The call called ``name``."""
        for c in self.calls:
            if c.name == name:
                return c
        raise ValueError(f"call: expected one of {self.call_names}, got {name!r}")


__all__ = ["OUTPUT_KINDS", "JUDGED_BY", "ROUNDS_LIKE_GOLDEN", "VALUE_LEVELS", "Call", "OpRecord",
           "Output"]  # fmt: skip
