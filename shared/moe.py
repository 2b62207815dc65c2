"""The contract of the MoE grouped GEMM (``moe_grouped_gemm``), written once for the golden
(:mod:`tilesim.reference.moe`) and the kernel wrapper (:mod:`tilesim.device.moe`).

* :class:`Args` — the checked arguments; :func:`check_meta` checks shapes, dtypes and static
  sizes only (never a value: FakeTensor / ``meta`` / ``validate=False`` calls use it as is);
  :func:`check_values` reads ``expert_cumsum`` on the host and checks it (``c[0] == 0``,
  non-decreasing, ``c[E] <= N_total``); :func:`resolve_tiling` gives the tiling the call runs
  with (policy: :mod:`tilesim.shared.validate`).
* :func:`host_plan` — the kernel's chunk schedule (:func:`moe_tile_schedule`): per expert, the
  token range split as ``pypto.loop_unroll`` splits it
  (:func:`tilesim.shared.tiling.loop_unroll_chunks`).
* :func:`cost` — the one FLOP / HBM-byte counter of a call.
* :func:`emit_moe_schedule` — the trace records of a schedule (:mod:`tilesim.shared.trace`):
  lane ``{"expert": e}``, ``step`` = chunk index within the expert, ``key_range`` = rows
  ``[row0, row0 + chunk)`` of ``sorted_tokens``, ``keys_used`` = ``chunk``, ``flop`` = the
  chunk's mm1 + mm2 FLOPs, extra ``token_offset`` and ``chunk``.

The kernel and its schedule: hicann/pypto-gym,
src/pypto_gym/ops/pypto_tensor/minimax/minimax_grouped_gemm_impl.py (docs/ops/moe.md).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16
from tilesim.shared.interop import is_torch_tensor, to_numpy
from tilesim.shared.models import ACTIVATIONS, GATE_UP_LAYOUTS, MoeDims
from tilesim.shared.registry.op_record import ROUNDS_LIKE_GOLDEN, Call, OpRecord, Output
from tilesim.shared.tiling import MoeTiling, loop_unroll_chunks
from tilesim.shared.trace import Trace, emit, trace_record
from tilesim.shared.validate import (
    check_array,
    check_bool,
    check_choice,
    check_float,
    check_instance,
    check_trace,
    host_ints,
    shape_of,
)

OP_NAME = "moe_grouped_gemm"


# ----------------------------------------------------------------------------- schedule
class MoeTileRecord(NamedTuple):
    """One chunk of the kernel's schedule: the ``step``-th chunk of ``expert``, ``chunk`` rows
    from its ``token_offset``, i.e. rows ``row0 : row0 + chunk`` of ``sorted_tokens``."""

    expert: int
    step: int
    token_offset: int
    chunk: int
    row0: int

    def as_trace(self, dims: MoeDims) -> dict:
        """The trace record of this chunk (:func:`tilesim.shared.trace.trace_record`)."""
        return trace_record(OP_NAME, **self._record_fields(dims))

    def _record_fields(self, dims: MoeDims) -> dict:
        return {
            "lane": {"expert": self.expert},
            "step": self.step,
            "key_range": (self.row0, self.row0 + self.chunk),
            "keys_used": self.chunk,
            "flop": _rows_flop(self.chunk, dims),
            "token_offset": self.token_offset,
            "chunk": self.chunk,
        }


def _rows_flop(rows: int, dims: MoeDims) -> int:
    """Matmul FLOPs of ``rows`` token rows: mm1 ``2*H*2I`` plus mm2 ``2*I*H`` per row."""
    h, i = dims.hidden_size, dims.intermediate_size
    return int(rows) * (2 * h * 2 * i + 2 * i * h)


def _check_cumsum_values(cs: np.ndarray, name: str = "expert_cumsum") -> None:
    """``ValueError`` unless host int array ``cs`` starts at 0 and never decreases."""
    if cs.size == 0 or cs[0] != 0:
        got = int(cs[0]) if cs.size else "an empty array"
        raise ValueError(f"{name}: expected {name}[0] == 0, got {got}")
    steps = np.diff(cs)
    if np.any(steps < 0):
        e = int(np.argmax(steps < 0))
        raise ValueError(
            f"{name}: expected non-decreasing values, got {int(cs[e])} then "
            f"{int(cs[e + 1])} at index {e}"
        )


def moe_tile_schedule(expert_cumsum, unroll) -> list[MoeTileRecord]:
    """The chunk schedule the kernel runs for ``expert_cumsum`` (a 1-D integer array, NumPy
    or torch, starting at 0 and non-decreasing) and an unroll list, in loop order."""
    cs = host_ints(expert_cumsum, "expert_cumsum", ndim=1)
    _check_cumsum_values(cs)
    records = []
    for e in range(cs.size - 1):
        start = int(cs[e])
        chunks = loop_unroll_chunks(int(cs[e + 1]) - start, unroll)
        for step, (tok, tb) in enumerate(chunks):
            records.append(MoeTileRecord(e, step, tok, tb, start + tok))
    return records


def emit_moe_schedule(trace: Trace, schedule, dims: MoeDims) -> None:
    """Send the records of ``schedule`` (:class:`MoeTileRecord`s) to ``trace``, in order."""
    if trace is None:
        return
    for rec in schedule:
        emit(trace, OP_NAME, **rec._record_fields(dims))


# ----------------------------------------------------------------------------- contract
class Args(NamedTuple):
    """The checked arguments of one call (arrays as given: NumPy or torch, any device).

    ``tiling`` is as given (``None`` or a :class:`MoeTiling`) until the caller puts the
    :func:`resolve_tiling` of it in its place; ``cs`` is the host ``expert_cumsum`` (int64
    ``[E+1]``) once :func:`check_values` read it, ``None`` before."""

    sorted_tokens: object
    w13: object
    w2: object
    expert_cumsum: object
    dims: MoeDims
    tiling: MoeTiling | None
    out: object
    round_activation: bool
    trace: Trace
    n_total: int
    cs: np.ndarray | None = None


def check_moe_dims(dims) -> MoeDims:
    """A :class:`MoeDims` whose fields are valid (rechecked: ``MoeDims``' own checks can be
    bypassed with ``object.__setattr__``)."""
    check_instance(dims, "dims", MoeDims)
    check_choice(dims.activation, "dims.activation", ACTIVATIONS)
    check_choice(dims.gate_up_layout, "dims.gate_up_layout", GATE_UP_LAYOUTS)
    for name in ("alpha", "limit", "beta"):
        check_float(getattr(dims, name), f"dims.{name}", fp32=True)
    if not dims.limit > 0:
        raise ValueError(f"dims.limit: expected a number > 0, got {dims.limit!r}")
    return dims


def _check_weights(weights, dims: MoeDims):
    if not isinstance(weights, (tuple, list)) or len(weights) != 2:
        size = f" of length {len(weights)}" if isinstance(weights, (tuple, list)) else ""
        raise TypeError(
            f"weights: expected a (w13_flat, w2_flat) pair, got {type(weights).__name__}{size}"
        )
    e, h, i = dims.num_experts, dims.hidden_size, dims.intermediate_size
    w13, w2 = weights
    check_array(w13, "w13_flat", dtype=BF16, ndim=2, shape=(e * h, 2 * i), layout="[E*H, 2I]")
    check_array(w2, "w2_flat", dtype=BF16, ndim=2, shape=(e * i, h), layout="[E*I, H]")
    return w13, w2


def check_cumsum_meta(expert_cumsum, dims: MoeDims) -> None:
    """The metadata rule of ``expert_cumsum`` (:func:`check_meta`'s, shared with
    :func:`tilesim.reference.moe_flop_count`): INT32 ``[E+1]``, ``E = dims.num_experts``."""
    e = dims.num_experts
    check_array(expert_cumsum, "expert_cumsum", dtype=np.int32, ndim=1)
    if shape_of(expert_cumsum, "expert_cumsum") != (e + 1,):
        raise ValueError(
            f"expert_cumsum: expected length E+1 = {e + 1}, got shape {tuple(expert_cumsum.shape)}"
        )


def _storage(x):
    """A host view of ``x`` to test overlap with (``None`` when there is none to test)."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch_tensor(x) and x.device.type == "cpu" and x.is_contiguous():
        return to_numpy(x)
    return None


