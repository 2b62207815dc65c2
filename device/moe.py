"""MiniMax M2.7 / M3 grouped GEMM on Ascend — the wrapper of the PyPTO kernel (NumPy or torch).

Same name and arguments as :func:`tilesim.reference.moe_grouped_gemm`; the kernel
(``device/_moe_kernel.py``) runs the reference's loop nest and rounding points:

* ``pypto.loop`` over the E experts; ``expert_cumsum`` is read by the host control flow
  (``ready_on_host_tensors``), so an empty expert costs no device work;
* ``pypto.loop_unroll`` over the expert's tokens with ``tiling.unroll`` — the chunk split of
  :func:`tilesim.shared.loop_unroll_chunks` (the ``trace`` hook sees the same chunks);
* mm1 ``[tb,H] @ [H,2I]`` -> FP32 (cube K tile ``mm1_k``, split-K on), activation in FP32 on
  ``[min(tb, vec_tile), vec_tile]`` vector tiles, one BF16 rounding, mm2 ``[tb,I] @ [I,H]`` ->
  FP32 (K tile ``mm2_k``), one BF16 rounding into ``out``.

The kernel is built once per model configuration and tiling through the compile registry
(:func:`~tilesim.device._moe_kernel.build_kernel`, ``@compile_once``; key:
:func:`kernel_config`, with the option spec :func:`~tilesim.device._moe_kernel.jit_spec`);
``N_total`` and the per-expert counts are runtime values.

Back end (:mod:`tilesim.device.backend`): ``"npu"`` (torch_npu + CANN; tensors on the NPU),
``"sim"`` (CPU tensors or NumPy arrays; PyPTO 0.2.0's host interpreter + cost model; returns
``(out, cost_us)``), ``"auto"`` (the default: ``"npu"`` when the tensors live on an NPU, else
an error that names both options). Arguments are checked by the reference's rules
(:mod:`tilesim.shared.moe`: ``check_meta``, then ``check_int_values`` when the cumsum is read, then
``host_plan`` for the trace); NumPy in gives NumPy out, torch in torch
out, and a given ``out`` is written in place and returned. The trace records are the
reference's (:func:`tilesim.shared.moe.emit_moe_schedule`), sent before the kernel
runs. Importing this module needs neither torch nor pypto.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tilesim.device import backend as _backend
from tilesim.device._lazy import require_torch
from tilesim.device._moe_kernel import SEED_JIT, build_kernel, jit_spec
from tilesim.shared.interop import to_numpy
from tilesim.shared.models import MoeDims
from tilesim.shared.moe import (
    RECORD,
    Args,
    check_meta,
    emit_moe_schedule,
    host_plan,
    resolve_tiling,
)
from tilesim.shared.soc import DEFAULT_SOC, SIM_SOCS
from tilesim.shared.tiling import MoeTiling
from tilesim.shared.trace import Trace
from tilesim.shared.validate import check_choice

#: zero rows appended on the NPU path: dynamic-offset tiles may touch up to one max chunk past
#: the last logical row (the seeds' host glue pads the same way)
NPU_PAD_ROWS = 64


class _MoeLaunch(NamedTuple):
    """The checked call: where it runs and the shared :class:`~tilesim.shared.moe.Args`
    (tiling resolved; ``cs`` is ``None`` when ``expert_cumsum`` was not read:
    ``validate=False`` without a trace, or shape-only inputs)."""

    target: _backend.Target
    args: Args


def _check(args: Args, backend, soc, read) -> _MoeLaunch:
    """The call's ``check_meta`` result ``args``, then ``check_int_values`` when ``read`` (the
    only host read of ``expert_cumsum`` here), the kernel's own limits, the target and the
    tiling rule."""
    args = _backend.value_checks(RECORD, args, read)
    dims, round_activation, sorted_tokens = args.dims, args.round_activation, args.sorted_tokens
    if dims.gate_up_layout != "halves":
        raise ValueError(
            f"dims.gate_up_layout: expected 'halves' (the kernel's layout), "
            f"got {dims.gate_up_layout!r}"
        )
    if round_activation is not True:
        raise ValueError(
            "round_activation: expected True (the kernel always rounds the activation to BF16 "
            f"before mm2), got {round_activation!r}"
        )
    if _backend.is_shape_only(sorted_tokens):
        check_choice(backend, "backend", _backend.BACKENDS)
        check_choice(soc, "soc", SIM_SOCS)
        target = _backend.Target("npu" if backend != "sim" else "sim", soc, False)
    else:
        # configure=False: no pypto import yet
        target = _backend.resolve(backend, soc, sorted_tokens, configure=False)
    tiling = resolve_tiling(args.tiling, args.dims, target.soc)
    return _MoeLaunch(target, args._replace(tiling=tiling))


def kernel_config(dims: MoeDims, tiling: MoeTiling) -> tuple:
    """The compile key of the grouped-GEMM kernel, the arguments of
    :func:`~tilesim.device._moe_kernel.build_kernel`: activation, tiles, constants and the
    option spec (:func:`~tilesim.device._moe_kernel.jit_spec`: the seeds' runtime options and
    the tiling's buffer settings); never a token count."""
    return (
        dims.activation,
        tuple(tiling.unroll),
        tiling.mm1_k,
        tiling.mm1_n,
        tiling.mm2_k,
        tiling.mm2_n,
        tiling.vec_tile,
        float(dims.alpha),
        float(dims.limit),
        float(dims.beta),
        jit_spec(tiling),
    )


def npu_buffers(args: list, out_t) -> tuple[list, object]:
    """The NPU path's kernel buffers: ``[sorted_tokens, w13, w2, cumsum]`` with
    :data:`NPU_PAD_ROWS` zero rows after the tokens, and the output scratch padded alike
    (edge tiles at dynamic offsets stay inside the buffers)."""
    torch = require_torch()
    x = args[0]
    pad = x.new_zeros((NPU_PAD_ROWS, x.shape[1]))
    padded = [torch.cat([x.contiguous(), pad]), *(t.contiguous() for t in args[1:])]
    return padded, torch.cat([out_t.contiguous(), pad])


def _run(kernel, args: list, out_t, target: _backend.Target) -> float | None:
    """Launch; on the NPU through :func:`npu_buffers`, the rows copied back afterwards."""
    if target.sim:
        return _backend.launch(kernel, args, [out_t], target)
    padded, res = npu_buffers(args, out_t)
    us = _backend.launch(kernel, padded, [res], target)
    out_t.copy_(res[: args[0].shape[0]])
    return us


def _deliver(out, out_t, us, target: _backend.Target):
    """:func:`~tilesim.device.backend.finish`, except that a given ``out`` is itself returned
    (a NumPy ``out`` gets the rows when the tensor did not share its memory)."""
    res = _backend.finish(out_t, us, target)
    if out is None:
        return res
    if isinstance(out, np.ndarray):
        got = to_numpy(out_t)
        if not np.shares_memory(got, out):
            out[...] = got
    return (out, res[1]) if target.sim else out


@_backend.graph_safe
def moe_grouped_gemm(
    sorted_tokens,
    weights,
    expert_cumsum,
    dims: MoeDims,
    *,
    tiling: MoeTiling | None = None,
    out=None,
    round_activation: bool = True,
    trace: Trace = None,
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
    validate: bool = True,
):
    """Grouped GEMM of the MiniMax routed experts on Ascend (or PyPTO's CPU simulator).

    Args:
        sorted_tokens: ``[N_total, H]`` BF16 (NumPy or torch), rows grouped by ascending expert.
        weights: ``(w13_flat [E*H, 2I], w2_flat [E*I, H])`` BF16 (kernel layout).
        expert_cumsum: ``[E+1]`` INT32, ``0 = c[0] <= ... <= c[E] <= N_total``.
        dims: :class:`tilesim.shared.MoeDims`; ``gate_up_layout`` must be ``"halves"``.
        tiling: :class:`tilesim.shared.MoeTiling`; ``None`` = the SoC's defaults with the
            ``PYPTO_*`` overrides (:func:`tilesim.shared.soc.moe_tiling`).
        out: optional ``[N_total, H]`` BF16 array or tensor written in place and returned (rows
            of empty experts and rows past ``c[E]`` keep their values); default a fresh zero
            array of the kind of ``sorted_tokens``.
        round_activation: must be ``True`` (the kernel always rounds the activation to BF16).
        trace: called once per chunk with the reference's records, before the kernel runs
            (reads ``expert_cumsum`` on the host even with ``validate=False``).
        backend: ``"auto"`` / ``"npu"`` / ``"sim"`` (see the module docstring).
        soc: ``"910b"`` or ``"950"``: the simulator's compile target and tile defaults
            (``"sim"`` only; the NPU path takes both from the host's pypto/CANN).
        validate: ``True`` (default; ``"full"`` is the same: this op has no float scan)
            copies ``expert_cumsum`` (``4 * (E + 1)`` bytes) to the host to check its values
            (``c[0] == 0``, non-decreasing, ``c[E] <= N_total``) and skips the launch when it
            holds no token; ``False`` checks metadata only (no host copy; the kernel's
            ``ready_on_host`` read of the cumsum is then the call's only one).

    Returns:
        ``out`` (NPU), or ``(out, cost_us)`` for ``backend="sim"`` where ``cost_us`` is the
        cost model's AICore time in microseconds. FakeTensor / ``meta`` inputs (torch.compile
        tracing): ``out`` (or a fresh empty ``[N_total, H]`` BF16 tensor), no data read.

    Numerics: as the reference (FP32 matmul accumulation, FP32 activation, BF16 activation,
    BF16 output). The budget against ``tilesim.reference.moe_grouped_gemm`` is stated and
    enforced in ``docs/ops/moe.md#kernel`` / ``tests/device/test_moe_sim.py``.
    """
    level = _backend.validate_level(validate)
    pair = weights if isinstance(weights, (tuple, list)) and len(weights) == 2 else (None, None)
    names = ("sorted_tokens", "weights[0]", "weights[1]", "expert_cumsum", "out")
    arrays = (sorted_tokens, *pair, expert_cumsum, out)
    shape_only = _backend.is_shape_only(*arrays, names=names)
    read = not shape_only and (level != "meta" or trace is not None)
    args = check_meta(sorted_tokens, weights, expert_cumsum, dims, tiling, out,
                      round_activation, trace)  # fmt: skip
    target, args = _check(args, backend, soc, read)
    if shape_only:
        return out if out is not None else sorted_tokens.new_empty(tuple(sorted_tokens.shape))
    tiling, cs = args.tiling, args.cs
    if trace is not None:
        emit_moe_schedule(trace, host_plan(args), dims)
    torch = require_torch()
    x, w13, w2, cs_t, out_t = _backend.to_tensors(sorted_tokens, *weights, expert_cumsum, out)
    if out_t is None:
        out_t = torch.zeros(tuple(x.shape), dtype=x.dtype, device=x.device)
    us = None
    if cs is None or cs[-1] > 0:  # no tokens at all: nothing to launch (pypto not imported)
        _backend.resolve(backend, soc, sorted_tokens)  # the simulator: configure it for its SoC now
        kernel = build_kernel(*kernel_config(dims, tiling))
        us = _run(kernel, [x, w13, w2, cs_t], out_t, target)
    return _deliver(out, out_t, us, target)


__all__ = [
    "NPU_PAD_ROWS",
    "SEED_JIT",
    "jit_spec",
    "kernel_config",
    "moe_grouped_gemm",
    "npu_buffers",
]
