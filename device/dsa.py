"""DeepSeek-V3.2 sparse MLA attention with FP8 / INT8 anti-quantization — PyPTO kernels.

Device twins of :func:`tilesim.reference.sparse_attention_antiquant` and
:func:`tilesim.reference.sparse_attention_antiquant_kv_split`: same names, same arguments, same
output (BF16 ``[T*nq, 512]``), same rounding points. The tensor programs are in
:mod:`tilesim.device._dsa_kernel`; this module checks the arguments with the reference's own
check function and gather planning (:mod:`tilesim.shared.dsa`), picks the kernel for the
cache form, dtype and softmax mode, and runs it through :mod:`tilesim.device.backend`:

* ``backend="npu"`` (or ``"auto"`` with NPU torch tensors): on an Ascend NPU (torch_npu, CANN);
* ``backend="sim"``: on the CPU through PyPTO's host interpreter and cost model
  (:mod:`tilesim.device.sim`) for ``soc`` (one SoC per process); returns ``(out, cost_us)``.

=================  ==========  ===================  ============================================
cache              dtype       SoC                  kernel
=================  ==========  ===================  ============================================
packed ``[r,656]``  INT8        910B, 950            one whole-row gather per KV tile
packed ``[r,656]``  FP8 E4M3    950                  two gathers (nope as FP8, rope+scales bytes)
kv_split           FP8 E4M3    950                  three gathers (kn_quant, kr, kn_scales)
kv_split           INT8        910B, 950            three gathers
=================  ==========  ===================  ============================================

:func:`prepared_launch` hands back what a call would launch (kernel, exact tensors) without
running it: the compile checks at the NPU tests' shapes and the cost-model option sweep use it.

``tiling`` (:class:`tilesim.shared.tiling.SaTileShapeConfig`) selects the mode: the
``decode`` preset (online softmax over 512-key tiles, the seeds'
``_high`` kernel) or the ``prefill`` preset (per-tile normalised softmax over 2048-key tiles,
the seeds' ``_d``/``_p``). The call's token count picks the build (its JIT options, part of the
compile key): :func:`tilesim.shared.dsa.kernel_build` -- online calls of at least
``LARGE_BATCH_ITEMS[soc]`` (token, group tile) work items (``LARGE_TILING_BUILD_ITEMS[soc]``
in the large-batch tiling) run the large-batch build
(:data:`tilesim.device._dsa_kernel.LARGE_BATCH_JIT`: task merges only, the same bits), and
the large-batch tiling's calls of at least ``MANY_TOKENS_ITEMS[soc]`` items the many-token
build (:data:`~tilesim.device._dsa_kernel.MANY_TOKENS_JIT`: one more task merge; and C1 on
256-key N tiles, :func:`tilesim.shared.dsa.build_tiling`: the same K steps, the same bits). From
``LARGE_TILING_ITEMS[soc]`` work items a ``decode``-preset call also runs the large-batch
tiling (:func:`tilesim.shared.dsa.kernel_tiling`, ``SaTileShapeConfig.large_batch()``: one
2048-key tile per token, 512-deep K steps; part of the compile key through the tiles). Its
bits are not the decode preset's: its golden twin is the reference with that tiling and
``accumulation="k_steps"`` (:func:`tilesim.shared.dsa.golden_keywords`).

Edges handled beyond the seeds' kernels, as the reference documents them: a query token with
``cur_seq = 0`` gets zeros (the seeds write nothing); a last tile with fewer than ``s_kv_tile``
keys uses valid shapes; ``cur_seq > s_kv_tile`` works in both modes (per-tile mode merges the
normalised tiles where the seeds keep the last); ``-1`` entries among the first ``cur_seq``
indices are skipped as the reference skips them (a "masked" build: the wrapper points them at
an allocated position of the batch and appends a 0/1 skip mask to the index tensor; the kernel
selects -3e38 as those scores and +0 as their V rows -- a select, so a NaN stand-in row
changes nothing -- so their P is exactly 0, and an all-skipped tile is a no-op of
the merge; a token with no live entry gets zeros). Not supported: ``n_kv != 1`` and
``nq / n_kv`` not a multiple of ``g_tile`` (``ValueError`` before launch).
"""

from __future__ import annotations

import contextvars
import functools

from tilesim.device import backend as _backend
from tilesim.device._lazy import require_torch
from tilesim.shared.casts import BF16
from tilesim.shared.dsa import (
    RECORD,
    Args,
    build_tiling,
    check_meta,
    cost_of_indices,
    kernel_build,
    kernel_tiling,
)
from tilesim.shared.interop import is_torch_tensor
from tilesim.shared.layouts.dsa_kernel_index import kernel_indices, kernel_indices_torch
from tilesim.shared.layouts.dsa_split_rule import tiles_per_split
from tilesim.shared.layouts.mla_cache import KV_SPLIT_NAMES, NOPE, is_packed
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.soc import DEFAULT_SOC, require_fp8
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.validate import check_array, check_choice, shape_of