def _check_out(out, n_total: int, h: int, inputs: dict) -> None:
    if out is None:
        return
    check_array(out, "out", dtype=BF16, ndim=2, shape=(n_total, h), layout="[N_total, H]")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError("out: expected a writeable array, got a read-only one")
    o = _storage(out)
    for name, a in inputs.items():
        b = _storage(a)
        if o is not None and b is not None and np.may_share_memory(o, b):
            raise ValueError(f"out: expected memory of its own, got memory shared with {name}")


def moe_inputs(
    sorted_tokens,
    weights,
    expert_cumsum,
    dims: MoeDims,
    *,
    tiling: MoeTiling | None = None,
    out=None,
    round_activation: bool = True,
    trace: Trace = None,
):
    """The arguments of ``moe_grouped_gemm`` that the golden and the kernel wrapper share,
    written once (the golden and the wrapper write them out, tests/test_op_records.py holds them
    equal): BF16 ``sorted_tokens [N_total, H]``, the kernel-layout ``weights (w13_flat,
    w2_flat)``, INT32 ``expert_cumsum [E+1]``, :class:`MoeDims` ``dims``, then ``tiling``
    (``None``: :func:`resolve_tiling`), an optional in-place ``out``, ``round_activation`` and
    ``trace``; checked by :func:`check_meta` in this order."""


