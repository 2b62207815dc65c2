"""DeepSeek-V3.2 lightning-indexer prolog on Ascend — one PyPTO kernel: the index queries, their
scales, the head weights and the new tokens' keys written into the paged index cache.

Same name and arguments as the golden :func:`tilesim.reference.dsa_indexer_prolog` (contract:
:mod:`tilesim.shared.dsa_indexer_prolog`, the same ``check_meta`` and the same value checks and
messages), plus ``backend`` / ``soc`` / ``validate``; NumPy arrays or torch tensors in, the same
kind out (:mod:`tilesim.device.backend`). Returns the golden's
:class:`~tilesim.shared.dsa_indexer_prolog.PrologResult` fields ``(q, q_scale, weights,
k_cache, k_scale)``: the caches are updated copies in the very layout
:mod:`tilesim.device.dsa_indexer` reads (:mod:`tilesim.shared.layouts.index_cache`), only the rows
``slot_mapping`` names written (``-1``: none). The kernel
(:mod:`tilesim.device._dsa_indexer_prolog_kernel`, whose docstring has the loop nest) is
bit-exact against the golden in the simulator.

What the kernels cover (``rope_pairing="halves"``): ``path="int8"`` (pypto-gym's recipe, the
910B and the 950; :mod:`tilesim.device._dsa_indexer_prolog_kernel`) on ``[T, 64]`` tables;
``path="fp8"`` (DeepSeek-V3.2's indexer; :mod:`tilesim.device._dsa_indexer_prolog_fp8_kernel`)
on a SoC with FP8 (:func:`tilesim.shared.soc.require_fp8`: a ``ValueError`` on the 910B), with
``fp8_promotion="two_roundings"`` (the promotion the kernel computes), ``ue8m0=True``, a
``block_size`` multiple of 32 (the pages as whole 128-byte rows) and ``[T, 64]`` or ``[T,
32]`` tables. Anything else is a ``ValueError`` before launch (the golden covers it).

Host copies per call (``validate``): the default (``True``) copies ``slot_mapping`` (``8 T``
bytes) for the slot checks -- the kernel's cache write reads it on the host anyway
(``ready_on_host``); ``"full"`` adds the golden's scans of every float input (finite
activations, RoPE tables, scales, Hadamard matrices, ``w_k``, ``w_proj``); ``False`` copies
nothing but what the launch reads.

Weights are taken as the golden takes them (``[in, out]``); the kernels read them as they are
(no per-call preparation): ``w_qb_scale [8192, 1]`` (INT8) and ``ln_gamma`` / ``ln_beta
[128]`` are passed as ``[1, 8192]`` / ``[1, 128]`` views of the same memory; FP8 block scales
as they are. The FP8 pages are passed as one INT8 view of their bytes (``[num_blocks *
block_size * 132 / 128, 128]``) of the copy the kernel writes.
"""

from __future__ import annotations

import functools
import types

from tilesim.device import backend as _backend
from tilesim.device._lazy import require_torch
from tilesim.shared.dsa_indexer import INDEX_HEADS
from tilesim.shared.dsa_indexer_prolog import (
    QB_COLS,
    RECORD,
    ROPE_DIM,
    Args,
    PrologResult,
    check_meta,
    check_values,
)
from tilesim.shared.layouts.index_cache import FP8_BLOCK_ALIGN, INDEX_DIM, index_page_view
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.soc import DEFAULT_SOC, require_fp8
from tilesim.shared.validate import check_choice

#: the kernel's ones columns of the LayerNorm row sums (``[128, 16]`` FP32)
ONES_COLS = 16


def _check_kernel_limits(a: Args) -> None:
    """What the kernels cannot do on top of the shared checks (``ValueError``)."""
    if a.rope_pairing != "halves":
        raise ValueError(
            f"rope_pairing: the kernel implements 'halves' only, got {a.rope_pairing!r}"
        )
    shp = tuple(a.ins.cos.shape)
    if a.path == "int8" and shp[1] != ROPE_DIM:
        raise ValueError(f"cos: expected the [T, {ROPE_DIM}] halves table for the kernel, got "
                         f"{shp}")  # fmt: skip
    if a.path == "fp8":
        _check_fp8_limits(a)
    kernel_k_tile(a)