__all__ = [
    "prepared_launch",
    "sparse_attention_antiquant",
    "sparse_attention_antiquant_kv_split",
    "sparse_attention_traffic",
]


# ----------------------------------------------------------------------------- host planning
def _check_kernel_limits(a: Args) -> None:
    """What the kernels cannot do on top of the shared checks (``ValueError``)."""
    if a.nq % a.tiling.g_tile:
        raise ValueError(
            f"tiling.g_tile: expected a divisor of nq/n_kv = {a.nq} (the kernel has no tail "
            f"group tile), got {a.tiling.g_tile}"
        )
    bt_shape = tuple(shape_of(a.block_table, "block_table"))
    if bt_shape[1] == 0:
        raise ValueError(f"block_table: expected shape [{a.n_b}, max_blocks >= 1], got {bt_shape}")


def _check_out(out, rows: int) -> None:
    """``out``: ``None`` or a contiguous BF16 torch tensor ``[rows, 512]``."""
    if out is None:
        return
    if not is_torch_tensor(out):
        raise TypeError(f"out: expected a BF16 torch tensor or None, got {type(out).__name__}")
    check_array(out, "out", dtype=BF16, shape=(rows, NOPE), layout="[T*nq, 512]")
    if not out.is_contiguous():
        raise ValueError("out: expected a contiguous tensor, got a strided view")