def check_meta(
    sorted_tokens, weights, expert_cumsum, dims, tiling, out, round_activation, trace
) -> Args:
    """The grouped GEMM's metadata checks (reference and device), in argument order, before
    any work: dtypes, shapes, types. Reads no value (``expert_cumsum``'s data is left to
    :func:`check_values`); arrays may be NumPy or torch on any device, FakeTensor or meta."""
    check_moe_dims(dims)
    h = dims.hidden_size
    check_array(sorted_tokens, "sorted_tokens", dtype=BF16, ndim=2, shape=(None, h),
                layout="[N_total, H]")  # fmt: skip
    n_total = shape_of(sorted_tokens, "sorted_tokens")[0]
    w13, w2 = _check_weights(weights, dims)
    check_cumsum_meta(expert_cumsum, dims)
    check_instance(tiling, "tiling", MoeTiling, optional=True)
    inputs = {"sorted_tokens": sorted_tokens, "w13_flat": w13, "w2_flat": w2}
    _check_out(out, n_total, h, inputs)
    check_bool(round_activation, "round_activation")
    check_trace(trace)
    return Args(sorted_tokens, w13, w2, expert_cumsum, dims, tiling, out,
                bool(round_activation), trace, n_total)  # fmt: skip


def check_int_values(args: Args) -> Args:
    """``args`` with ``cs``: ``expert_cumsum`` copied to the host (one read) and checked —
    ``c[0] == 0``, non-decreasing, ``c[E] <= N_total``; ``ValueError`` naming it otherwise."""
    cs = host_ints(args.expert_cumsum, "expert_cumsum")
    _check_cumsum_values(cs)
    if cs[-1] > args.n_total:
        raise ValueError(
            f"expert_cumsum: expected the last value <= N_total = {args.n_total}, got {int(cs[-1])}"
        )
    return args._replace(cs=cs)


def check_values(args: Args) -> Args:
    """Every value check of the op (the golden runs them all): :func:`check_int_values`; the op
    scans no bulk data."""
    return check_int_values(args)


def resolve_tiling(tiling, dims: MoeDims, soc: str | None = None) -> MoeTiling:
    """The tiling the call runs with, in the golden and the kernel alike (what
    ``resolve_tiling`` means in every op: a given tiling is checked and used as it is, ``None``
    is the op's default for the call). A :class:`MoeTiling` as given (``TypeError``
    otherwise); ``None``: ``tilesim.shared.soc.moe_tiling(dims.activation, soc)``
    (``soc=None``: ``MoeTiling.from_env(dims.activation)``, the same up to ``vec_tile``, which
    changes no number). Either one then passes :func:`check_moe_tiling` against ``dims``."""
    check_instance(tiling, "tiling", MoeTiling, optional=True)
    if tiling is None and soc is None:
        tiling = MoeTiling.from_env(dims.activation)
    elif tiling is None:
        from tilesim.shared.soc import moe_tiling

        tiling = moe_tiling(dims.activation, soc)
    return check_moe_tiling(tiling, dims)