def _check_fp8_limits(a: Args) -> None:
    """The FP8 kernel's switches: the promotion it computes, UE8M0 scales, whole-row pages."""
    if a.fp8_promotion != "two_roundings":
        raise ValueError(
            f"fp8_promotion: the FP8 kernel adds each K block's partial as FP32(acc + FP32(P * "
            f"S)), 'two_roundings' (no fused multiply-add on its vector unit); pass "
            f"fp8_promotion='two_roundings' (equal to 'fma' when every P * S is exact, e.g. "
            f"UE8M0 weight scales), got {a.fp8_promotion!r}"
        )
    if not a.ue8m0:
        raise ValueError("ue8m0: the FP8 kernel implements UE8M0 (power-of-two) scales, "
                         "DeepSeek-V3.2's scale_fmt, only, got False")  # fmt: skip
    if a.block_size % FP8_BLOCK_ALIGN:
        raise ValueError(
            f"block_size: expected a multiple of {FP8_BLOCK_ALIGN} for the FP8 kernel (the "
            f"pages as whole {INDEX_DIM}-byte rows), got {a.block_size}"
        )


def kernel_k_tile(a: Args) -> int:
    """The cube K tile of the kernel's linears over ``H``: the call's ``k_tile``, or ``H``
    itself for ``k_tile=None`` (one tile). ``ValueError`` naming ``k_tile`` when it exceeds
    :data:`~tilesim.device._dsa_indexer_prolog_kernel.MAX_K_TILE` or does not divide ``H``:
    the kernel computes what the golden computes with the same ``k_tile``, never another
    summation (DeepSeek's H = 7168: pass ``k_tile=1024``, the cost rows' tile)."""
    from tilesim.device._dsa_indexer_prolog_kernel import MAX_K_TILE

    kt = a.hidden if a.k_tile is None else a.k_tile
    if kt > MAX_K_TILE or a.hidden % kt:
        got = "None (one tile of H)" if a.k_tile is None else a.k_tile
        raise ValueError(
            f"k_tile: expected a K tile <= {MAX_K_TILE} dividing H = {a.hidden} for the kernel "
            f"(its L1 holds K tiles of at most {MAX_K_TILE} rows of w_k; the kernel's figures "
            f"are at 1024, and the golden with the same k_tile computes the same sums), got {got}"
        )
    return kt


def _checked(a: Args, validate) -> Args:
    """The value checks ``validate`` asks for on the contract's ``check_meta`` result
    (:func:`tilesim.device.backend.value_checks` over the record's: by default the slots,
    ``"full"`` every value check of the golden, with its messages)."""
    return _backend.value_checks(RECORD, a, validate)


def _target(a: Args, backend: str, soc: str):
    """The call's target; ``ValueError`` for FP8 on a SoC without it (``SocSpec.fp8``), then
    the kernel's limits."""
    target = _backend.resolve(backend, soc, a.ins.x)
    if a.path == "fp8":
        require_fp8(target.soc, "path", "'fp8'", "use path='int8', or soc='950' in the simulator")
    _check_kernel_limits(a)
    return target


def _kernel_inputs(a: Args, dev) -> list:
    """The kernel's input tensors (zero-copy views of the caller's where possible)."""
    torch = require_torch()
    ins = a.ins
    names = ("x", "q_norm", "q_norm_scale", "w_qb", "w_qb_scale", "w_k", "w_proj", "ln_gamma",
             "ln_beta", "cos", "sin", "hadamard_q", "hadamard_k")  # fmt: skip
    t = dict(zip(names, _backend.to_tensors(*(getattr(ins, n) for n in names)), strict=True))
    t["w_qb_scale"] = t["w_qb_scale"].reshape(1, QB_COLS)
    for n in ("ln_gamma", "ln_beta"):
        t[n] = t[n].reshape(1, INDEX_DIM)
    ones = torch.ones((INDEX_DIM, ONES_COLS), dtype=torch.float32, device=dev)
    (slots,) = _backend.to_tensors(a.slot_mapping)
    slots = slots.to(device=dev, dtype=torch.int32).contiguous()
    return [*(t[n].contiguous() for n in names), ones, slots]


