"""MiniMax M2.7 / M3 grouped GEMM on Ascend — torch-facing wrapper of the PyPTO kernel.

Same name and arguments as :func:`tilesim.reference.moe_grouped_gemm`; the kernel
(``device/_moe_kernel.py``) runs the reference's loop nest and rounding points:

* ``pypto.loop`` over the E experts; ``expert_cumsum`` is read by the host control flow
  (``ready_on_host_tensors``), so an empty expert costs no device work;
* ``pypto.loop_unroll`` over the expert's tokens with ``tiling.unroll`` — the chunk split of
  :func:`tilesim.shared.loop_unroll_chunks` (the ``trace`` hook sees the same chunks);
* mm1 ``[tb,H] @ [H,2I]`` -> FP32 (cube K tile ``mm1_k``, split-K on), activation in FP32 on
  ``[min(tb, vec_tile), vec_tile]`` vector tiles, one BF16 rounding, mm2 ``[tb,I] @ [I,H]`` ->
  FP32 (K tile ``mm2_k``), one BF16 rounding into ``out``.

Backends: ``"npu"`` (torch_npu + CANN; tensors on the NPU), ``"sim"`` (CPU tensors; PyPTO 0.2.0's
host interpreter + cost model through :mod:`tilesim.device.sim`; returns ``(out, cost_us)``),
``"auto"`` (the default: ``"npu"`` when the tensors live on an NPU, else an error that names
both options). Importing this module needs neither torch nor pypto.
"""

from __future__ import annotations

from collections.abc import Callable

from tilesim.device._lazy import require_pypto, require_torch
from tilesim.shared.models import MoeDims
from tilesim.shared.soc import DEFAULT_SOC, moe_tiling
from tilesim.shared.tiling import MoeTiling, loop_unroll_chunks

OP_NAME = "moe_grouped_gemm"
#: zero rows appended on the NPU path: dynamic-offset tiles may touch up to one max chunk past
#: the last logical row (the seeds' host glue pads the same way)
NPU_PAD_ROWS = 64
BACKENDS = ("auto", "npu", "sim")