def host_plan(args: Args) -> list[MoeTileRecord]:
    """The chunk schedule of the call (:func:`moe_tile_schedule` of ``args.cs`` and
    ``args.tiling.unroll``); needs :func:`check_values` first and ``args.tiling`` resolved
    (:func:`resolve_tiling`)."""
    return moe_tile_schedule(_values(args), args.tiling.unroll)


def _values(args: Args) -> np.ndarray:
    if args.cs is None:
        raise ValueError("expert_cumsum: its values were not read; call check_values(args) first")
    return args.cs


def cost(args: Args) -> dict:
    """``{"flop": int, "bytes": int}`` of one call (needs :func:`check_values` first).

    ``flop``: matmul FLOPs, ``2*H*2I`` (mm1) plus ``2*I*H`` (mm2) per routed row
    (``R = c[E]`` rows; the sum of the trace records' ``flop``; empty experts cost nothing).
    ``bytes``: the HBM traffic of the kernel, inputs read once and the output written once:
    the ``R`` routed BF16 token rows (``2*R*H``), the BF16 weights of the experts with a
    token (``2*(H*2I + I*H)`` each), the INT32 cumsum (``4*(E+1)``) and the ``R`` BF16
    output rows (``2*R*H``); intermediates (GU, A) stay on chip.
    """
    cs, dims = _values(args), args.dims
    h, i = dims.hidden_size, dims.intermediate_size
    rows = int(cs[-1])
    live = int(np.count_nonzero(np.diff(cs)))
    nbytes = 2 * rows * h * 2 + 2 * live * (h * 2 * i + i * h) + 4 * cs.size
    return {"flop": _rows_flop(rows, dims), "bytes": int(nbytes)}


def check_moe_tiling(tiling: MoeTiling, dims: MoeDims) -> MoeTiling:
    """For ``swigluoai``: a tiling whose ``swiglu_alpha`` / ``swiglu_limit`` differ from the
    defaults must equal ``dims.alpha`` / ``dims.limit`` (the kernel takes the constants from
    its tiling, the golden from ``dims``; the two must not silently differ)."""
    if dims.activation != "swigluoai":
        return tiling
    default = MoeTiling()
    for t_name, d_name in (("swiglu_alpha", "alpha"), ("swiglu_limit", "limit")):
        t_val, d_val = getattr(tiling, t_name), getattr(dims, d_name)
        if t_val != getattr(default, t_name) and t_val != d_val:
            raise ValueError(
                f"tiling.{t_name}: expected the default {getattr(default, t_name)} or "
                f"dims.{d_name} = {d_val}, got {t_val} (PYPTO_{t_name.upper()}); make them agree"
            )
    return tiling


# ----------------------------------------------------------------------------- record
#: the op's record in the registry of ops (:mod:`tilesim.shared.registry.ops`)
RECORD = OpRecord(
    name="moe",
    calls=(
        Call(OP_NAME, "moe", (Output("out", "float", ("row",)),), signature=(moe_inputs,),
             judge_kind="moe", device=True, l2_units=1.2),
    ),
    cost=cost,
    int_checks=check_int_values,
    names={"MoeTileRecord": "moe", "moe_flop_count": "moe", "moe_tile_schedule": "moe",
           "moe_dispatch": "util.moe_routing", "moe_combine": "util.moe_routing",
           "MoeDispatch": "util.moe_routing", "MOE_CASES": "cases.moe"},
    budgets=ROUNDS_LIKE_GOLDEN,
)  # fmt: skip


__all__ = [
    "RECORD",
    "OP_NAME",
    "Args",
    "MoeTileRecord",
    "check_cumsum_meta",
    "check_meta",
    "check_moe_dims",
    "check_moe_tiling",
    "check_values",
    "check_int_values",
    "cost",
    "emit_moe_schedule",
    "host_plan",
    "moe_inputs",
    "moe_tile_schedule",
    "resolve_tiling",
]