def _fp8_kernel_inputs(a: Args, dev) -> list:
    """The FP8 kernel's input tensors (zero-copy views of the caller's where possible), the
    Hadamard stage matrices and the ones columns (constants), the slots as int32."""
    from tilesim.device._dsa_indexer_prolog_fp8_kernel import hadamard_stages

    torch = require_torch()
    ins = a.ins
    names = ("x", "q_norm", "w_qb", "w_qb_scale", "w_k", "w_k_scale", "w_proj", "ln_gamma",
             "ln_beta", "cos", "sin")  # fmt: skip
    t = dict(zip(names, _backend.to_tensors(*(getattr(ins, n) for n in names)), strict=True))
    for n in ("ln_gamma", "ln_beta"):
        t[n] = t[n].reshape(1, INDEX_DIM)
    stages = torch.from_numpy(hadamard_stages()).to(dev)
    ones = torch.ones((INDEX_DIM, ONES_COLS), dtype=torch.float32, device=dev)
    (slots,) = _backend.to_tensors(a.slot_mapping)
    slots = slots.to(device=dev, dtype=torch.int32).contiguous()
    return [*(t[n].contiguous() for n in names), stages, ones, slots]


def _fp8_kernel_outputs(a: Args, dev) -> list:
    """Fresh outputs: q codes E4M3 ``[T*64, 128]``, q scales FP32 ``[T*64, 1]``, weights FP32
    ``[T, 64]``, and a copy of the pages as INT8 rows of 128 bytes (the kernel writes only
    the bytes of the slots' keys and scales)."""
    torch = require_torch()
    (kc,) = _backend.to_tensors(a.ins.k_cache)
    m = a.rows * INDEX_HEADS
    pages = kc.detach().contiguous().clone().view(torch.int8).reshape(-1, INDEX_DIM)
    return [torch.zeros((m, INDEX_DIM), dtype=torch.float8_e4m3fn, device=dev),
            torch.zeros((m, 1), dtype=torch.float32, device=dev),
            torch.zeros((a.rows, INDEX_HEADS), dtype=torch.float32, device=dev), pages]  # fmt: skip


def _kernel_outputs(a: Args, dev) -> list:
    """Fresh outputs: q codes ``[T*64, 128]``, q scales ``[T*64, 1]``, weights ``[T, 64]``,
    and copies of the caches (``[rows, 128]`` codes, ``[rows, 1]`` scales), the kernel
    writing only the rows of the slots."""
    torch = require_torch()
    kc, ks = _backend.to_tensors(a.ins.k_cache, a.ins.k_scale)
    rows = a.num_blocks * a.block_size
    m = a.rows * INDEX_HEADS
    return [torch.zeros((m, INDEX_DIM), dtype=torch.int8, device=dev),
            torch.zeros((m, 1), dtype=torch.float16, device=dev),
            torch.zeros((a.rows, INDEX_HEADS), dtype=torch.float16, device=dev),
            kc.detach().reshape(rows, INDEX_DIM).clone(),
            ks.detach().reshape(rows, 1).clone()]  # fmt: skip


def _empty(a: Args) -> PrologResult:
    """Empty outputs of the documented shapes and dtypes on ``x``'s device (FakeTensor /
    ``meta`` inputs: torch.compile's tracing; no data read, no kernel)."""
    torch = require_torch()
    x, t = a.ins.x, a.rows
    int8 = a.path == "int8"
    code, scale = (torch.int8, torch.float16) if int8 else (torch.float8_e4m3fn, torch.float32)
    ks = (a.ins.k_scale.new_empty(tuple(a.ins.k_scale.shape)) if int8 else
          x.new_empty((a.num_blocks, a.block_size), dtype=torch.float32))  # fmt: skip
    return PrologResult(x.new_empty((t, INDEX_HEADS, INDEX_DIM), dtype=code),
                        x.new_empty((t, INDEX_HEADS), dtype=scale),
                        x.new_empty((t, INDEX_HEADS), dtype=scale),
                        a.ins.k_cache.new_empty(tuple(a.ins.k_cache.shape)), ks)  # fmt: skip


def _dtype_name(x) -> str:
    return str(x.dtype).removeprefix("torch.")