def _check(sorted_tokens, weights, expert_cumsum, dims, tiling, out, round_activation):
    torch = require_torch()
    if not isinstance(dims, MoeDims):
        raise TypeError(f"dims: expected tilesim.shared.MoeDims, got {type(dims).__name__}")
    if dims.gate_up_layout != "halves":
        raise ValueError(
            f"dims.gate_up_layout: the kernel supports 'halves', got {dims.gate_up_layout!r}"
        )
    if round_activation is not True:
        raise ValueError(
            "round_activation: the kernel always rounds the activation to BF16 before mm2; "
            f"expected True, got {round_activation!r}"
        )
    if not isinstance(weights, (tuple, list)) or len(weights) != 2:
        raise TypeError("weights: expected a (w13_flat, w2_flat) pair of torch tensors")
    w13, w2 = weights
    e, h, i = dims.num_experts, dims.hidden_size, dims.intermediate_size
    specs = (
        ("sorted_tokens", sorted_tokens, torch.bfloat16, None),
        ("w13_flat", w13, torch.bfloat16, (e * h, 2 * i)),
        ("w2_flat", w2, torch.bfloat16, (e * i, h)),
        ("expert_cumsum", expert_cumsum, torch.int32, (e + 1,)),
    )
    for name, t, dtype, shape in specs:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
        if shape is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    if sorted_tokens.dim() != 2 or sorted_tokens.shape[1] != h:
        raise ValueError(
            f"sorted_tokens: expected [N_total, H = {h}], got {tuple(sorted_tokens.shape)}"
        )
    n_total = sorted_tokens.shape[0]
    cs = [int(v) for v in expert_cumsum.detach().cpu().tolist()]
    if cs[0] != 0 or any(b < a for a, b in zip(cs[:-1], cs[1:], strict=True)) or cs[-1] > n_total:
        raise ValueError(
            "expert_cumsum: expected non-decreasing values from 0 to at most "
            f"N_total = {n_total}, got {cs}"
        )
    if tiling is not None and not isinstance(tiling, MoeTiling):
        raise TypeError(f"tiling: expected tilesim.shared.MoeTiling or None, got {type(tiling)}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16:
            raise TypeError(f"out: expected a BF16 torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != (n_total, h):
            raise ValueError(f"out: expected shape {(n_total, h)}, got {tuple(out.shape)}")
    return cs


def _kernel_config(dims: MoeDims, tiling: MoeTiling) -> tuple:
    if dims.activation == "swigluoai":
        default = MoeTiling()
        for t_name, d_name in (("swiglu_alpha", "alpha"), ("swiglu_limit", "limit")):
            t_val, d_val = getattr(tiling, t_name), getattr(dims, d_name)
            if t_val != getattr(default, t_name) and t_val != d_val:
                raise ValueError(
                    f"tiling.{t_name} = {t_val} overrides the default but dims.{d_name} = "
                    f"{d_val}; the kernel takes dims.{d_name} -- make them agree"
                )
    return (
        dims.activation,
        tuple(tiling.unroll),
        tiling.mm1_k,
        tiling.mm1_n,
        tiling.mm2_k,
        tiling.mm2_n,
        tiling.vec_tile,
        tiling.cube_nbuffer,
        tiling.vec_nbuffer,
        tiling.l1_reuse,
        float(dims.alpha),
        float(dims.limit),
        float(dims.beta),
    )


def _emit_trace(trace, cs, unroll) -> None:
    for e in range(len(cs) - 1):
        for tok, tb in loop_unroll_chunks(cs[e + 1] - cs[e], unroll):
            trace(
                {"op": OP_NAME, "expert": e, "token_offset": tok, "chunk": tb, "row0": cs[e] + tok}
            )


def moe_grouped_gemm(
    sorted_tokens,
    weights,
    expert_cumsum,
    dims: MoeDims,
    *,
    tiling: MoeTiling | None = None,
    out=None,
    round_activation: bool = True,
    trace: Callable[[dict], None] | None = None,
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
):
    """Grouped GEMM of the MiniMax routed experts on Ascend (or PyPTO's CPU simulator).

    Args:
        sorted_tokens: ``[N_total, H]`` BF16 torch tensor, rows grouped by ascending expert.
        weights: ``(w13_flat [E*H, 2I], w2_flat [E*I, H])`` BF16 (kernel layout).
        expert_cumsum: ``[E+1]`` INT32, ``0 = c[0] <= ... <= c[E] <= N_total``.
        dims: :class:`tilesim.shared.MoeDims`; ``gate_up_layout`` must be ``"halves"``.
        tiling: :class:`tilesim.shared.MoeTiling`; ``None`` = the SoC's defaults with the
            ``PYPTO_*`` overrides (:func:`tilesim.shared.soc.moe_tiling`).
        out: optional ``[N_total, H]`` BF16 tensor written in place (rows of empty experts and
            rows past ``c[E]`` keep their values); default a fresh zero tensor.
        round_activation: must be ``True`` (the kernel always rounds the activation to BF16).
        trace: called once per chunk, as by the reference, before the kernel runs.
        backend: ``"auto"`` / ``"npu"`` / ``"sim"`` (see the module docstring).
        soc: ``"910b"`` or ``"950"``: the simulator's compile target and tile defaults
            (``"sim"`` only; the NPU path takes both from the host's pypto/CANN).

    Returns:
        ``out`` (NPU), or ``(out, cost_us)`` for ``backend="sim"`` where ``cost_us`` is the
        cost model's AICore time in microseconds.

    Numerics: as the reference (FP32 matmul accumulation, FP32 activation, BF16 activation,
    BF16 output). The budget against ``tilesim.reference.moe_grouped_gemm`` is stated and
    enforced in ``docs/device.md`` / ``tests/device/test_sim_moe.py``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    cs = _check(sorted_tokens, weights, expert_cumsum, dims, tiling, out, round_activation)
    torch = require_torch()
    if backend == "auto":
        if sorted_tokens.device.type == "npu":
            backend = "npu"
        else:
            raise ValueError(
                f"backend: tensors are on {sorted_tokens.device}; pass NPU tensors (torch_npu) "
                "or backend='sim' to run PyPTO's CPU simulator"
            )
    if backend == "npu":  # tile defaults of the SoC the host's pypto targets
        soc = "950" if require_pypto().platform.npuarch == "DAV_3510" else "910b"
    tiling = moe_tiling(dims.activation, soc) if tiling is None else tiling
    kernel_cfg = _kernel_config(dims, tiling)
    if trace is not None:
        if not callable(trace):
            raise TypeError(f"trace: expected a callable or None, got {type(trace)}")
        _emit_trace(trace, cs, tiling.unroll)
    w13, w2 = weights
    if out is None:
        out = torch.zeros_like(sorted_tokens)
    if cs[-1] == 0:  # no tokens at all: nothing to launch
        return (out, 0.0) if backend == "sim" else out

    tensors = [sorted_tokens, w13, w2, expert_cumsum]
    if backend == "sim":
        from tilesim.device import sim

        if any(t.device.type != "cpu" for t in tensors + [out]):
            raise ValueError("backend='sim': expected CPU tensors")
        sim.configure(soc)  # before pypto is imported: it fixes the compile target

    from tilesim.device._moe_kernel import build_kernel

    kernel = build_kernel(*kernel_cfg)
    if backend == "sim":
        # private copies: the simulator writes every argument back after the run
        args = [t.contiguous().clone() for t in tensors]
        res = out.contiguous().clone()
        run = sim.run_kernel(kernel, [*args, res])
        out.copy_(res)
        return out, run.us

    # NPU: pad rows so that edge tiles stay inside the buffers, then copy the rows back
    from tilesim.device._lazy import require

    require("torch_npu")
    n = sorted_tokens.shape[0]
    pad = sorted_tokens.new_zeros((NPU_PAD_ROWS, sorted_tokens.shape[1]))
    x_pad = torch.cat([sorted_tokens.contiguous(), pad])
    res = torch.cat([out.contiguous(), pad])
    kernel(x_pad, w13.contiguous(), w2.contiguous(), expert_cumsum.contiguous(), res)
    out.copy_(res[:n])
    return out


__all__ = ["NPU_PAD_ROWS", "moe_grouped_gemm"]