# ----------------------------------------------------------------------------- launch
def _launch(a: Args, ints: tuple, form: str, quant: str, layout: str, caches: tuple, plan,
            out, target, unmasked: bool = False):  # fmt: skip
    """Run the kernel for the cache ``form`` on the queries, ``caches`` (kernel order) and the
    caller's integer arrays ``ints`` (``topk_indices``, ``block_table``, ``kv_act_seqs``);
    ``plan``: :func:`~tilesim.shared.layouts.dsa_kernel_index.kernel_indices` (validated) or
    ``None`` (:func:`~tilesim.shared.layouts.dsa_kernel_index.kernel_indices_torch`). Returns
    the wrapper's result (:func:`tilesim.device.backend.finish`)."""
    torch = require_torch()
    from tilesim.device import _dsa_kernel as kernels

    qn, qr, *cache_t = _backend.to_tensors(a.query_nope, a.query_rope, *caches)
    # one [T*nq, 576] query (an exact copy): C1 reads its Q tile straight from an input
    tensors = [torch.cat([qn, qr], dim=1).contiguous(), *(t.contiguous() for t in cache_t)]
    if form == "packed":
        cache = tensors.pop()
        tensors.append(cache.view(torch.int8))
        if quant == "fp8":
            tensors.append(cache)  # the same bytes typed FP8 (see _dsa_kernel.load_packed_fp8)
    dev = tensors[0].device
    ti, bt, acts = (t.to(dev) for t in _backend.to_tensors(*ints))
    if plan is None:
        plan = kernel_indices_torch(
            ti, bt, acts, s1=a.s1, topk=a.topk, block_size=a.block_size,
            s_kv_tile=a.tiling.s_kv_tile, cache_rows=tensors[1].shape[0],
        )  # fmt: skip
        if unmasked:  # the caller's promise: no used -1, so no skip columns (unmasked build)
            plan = (plan[0][:, : plan[1]], None)
    idx, mask_col0 = plan
    idx = torch.as_tensor(idx).to(device=dev, dtype=torch.int32).contiguous()
    bt, acts = _bucket_columns(bt.to(torch.int32)), acts.to(torch.int32).contiguous()
    if out is None:
        out = torch.empty((a.rows, NOPE), dtype=torch.bfloat16, device=dev)
    mode = "online" if a.tiling.softmax == "online" else "per_tile"
    capture = _CAPTURE.get()
    override = capture.get("jit") if capture is not None else None  # () = PyPTO's defaults
    forced = (capture or {}).get("build")
    if forced is not None:
        check_choice(forced, "build", tuple(kernels.BUILDS))
    build = forced or kernel_build(tokens=a.rows // a.nq, nq=a.nq, tiling=a.tiling, soc=target.soc)
    jit = kernels.jit_spec(target.soc, mode, build) if override is None else override
    a = a._replace(tiling=build_tiling(a.tiling, build))
    params = _nest_params(a, quant, layout, mask_col0, kernels.combine_axis(jit))
    kernel = kernels.build(form, quant, mode, params, (tensors[1].shape[0], bt.shape[1]), jit)
    kernel = functools.partial(kernel, params=params)
    if capture is not None:  # prepared_launch: hand the launch back instead of running it
        capture.update(kernel=kernel, inputs=[*tensors, idx, bt, acts], outputs=[out])
        return None
    us = _backend.launch(kernel, [*tensors, idx, bt, acts], [out], target)
    return _backend.finish(out, us, target)


#: set by :func:`prepared_launch` for the duration of one wrapper call
_CAPTURE: contextvars.ContextVar = contextvars.ContextVar("dsa_prepared_launch", default=None)


def prepared_launch(op: str, *args, jit: tuple | None = None, build: str | None = None,
                    **kwargs) -> dict:  # fmt: skip
    """What the wrapper ``op`` (``"sparse_attention_antiquant"`` or ``..._kv_split``) would
    launch for these arguments, without launching: ``{"kernel", "inputs", "outputs"}`` (the
    kernel with its static parameters bound, and the exact tensors the NPU / sim path passes:
    query, caches, the index plan, the bucketed block table, ``kv_act_seqs``; then ``out``).
    Every check and the index planning run as in a real call. ``jit``: an option spec
    replacing the call's (:func:`tilesim.device._dsa_kernel.jit_spec`; the cost-model sweep's
    variants); ``build``: a build forced in place of the one
    :func:`tilesim.shared.dsa.kernel_build` picks (a key of ``_dsa_kernel.BUILDS``: its tiles,
    ``tilesim.shared.dsa.build_tiling``, and its options unless ``jit`` is given). Run it with
    ``tilesim.device.sim.run_compile(kernel, [*inputs, *outputs])`` (compile only) or
    ``run_kernel``."""
    wrappers = {f.__name__: f for f in (sparse_attention_antiquant,
                                        sparse_attention_antiquant_kv_split)}  # fmt: skip
    check_choice(op, "op", tuple(wrappers))
    box: dict = {"jit": None if jit is None else tuple(jit), "build": build}
    token = _CAPTURE.set(box)
    try:
        wrappers[op](*args, **kwargs)
    finally:
        _CAPTURE.reset(token)
    if "kernel" not in box:
        raise ValueError(f"{op}: these arguments launch no kernel (shape-only inputs)")
    return {k: box[k] for k in ("kernel", "inputs", "outputs")}


def _bucket_columns(bt):
    """``block_table`` widened to the next power of two of columns (at least 8) with ``-1``
    (never read: every read block is inside the caller's columns): the table's width is a
    compiled-in axis (:func:`tilesim.device._dsa_kernel.build`), so a growing context costs
    one compile per doubling, not one per width. Padding cost: under 2x INT32 columns."""
    torch = require_torch()
    cols = max(8, 1 << max(int(bt.shape[1]) - 1, 0).bit_length())
    out = torch.full((bt.shape[0], cols), -1, dtype=torch.int32, device=bt.device)
    out[:, : bt.shape[1]] = bt
    return out


def _nest_params(a: Args, quant: str, layout: str, mask_col0, combine_axis: bool):
    """The kernel's static parameters (its compile key: model constants, tiles, quant, layout,
    mode, masked or not, the ``combine_axis`` option -- no batch, length or ``cur_seq``)."""
    from tilesim.device import _dsa_kernel as kernels

    k = a.tiling.kv_splits
    return kernels.NestParams(
        nq=a.nq, n_kv=1, softmax_scale=float(a.softmax_scale), topk=a.topk,
        block_size=a.block_size, tile=a.tiling.as_tuple(), online=a.tiling.softmax == "online",
        quant=quant, layout=layout, mask_col0=mask_col0, kv_splits=k,
        tiles_per_split=tiles_per_split(a.topk, a.tiling.s_kv_tile, k) if k > 1 else None,
        combine_axis=combine_axis,
    )  # fmt: skip


def _resolve(a: Args, quant: str, cache_name: str, backend_name: str, soc: str):
    """The call's :class:`~tilesim.device.backend.Target`; an FP8 cache needs a SoC with FP8
    (:func:`tilesim.shared.soc.require_fp8`)."""
    target = _backend.resolve(backend_name, soc, a.query_nope)
    if quant == "fp8":
        require_fp8(target.soc, cache_name, "an FP8 E4M3 cache",
                    "use an INT8 cache, or soc='950' in the simulator")  # fmt: skip
    return target


def _checked_args(queries: tuple, caches: tuple, ints: tuple, layout: str, validate,
                  sizes: dict) -> tuple[Args, bool, tuple]:  # fmt: skip
    """``(a, shape_only, ints)``: :func:`~tilesim.shared.dsa.check_meta` on the caller's
    ``queries`` ``(query_nope, query_rope)``, ``caches``, ``ints`` ``(topk_indices,
    block_table, kv_act_seqs)`` and ``sizes`` (the :func:`~tilesim.shared.dsa.model_keywords`
    by name), metadata only, then the value checks ``validate`` asks for
    (:func:`tilesim.device.backend.value_checks`: :func:`~tilesim.shared.dsa.check_int_values`,
    the integer inputs, for ``True`` and ``"full"``) when the data is real (``a.values`` tells
    whether they ran)."""
    _backend.validate_level(validate)
    a = check_meta(*queries, caches, *ints, layout=layout, **sizes)
    names = ("query_nope", "query_rope", *_CACHE_NAMES[not is_packed(layout)], "topk_indices",
             "block_table", "kv_act_seqs")  # fmt: skip
    arrays = (*queries, *a.caches, *ints)
    shape_only = _backend.is_shape_only(*arrays, names=names)
    return _backend.value_checks(RECORD, a, validate, shape_only=shape_only), shape_only, ints


_CACHE_NAMES = (("nope_cache",), KV_SPLIT_NAMES)


def _checked_call(checked, form: str, layout: str, out, backend, soc, unmasked=False):
    """The rest of a call once the arguments are checked (``checked``: :func:`_checked_args`):
    the kernel's limits, the index plan (host, :func:`kernel_indices`, when
    the values were checked; else its torch twin at launch), ``out``, the target; then the launch of
    the ``form`` (``"packed"`` in ``layout``, or ``"split"``) kernel. Shape-only inputs
    (FakeTensor / ``meta``) get an empty output, no kernel."""
    a, shape_only, ints = checked
    _check_kernel_limits(a)
    plan = kernel_indices(a) if a.values else None
    _check_out(out, a.rows)
    if shape_only:
        check_choice(backend, "backend", _backend.BACKENDS)
        if out is not None:
            return out
        return a.query_nope.new_empty((a.rows, NOPE), dtype=require_torch().bfloat16)
    name = "nope_cache" if form == "packed" else "kn_quant"
    target = _resolve(a, a.quant, name, backend, soc)
    # many tokens: the decode preset's call runs the large-batch tiling (its own bits), whose
    # index plan is padded to its KV tiles
    tiling = kernel_tiling(tokens=a.rows // a.nq, nq=a.nq, tiling=a.tiling, soc=target.soc)
    if tiling != a.tiling:
        a = a._replace(tiling=tiling)
        plan = kernel_indices(a) if a.values else None
    return _launch(a, ints, form, a.quant, layout, a.caches, plan, out, target, unmasked)


# ----------------------------------------------------------------------------- public ops
@_backend.graph_safe
def sparse_attention_antiquant(
    query_nope,
    query_rope,
    nope_cache,
    topk_indices,
    block_table,
    kv_act_seqs,
    *,
    nq: int = DEEPSEEK_V32.num_q_heads,
    n_kv: int = DEEPSEEK_V32.num_kv_heads,
    softmax_scale: float,
    topk: int = DEEPSEEK_V32.topk,
    block_size: int = DEEPSEEK_V32.block_size,
    tiling: SaTileShapeConfig | None = None,
    layout: str = "pypto",
    out=None,
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
    validate: bool = True,
    unmasked: bool = False,
):
    """Sparse MLA attention over a packed quantized latent cache on PyPTO -> BF16 ``[T*nq, 512]``.

    Args are those of :func:`tilesim.reference.sparse_attention_antiquant` (NumPy/ml_dtypes
    arrays or torch tensors, checked by the same function): ``nope_cache`` INT8 (910B, 950) or
    FP8 E4M3 (950) ``[rows, 656]`` in ``layout`` ``"pypto"`` or ``"flashmla"``; ``tiling``
    ``None`` reads ``SaTileShapeConfig.from_env()`` (decode preset). A decode-preset call of
    many tokens runs the large-batch tiling, whose bits are the golden's with
    :func:`tilesim.shared.dsa.golden_keywords` (module docstring). Device-only keywords:

    * ``out`` — a BF16 torch tensor ``[T*nq, 512]`` on the inputs' device, written in place
      (else one is allocated);
    * ``backend`` — ``"npu"`` (torch tensors on an Ascend NPU), ``"sim"`` (NumPy arrays or CPU
      tensors, PyPTO's host interpreter + cost model for ``soc``) or ``"auto"`` (``"npu"`` for
      NPU tensors, else a ``ValueError`` naming both) (:func:`tilesim.device.backend.resolve`);
    * ``soc`` — the simulator's target, ``"910b"`` or ``"950"`` (a process compiles for one);
    * ``validate`` — ``True`` (default; ``"full"`` is the same: this op has no float scan)
      copies ``topk_indices``, ``block_table`` and ``kv_act_seqs`` to the host for the
      reference's value checks (every used entry) and plans the kernel's index tensor
      there (one ``[T, topk]`` int64 pass, then a host-to-device
      copy of the INT32 plan: docs/device.md#host-round-trips-and-validate); ``False`` checks
      metadata only,
      reads no value and plans the index tensor on the inputs' device
      (:func:`kernel_indices_torch`, the masked kernel build unless ``unmasked``); bad
      entries are then undefined;
    * ``unmasked`` — with ``validate=False``: the caller's promise that no used entry (the
      first ``cur_seq`` of a row) is ``-1`` (e.g. every row sees ``>= topk`` keys of an
      indexer that fills them), so the device plan drops the skip columns and the unmasked
      build runs (the same bits on such ids); a used ``-1`` is then undefined. Ignored when
      the values are checked (the host plan sees the ids).

    FakeTensor / ``meta`` inputs (torch.compile tracing; the wrapper is
    :func:`~tilesim.device.backend.graph_safe`): the metadata checks, then an empty BF16
    ``[T*nq, 512]`` (or ``out``), no data read, no kernel.

    Returns the output of the same kind as ``query_nope`` (NumPy BF16 for NumPy, a torch tensor
    for torch); with ``backend="sim"`` the pair ``(out, cost_us)``, ``cost_us`` being the cost
    model's simulated AICore time in µs. Inputs are never modified.
    """
    sizes = dict(nq=nq, n_kv=n_kv, softmax_scale=softmax_scale, topk=topk,
                 block_size=block_size, tiling=tiling)  # fmt: skip
    ints = (topk_indices, block_table, kv_act_seqs)
    checked = _checked_args((query_nope, query_rope), (nope_cache,), ints, layout, validate, sizes)
    return _checked_call(checked, "packed", layout, out, backend, soc, unmasked)


@_backend.graph_safe
def sparse_attention_antiquant_kv_split(
    query_nope,
    query_rope,
    kn_quant,
    kr,
    kn_scales,
    topk_indices,
    block_table,
    kv_act_seqs,
    *,
    nq: int = DEEPSEEK_V32.num_q_heads,
    n_kv: int = DEEPSEEK_V32.num_kv_heads,
    softmax_scale: float,
    topk: int = DEEPSEEK_V32.topk,
    block_size: int = DEEPSEEK_V32.block_size,
    tiling: SaTileShapeConfig | None = None,
    out=None,
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
    validate: bool = True,
    unmasked: bool = False,
):
    """:func:`sparse_attention_antiquant` over the kv_split cache: ``kn_quant [rows, 512]`` FP8
    E4M3 (950) or INT8, ``kr [rows, 64]`` BF16, ``kn_scales [rows, 4]`` FP32. Same arithmetic
    and output as the packed kernel on the same data."""
    sizes = dict(nq=nq, n_kv=n_kv, softmax_scale=softmax_scale, topk=topk,
                 block_size=block_size, tiling=tiling)  # fmt: skip
    checked = _checked_args((query_nope, query_rope), (kn_quant, kr, kn_scales),
                            (topk_indices, block_table, kv_act_seqs), "kv_split", validate,
                            sizes)  # fmt: skip
    return _checked_call(checked, "split", "pypto", out, backend, soc, unmasked)


def sparse_attention_traffic(
    topk_indices,
    kv_act_seqs,
    *,
    nq: int = DEEPSEEK_V32.num_q_heads,
    topk: int = DEEPSEEK_V32.topk,
    g_tile: int = SaTileShapeConfig.g_tile,
) -> dict:
    """HBM bytes and cube FLOPs of one kernel call (the physical-limit columns of the reports):
    the kernel's counts of :func:`tilesim.shared.dsa.cost` (the op's one counter) --
    ``bytes`` = its ``kernel_bytes`` (Q in and O out per token and group tile, per used top-k
    entry and group tile one gathered 656 B row plus its INT32 index), ``flop`` = its
    ``kernel_flop`` (masked ``-1`` entries included: the kernel computes them), ``keys``."""
    c = cost_of_indices(topk_indices, kv_act_seqs, nq=nq, topk=topk, g_tile=g_tile)
    return {"bytes": c["kernel_bytes"], "flop": c["kernel_flop"], "keys": c["keys"]}