def _prepare(a: Args, target) -> dict:
    from tilesim.device import _dsa_indexer_prolog_kernel as kernels

    dev = _backend.to_tensors(a.ins.x)[0].device
    if a.path == "fp8":
        return _prepare_fp8(a, target, dev)
    inputs = _kernel_inputs(a, dev)
    params = kernels.PrologParams(eps=a.eps, amax_floor=a.amax_floor, k_tile=kernel_k_tile(a),
                                  unroll=kernels.unroll_for(a.rows))  # fmt: skip
    dtypes = (_dtype_name(inputs[7]), _dtype_name(inputs[9]))
    static = (a.hidden, a.rank, a.num_blocks * a.block_size)
    kernel = kernels.build(params, dtypes, static)
    return {"kernel": functools.partial(kernel, params=params), "inputs": inputs,
            "outputs": _kernel_outputs(a, dev), "target": target, "params": params}  # fmt: skip


def _prepare_fp8(a: Args, target, dev) -> dict:
    from tilesim.device import _dsa_indexer_prolog_fp8_kernel as fp8
    from tilesim.device._dsa_indexer_prolog_kernel import unroll_for

    inputs = _fp8_kernel_inputs(a, dev)
    params = fp8.Fp8Params(eps=a.eps, amax_floor=a.amax_floor, k_tile=kernel_k_tile(a),
                           block_size=a.block_size, unroll=unroll_for(a.rows))  # fmt: skip
    dtypes = (_dtype_name(inputs[7]), _dtype_name(inputs[9]))
    static = (a.hidden, a.rank, a.num_blocks * params.code_rows, int(inputs[9].shape[1]))
    kernel = fp8.build(params, dtypes, static)
    return {"kernel": functools.partial(kernel, params=params), "inputs": inputs,
            "outputs": _fp8_kernel_outputs(a, dev), "target": target, "params": params}  # fmt: skip


def _namespace(**kw):
    """The arguments of one call as the contract's namespace (the golden's ``ins``)."""
    return types.SimpleNamespace(**kw)


def _meta(ins) -> Args:
    """The contract's ``check_meta`` with the call's switches (the golden's call)."""
    return check_meta(ins, path=ins.path, rope_pairing=ins.rope_pairing, eps=ins.eps,
                      ue8m0=ins.ue8m0, amax_floor=ins.amax_floor, block_size=ins.block_size,
                      fp8_promotion=ins.fp8_promotion, k_tile=ins.k_tile)  # fmt: skip


def prepared_launch(ins, *, backend="sim", soc=DEFAULT_SOC, validate=True) -> dict:
    """What :func:`dsa_indexer_prolog` would launch for the call whose arguments are the
    namespace ``ins`` (the golden's names), checks included, without launching: ``{"kernel",
    "inputs", "outputs", "target", "params"}``. Run it with
    ``tilesim.device.sim.run_cost(kernel, [*inputs, *outputs])`` (the cost rows) or
    ``run_kernel``."""
    a = _checked(_meta(ins), validate)
    return _prepare(a, _target(a, backend, soc))


def _fp8_caches(a: Args, pages) -> list:
    """The FP8 result's ``k_cache`` (the written pages, ``uint8 [num_blocks, block_size *
    132]``) and ``k_scale`` (a copy of the FP32 scales inside them, ``[num_blocks,
    block_size]``, as the golden returns), from the kernel's INT8 rows of page bytes."""
    torch = require_torch()
    kc = pages.view(torch.uint8).reshape(a.num_blocks, -1)
    page = index_page_view("fp8", a.block_size)
    words = kc.view(torch.float32)
    return [kc, words[:, page.scale_col0 : page.scale_col0 + a.block_size].clone()]


def _finish(a: Args, outs: list, us, target):
    """The golden's result fields from the kernel's outputs (NumPy for NumPy input)."""
    q, qs, w = outs[:3]
    res = [q.reshape(a.rows, INDEX_HEADS, INDEX_DIM), qs.reshape(a.rows, INDEX_HEADS), w]
    if a.path == "fp8":
        res += _fp8_caches(a, outs[3])
    else:
        kc, ks = outs[3:]
        res += [kc.reshape(a.num_blocks, a.block_size, INDEX_DIM),
                ks.reshape(a.num_blocks, a.block_size)]  # fmt: skip
    if target.numpy_io:
        from tilesim.shared.interop import to_numpy

        res = [to_numpy(v).copy() for v in res]
    out = PrologResult(*res)
    return (out, 0.0 if us is None else us) if target.sim else out


