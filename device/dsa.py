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

``tiling`` (:class:`tilesim.shared.tiling.SaTileShapeConfig`; ``tile_config`` is a deprecated
alias) selects the mode: the ``decode`` preset (online softmax over 512-key tiles, the seeds'
``_high`` kernel) or the ``prefill`` preset (per-tile normalised softmax over 2048-key tiles,
the seeds' ``_d``/``_p``).

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

import numpy as np
from tilesim.device import backend as _backend
from tilesim.device._lazy import require_torch
from tilesim.shared.casts import BF16
from tilesim.shared.dsa import (
    NO_ROW,
    DsaArgs,
    attention_flop,
    check_dsa_args,
    check_packed_cache,
    check_split_cache,
    cur_seq_lengths,
    kv_tiles,
    plan_physical_rows,
    resolve_tiling,
    stand_in_positions,
    tiles_per_split,
)
from tilesim.shared.interop import is_torch_tensor
from tilesim.shared.mla_cache import NOPE, PYPTO_ROW_BYTES, ROPE
from tilesim.shared.soc import DEFAULT_SOC
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.validate import (
    check_array,
    check_bool,
    check_choice,
    check_pos_int,
    host_ints,
    is_array,
)

__all__ = [
    "device_indices",
    "kernel_indices",
    "matmul_probe",
    "prepared_launch",
    "sparse_attention_antiquant",
    "sparse_attention_antiquant_kv_split",
    "sparse_attention_traffic",
]


# ----------------------------------------------------------------------------- host planning
def _check_kernel_limits(a: DsaArgs) -> None:
    """What the kernels cannot do on top of the shared checks (``ValueError``)."""
    if a.nq % a.tiling.g_tile:
        raise ValueError(
            f"tiling.g_tile: expected a divisor of nq/n_kv = {a.nq} (the kernel has no tail "
            f"group tile), got {a.tiling.g_tile}"
        )
    if a.block_table.shape[1] == 0:
        raise ValueError(
            f"block_table: expected shape [{a.n_b}, max_blocks >= 1], got {a.block_table.shape}"
        )


def kernel_indices(a: DsaArgs, cache_rows: int) -> tuple[np.ndarray, int | None]:
    """``(indices, mask_col0)``: the INT32 index tensor the kernel reads.

    Every used top-k entry is checked as the reference checks it
    (:func:`~tilesim.shared.dsa.plan_physical_rows`). The columns are zero-padded to whole
    KV tiles so that the last tile's ``[1, s_kv_tile]`` view stays inside the tensor (only
    ``cur_seq`` columns are read; the entries past ``cur_seq`` are written 0, whatever the
    caller left there). When some used entry is ``-1`` (the masked build), it is
    replaced by a stand-in position of its batch
    (:func:`~tilesim.shared.dsa.stand_in_positions`) and as many columns again follow,
    1 at every skipped entry, 0 elsewhere (one tensor, not two: PyPTO 0.2.0's cost-model
    machine crashes with ten kernel arguments); ``mask_col0`` is where they start, else
    ``None``."""
    st = a.tiling.s_kv_tile
    cols = -(-a.topk // st) * st
    phys, cur = plan_physical_rows(
        a.topk_indices, a.block_table, a.kv_act_seqs,
        s1=a.s1, topk=a.topk, block_size=a.block_size, cache_rows=cache_rows,
    )  # fmt: skip
    skipped = (np.arange(a.topk)[None, :] < cur[:, None]) & (phys == NO_ROW)
    n = a.topk_indices.shape[0]
    used = np.arange(a.topk)[None, :] < cur[:, None]
    entries = np.where(used, a.topk_indices[:, : a.topk], 0)  # past cur_seq: never read, 0
    if not skipped.any():
        idx = np.zeros((n, cols), dtype=np.int32)
        idx[:, : a.topk] = entries
        return idx, None
    filler = stand_in_positions(
        skipped, a.block_table, s1=a.s1, block_size=a.block_size, cache_rows=cache_rows
    )
    idx = np.zeros((n, 2 * cols), dtype=np.int32)
    idx[:, : a.topk] = entries
    rows, c = np.nonzero(skipped)
    idx[rows, c] = filler[rows // a.s1]
    idx[rows, cols + c] = 1
    return idx, cols


def device_indices(ti, bt, acts, *, s1: int, topk: int, block_size: int, s_kv_tile: int,
                   cache_rows: int):  # fmt: skip
    """The masked form of :func:`kernel_indices` built where the tensors live (torch ops on
    the inputs' device, no host copy; the ``validate=False`` path), with no value check:
    INT32 ``[T, 2*cols]``, the entries (0 past ``cur_seq``, a used ``-1`` replaced by its
    batch's stand-in position, the first one whose block is allocated and inside the cache:
    :func:`~tilesim.shared.dsa.stand_in_positions`), then the 0/1 skip columns from
    ``cols``. Always the masked layout: whether a ``-1`` is used is not known without reading
    the data. A batch with a used ``-1`` and no allocated block gets position 0 (undefined,
    as every unchecked bad entry is). Tested equal to :func:`kernel_indices`."""
    torch = require_torch()
    dev = ti.device
    cols = -(-topk // s_kv_tile) * s_kv_tile
    s = torch.arange(s1, device=dev, dtype=torch.int64)
    cur = (acts.to(torch.int64)[:, None] - s1 + 1 + s[None, :]).clamp(0, topk).reshape(-1)
    used = torch.arange(topk, device=dev)[None, :] < cur[:, None]
    t = ti[:, :topk].to(torch.int64)
    skipped = used & (t == -1)
    table = bt.to(torch.int64)
    ok = (table >= 0) & ((table + 1) * block_size <= cache_rows)
    filler = (ok.to(torch.int32).argmax(dim=1) * block_size).repeat_interleave(s1)
    entries = torch.where(skipped, filler[:, None], torch.where(used, t, 0))
    idx = torch.zeros((t.shape[0], 2 * cols), dtype=torch.int32, device=dev)
    idx[:, :topk] = entries.to(torch.int32)
    idx[:, cols : cols + topk] = skipped.to(torch.int32)
    return idx, cols


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
def _launch(a: DsaArgs, ints: tuple, form: str, quant: str, layout: str, caches: tuple, plan,
            out, target):  # fmt: skip
    """Run the kernel for the cache ``form`` on the queries, ``caches`` (kernel order) and the
    caller's integer arrays ``ints`` (``topk_indices``, ``block_table``, ``kv_act_seqs``);
    ``plan``: :func:`kernel_indices` (validated) or ``None`` (:func:`device_indices`). Returns
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
        plan = device_indices(
            ti, bt, acts, s1=a.s1, topk=a.topk, block_size=a.block_size,
            s_kv_tile=a.tiling.s_kv_tile, cache_rows=tensors[1].shape[0],
        )  # fmt: skip
    idx, mask_col0 = plan
    idx = torch.as_tensor(idx).to(device=dev, dtype=torch.int32).contiguous()
    bt, acts = _bucket_columns(bt.to(torch.int32)), acts.to(torch.int32).contiguous()
    if out is None:
        out = torch.empty((a.rows, NOPE), dtype=torch.bfloat16, device=dev)
    mode = "online" if a.tiling.softmax == "online" else "per_tile"
    capture = _CAPTURE.get()
    override = capture.get("jit") if capture is not None else None  # () = PyPTO's defaults
    jit = kernels.jit_spec(target.soc, mode) if override is None else override
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


def prepared_launch(op: str, *args, jit: tuple | None = None, **kwargs) -> dict:
    """What the wrapper ``op`` (``"sparse_attention_antiquant"`` or ``..._kv_split``) would
    launch for these arguments, without launching: ``{"kernel", "inputs", "outputs"}`` (the
    kernel with its static parameters bound, and the exact tensors the NPU / sim path passes:
    query, caches, the index plan, the bucketed block table, ``kv_act_seqs``; then ``out``).
    Every check and the index planning run as in a real call. ``jit``: an option spec
    replacing the SoC's (:func:`tilesim.device._dsa_kernel.jit_spec`; the cost-model sweep's
    variants). Run it with ``tilesim.device.sim.run_compile(kernel, [*inputs, *outputs])``
    (compile only) or ``run_kernel``."""
    check_choice(op, "op", ("sparse_attention_antiquant", "sparse_attention_antiquant_kv_split"))
    box: dict = {"jit": None if jit is None else tuple(jit)}
    token = _CAPTURE.set(box)
    try:
        globals()[op](*args, **kwargs)
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


def _nest_params(a: DsaArgs, quant: str, layout: str, mask_col0, combine_axis: bool):
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


def _resolve(a: DsaArgs, quant: str, cache_name: str, backend_name: str, soc: str):
    """The call's :class:`~tilesim.device.backend.Target`; FP8 needs the 950."""
    target = _backend.resolve(backend_name, soc, a.query_nope)
    if quant == "fp8" and target.soc != "950":
        raise ValueError(
            f"{cache_name}: FP8 E4M3 needs the Ascend 950 (the 910B has no FP8 type); this call "
            f"targets {target.soc!r} -- use an INT8 cache on 910B, or soc='950' in the simulator"
        )
    return target


def _checked_args(query_nope, query_rope, ints: tuple, validate, **kw):
    """``(a, shape_only, read)``: the shared checks (:func:`~tilesim.shared.dsa.
    check_dsa_args`) on the caller's ``ints`` (``topk_indices``, ``block_table``,
    ``kv_act_seqs``) when their values are read (``validate`` and real data), else on
    metadata stand-ins (:func:`tilesim.device.backend.standin`: no host copy)."""
    check_bool(validate, "validate")
    shape_only = _backend.is_shape_only(query_nope, query_rope, *ints)
    read = validate and not shape_only
    host = ints if read else tuple(_backend.standin(x) if is_array(x) else x for x in ints)
    return check_dsa_args(query_nope, query_rope, *host, **kw), shape_only, read


def _checked_call(checked, ints, form: str, layout: str, caches: tuple, out, backend, soc):
    """The rest of a call once the shared arguments are checked (``checked``:
    :func:`_checked_args`): the cache (``form`` ``"packed"``: ``(nope_cache,)`` in
    ``layout``; ``"split"``: ``(kn_quant, kr, kn_scales)``), the kernel's limits, the index
    plan (host, validated, when the values are read), ``out``, the target; then the launch.
    Shape-only inputs (FakeTensor / ``meta``) get an empty output, no kernel."""
    a, shape_only, read = checked
    if form == "packed":
        rows, quant = check_packed_cache(caches[0], layout)
    else:
        rows, quant = check_split_cache(*caches)
    _check_kernel_limits(a)
    plan = kernel_indices(a, rows) if read else None
    _check_out(out, a.rows)
    if shape_only:
        check_choice(backend, "backend", _backend.BACKENDS)
        if out is not None:
            return out
        return a.query_nope.new_empty((a.rows, NOPE), dtype=require_torch().bfloat16)
    target = _resolve(a, quant, "nope_cache" if form == "packed" else "kn_quant", backend, soc)
    return _launch(a, ints, form, quant, layout, caches, plan, out, target)


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
    nq: int = 128,
    n_kv: int = 1,
    softmax_scale: float,
    topk: int = 2048,
    block_size: int = 128,
    tiling: SaTileShapeConfig | None = None,
    layout: str = "pypto",
    out=None,
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
    validate: bool = True,
    tile_config: SaTileShapeConfig | None = None,
):
    """Sparse MLA attention over a packed quantized latent cache on PyPTO -> BF16 ``[T*nq, 512]``.

    Args are those of :func:`tilesim.reference.sparse_attention_antiquant` (NumPy/ml_dtypes
    arrays or torch tensors, checked by the same function): ``nope_cache`` INT8 (910B, 950) or
    FP8 E4M3 (950) ``[rows, 656]`` in ``layout`` ``"pypto"`` or ``"flashmla"``; ``tiling``
    ``None`` reads ``SaTileShapeConfig.from_env()`` (decode preset); ``tile_config=`` is its
    deprecated alias. Device-only keywords:

    * ``out`` — a BF16 torch tensor ``[T*nq, 512]`` on the inputs' device, written in place
      (else one is allocated);
    * ``backend`` — ``"npu"`` (torch tensors on an Ascend NPU), ``"sim"`` (NumPy arrays or CPU
      tensors, PyPTO's host interpreter + cost model for ``soc``) or ``"auto"`` (``"npu"`` for
      NPU tensors, else a ``ValueError`` naming both) (:func:`tilesim.device.backend.resolve`);
    * ``soc`` — the simulator's target, ``"910b"`` or ``"950"`` (a process compiles for one);
    * ``validate`` — ``True`` (default) copies ``topk_indices``, ``block_table`` and
      ``kv_act_seqs`` to the host for the reference's value checks (every used entry) and
      plans the kernel's index tensor there (one ``[T, topk]`` int64 pass, then a host-to-device
      copy of the INT32 plan: ``docs/device.md``, "validate="); ``False`` checks metadata only,
      reads no value and plans the index tensor on the inputs' device
      (:func:`device_indices`, always the masked kernel build); bad entries are then undefined.

    FakeTensor / ``meta`` inputs (torch.compile tracing; the wrapper is
    :func:`~tilesim.device.backend.graph_safe`): the metadata checks, then an empty BF16
    ``[T*nq, 512]`` (or ``out``), no data read, no kernel.

    Returns the output of the same kind as ``query_nope`` (NumPy BF16 for NumPy, a torch tensor
    for torch); with ``backend="sim"`` the pair ``(out, cost_us)``, ``cost_us`` being the cost
    model's simulated AICore time in µs. Inputs are never modified.
    """
    ints = (topk_indices, block_table, kv_act_seqs)
    checked = _checked_args(
        query_nope, query_rope, ints, validate,
        nq=nq, n_kv=n_kv, softmax_scale=softmax_scale, topk=topk, block_size=block_size,
        tiling=tiling, tile_config=tile_config,
    )  # fmt: skip
    return _checked_call(checked, ints, "packed", layout, (nope_cache,), out, backend, soc)


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
    nq: int = 128,
    n_kv: int = 1,
    softmax_scale: float,
    topk: int = 2048,
    block_size: int = 128,
    tiling: SaTileShapeConfig | None = None,
    out=None,
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
    validate: bool = True,
    tile_config: SaTileShapeConfig | None = None,
):
    """:func:`sparse_attention_antiquant` over the kv_split cache: ``kn_quant [rows, 512]`` FP8
    E4M3 (950) or INT8, ``kr [rows, 64]`` BF16, ``kn_scales [rows, 4]`` FP32. Same arithmetic
    and output as the packed kernel on the same data."""
    ints = (topk_indices, block_table, kv_act_seqs)
    checked = _checked_args(
        query_nope, query_rope, ints, validate,
        nq=nq, n_kv=n_kv, softmax_scale=softmax_scale, topk=topk, block_size=block_size,
        tiling=tiling, tile_config=tile_config,
    )  # fmt: skip
    caches = (kn_quant, kr, kn_scales)
    return _checked_call(checked, ints, "split", "pypto", caches, out, backend, soc)


def sparse_attention_traffic(
    topk_indices, kv_act_seqs, *, nq: int = 128, topk: int = 2048, g_tile: int = 128
) -> dict:
    """HBM bytes and cube FLOPs of one kernel call (the physical-limit columns of the reports).

    ``bytes`` = what the kernel moves through GM with no reuse: per query token and group tile,
    Q (``g_tile x 576`` BF16) in, the output rows (``g_tile x 512`` BF16) out, and per used
    top-k entry one gathered row (656 B) plus its INT32 index. ``flop`` =
    :func:`~tilesim.shared.dsa.attention_flop` of ``g_tile`` heads over ``cur_seq`` keys
    per token and group tile (the kernel computes masked ``-1`` entries too).
    """
    n_t = host_ints(topk_indices, "topk_indices", ndim=2).shape[0]
    acts = host_ints(kv_act_seqs, "kv_act_seqs", ndim=1)
    s1 = n_t // acts.shape[0]
    cur = cur_seq_lengths(acts, s1, topk)
    g_loops = nq // g_tile
    per_tile_rows = g_tile * (NOPE + ROPE) * 2 + g_tile * NOPE * 2
    total_cur = int(cur.sum())
    return {
        "bytes": g_loops * (cur.shape[0] * per_tile_rows + total_cur * (PYPTO_ROW_BYTES + 4)),
        "flop": g_loops * attention_flop(g_tile, total_cur),
        "keys": total_cur,
    }


def matmul_probe(tokens: int, *, nq: int = 128, topk: int = 2048, tiling=None,
                 backend: str = "sim", soc: str = DEFAULT_SOC, seed: int = 0):  # fmt: skip
    """The matmul-only probe of the kernel: its C1 and C2 on tiles of the same shapes, and
    nothing else (:func:`tilesim.device._dsa_kernel.probe_matmuls`), for ``tokens`` query
    tokens that each use ``topk`` keys. Returns ``(o, cost_us)`` on the simulator (``o`` the
    FP32 C2 products, ``[tokens * nq/g_tile * tiles * g_tile, 512]``), so a report can state a
    kernel's time as a multiple of what the cost model charges for its matmuls alone. Inputs
    are random BF16 on the grid ``j/128`` (``seed``); the values do not matter to the cost."""
    torch = require_torch()
    from tilesim.device import _dsa_kernel as kernels

    tokens = check_pos_int(tokens, "tokens")
    nq, topk = check_pos_int(nq, "nq"), check_pos_int(topk, "topk")
    cfg = resolve_tiling(tiling)
    if nq % cfg.g_tile:
        raise ValueError(f"tiling.g_tile: expected a divisor of nq = {nq}, got {cfg.g_tile}")
    target = _backend.resolve(backend, soc, np.zeros(1))
    n_t = kv_tiles(topk, cfg.s_kv_tile)
    gen = torch.Generator().manual_seed(seed)

    def grid(*shape):
        return (torch.randint(-128, 128, shape, generator=gen) / 128).to(torch.bfloat16)

    n_out = tokens * (nq // cfg.g_tile) * n_t * cfg.g_tile
    args = [grid(tokens * nq, NOPE + ROPE), grid(tokens * n_t * cfg.s_kv_tile, NOPE + ROPE),
            grid(cfg.g_tile, cfg.s_kv_tile)]  # fmt: skip
    outs = [torch.zeros((n_out, cfg.s_kv_tile), dtype=torch.float32),
            torch.zeros((n_out, NOPE), dtype=torch.float32)]  # fmt: skip
    params = kernels.ProbeParams(nq=nq, tile=cfg.as_tuple(), n_tiles=n_t)
    us = _backend.launch(functools.partial(kernels.build_probe(params), params=params), args,
                         outs, target)  # fmt: skip
    return _backend.finish(outs[1], us, target)