@_backend.graph_safe
def dsa_indexer_prolog(
    x,
    q_norm,
    w_qb,
    w_k,
    w_proj,
    ln_gamma,
    ln_beta,
    cos,
    sin,
    k_cache,
    slot_mapping,
    q_norm_scale=None,
    w_qb_scale=None,
    w_k_scale=None,
    hadamard_q=None,
    hadamard_k=None,
    k_scale=None,
    *,
    path: str = "int8",
    rope_pairing: str = "halves",
    eps: float = 1e-6,
    ue8m0: bool = True,
    amax_floor: float | None = None,
    block_size: int = DEEPSEEK_V32.block_size,
    fp8_promotion: str = "fma",
    k_tile: int | None = None,
    backend="auto",
    soc=DEFAULT_SOC,
    validate=True,
):
    """Lightning-indexer prolog on the device: ``PrologResult(q, q_scale, weights, k_cache,
    k_scale)``.

    Arguments as :func:`tilesim.reference.dsa_indexer_prolog` (checked by the same contract,
    :mod:`tilesim.shared.dsa_indexer_prolog`, with the same messages); the kernels cover
    ``rope_pairing="halves"``: ``path="int8"`` on ``[T, 64]`` tables, ``path="fp8"`` (a SoC
    with FP8) with ``fp8_promotion="two_roundings"``, ``ue8m0=True`` and a ``block_size``
    multiple of 32 (module docstring); both sum their FP32 linears over ``H`` in K tiles of
    ``k_tile`` (at most 1024 rows dividing ``H``; ``None``: one tile, so up to ``H = 1024``;
    DeepSeek's 7168 needs a tile, ``k_tile=1024`` its cost rows', and the golden with the
    same ``k_tile`` is what it reproduces). Device-only keywords:
    ``backend`` (``"npu"``, ``"sim"`` or ``"auto"``, :func:`tilesim.device.backend.resolve`),
    ``soc`` (the simulator's target, ``"910b"`` or ``"950"``; FP8 needs a SoC with FP8) and
    ``validate`` (``True``: the slot checks; ``"full"``: every value check of the golden;
    ``False``: metadata only -- a bad slot is then undefined behaviour).

    Returns the golden's fields bit for bit (in the simulator): ``q`` int8 (FP8: E4M3)
    ``[T, 64, 128]``, ``q_scale`` FP16 (FP8: FP32) ``[T, 64]``, ``weights`` FP16 (FP8: FP32)
    ``[T, 64]``, and updated copies of ``k_cache`` / ``k_scale`` (only the rows of the written
    slots differ; FP8: the pages with only the written keys' bytes changed, and a copy of the
    scales inside them); NumPy for NumPy
    input; with ``backend="sim"`` the pair ``(result, cost_us)``. Inputs are never modified.
    FakeTensor / ``meta`` inputs: empty outputs of those shapes, no data read, no kernel.
    Legal input whose arithmetic overflows (docs/ops/dsa_indexer_prolog.md, "Bad input and
    overflow") is computed through without the golden's warning, and a q or k vector holding
    NaN / inf is not quantized by the golden's non-finite rule there.
    """
    ins = _namespace(**{k: v for k, v in locals().items()
                        if k not in ("backend", "soc", "validate")})  # fmt: skip
    a = _meta(ins)
    _backend.validate_level(validate)
    check_choice(backend, "backend", _backend.BACKENDS)
    if _backend.is_shape_only(x, q_norm, k_cache, slot_mapping,
                              names=("x", "q_norm", "k_cache", "slot_mapping")):  # fmt: skip
        return _empty(a)
    a = _checked(a, validate)
    target = _target(a, backend, soc)
    run = _prepare(a, target)
    us = _backend.launch(run["kernel"], run["inputs"], run["outputs"], target)
    return _finish(a, run["outputs"], us, target)


def dsa_indexer_prolog_traffic(args: Args) -> dict:
    """HBM bytes and FLOPs of one call (the cost rows' yardstick): the op's one counter
    :func:`tilesim.shared.dsa_indexer_prolog.cost` (``args`` from ``check_values``)."""
    from tilesim.shared.dsa_indexer_prolog import cost

    return cost(check_values(args) if not args.values else args)


__all__ = ["dsa_indexer_prolog", "dsa_indexer_prolog_traffic", "kernel_k_tile",
           "prepared_launch"]  # fmt: skip
