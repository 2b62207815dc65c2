"""DeepSeek-V3.2 lightning indexer on Ascend — one PyPTO kernel: scores and top-k on the device.

Same name and arguments as the golden :func:`tilesim.reference.dsa_indexer` (contract:
:mod:`tilesim.shared.dsa_indexer`), plus ``backend`` / ``soc`` / ``validate``; NumPy arrays or
torch tensors in, the same kind out (:mod:`tilesim.device.backend`). The kernel
(:mod:`tilesim.device._dsa_indexer_kernel`, whose docstring has the loop nest and the
selection) writes both outputs on the inputs' device: the FP32 scores and the INT32 ids, which
stay there for the sparse-attention kernel (no device-to-host copy of an output).

Host copies per call (``validate``, :func:`tilesim.device.backend.value_checks`): the default
(``True``) copies ``seq_lens`` and ``block_table`` (``4 * B * (1 + max_blocks)`` bytes for INT32)
for their range checks, and no float data; ``"full"`` adds the scans of ``weights``,
``q_scale``, ``q`` (FP8) and every visible block of the key cache (about 550 MB at b64 over
64K); ``False`` copies nothing.

What the kernel computes, per path:

* ``"int8"`` (910B and 950), the ``int8_order="gym"`` rounding order: ``v = FP16(relu(d) *
  2^-11)`` of the exact INT32 dot, ``w = FP16(q_scale * weights)``, the head sum of ``w * v``
  in FP32 as a fixed pairwise tree (:func:`tilesim.device._dsa_indexer_kernel.head_sum`; the
  products are exact, the tree fixes every rounding), times the FP32 k scale;
* ``"fp8"`` (950 only): FP32 logits of the E4M3 codes, ``relu * weight``, the same tree, times
  the k scale read from the page (the cache is handed to the kernel twice, as 128-byte E4M3
  rows and as FP32 words of the same memory: PyPTO 0.2.0 cannot reinterpret FP8 bytes).

Compile key (one kernel per model config and build): the path, block size, ``topk``, the
cache's row count (a deployment constant: PyPTO 0.2.0's ``view`` needs static shapes) and the
block table's width padded to a power of two with ``-1`` columns (never read), so a growing context
costs one compile per doubling -- the same bucket as the sparse-attention kernel -- and the
kernel's tiling (:class:`~tilesim.shared.dsa_indexer.IndexerTiling`: ``PRODUCTION_TILING``
for every call; :func:`prepared_launch` takes another, which changes no output bit), and the
build's JIT options: the call's row groups times the table's padded columns pick one of three
builds that differ only in task merges (:func:`tilesim.shared.dsa_indexer.kernel_build`; no
output bit depends on it either), so a model configuration compiles at most three kernels,
by batch size. Batch, ``s1`` and every length are runtime values. The score buffer is that
padded width wide (prefilled with ``-inf`` on the device); the caller gets its first
``max_blocks * block_size`` columns (a view when padded).

Not supported by the kernel (``ValueError`` before launch; the golden covers them):
``q_lens`` (prefill / ragged rows), ``int8_order="pypto"``, ``topk`` not a multiple of 32,
FP8 with ``block_size`` not a multiple of 32.
"""

from __future__ import annotations

import functools

from tilesim.device import backend as _backend
from tilesim.device._lazy import require_torch
from tilesim.shared.dsa_indexer import (
    INDEX_HEADS,
    KERNEL_BUILDS,
    MAX_POSITIONS,
    PRODUCTION_TILING,
    RECORD,
    TOPK,
    Args,
    IndexerTiling,
    check_meta,
    kernel_build,
    row_groups,
)
from tilesim.shared.layouts.index_cache import FP8_BLOCK_ALIGN, INDEX_DIM
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.soc import DEFAULT_SOC, require_fp8
from tilesim.shared.validate import check_bool, check_choice, check_instance

#: ``topk`` must be a multiple of this (the top-k's 32-element sort groups; not a layout size).
#: The FP8 block size's multiple is the layout's
#: :data:`~tilesim.shared.layouts.index_cache.FP8_BLOCK_ALIGN` (pages of whole 128-byte code rows),
#: also 32
ALIGN = 32


def padded_columns(max_blocks: int, topk: int, block_size: int) -> int:
    """Block-table columns the kernel is built for: the smallest power of two holding
    ``max_blocks`` and at least ``topk`` tokens (the selection reads ``topk`` columns)."""
    need = max(int(max_blocks), -(-int(topk) // int(block_size)), 1)
    return 1 << (need - 1).bit_length()


def _check_kernel_limits(a: Args) -> None:
    """What the kernel cannot do on top of the shared checks (``ValueError``)."""
    if a.s1 is None:  # q_lens given: prefill / ragged rows
        raise ValueError(
            "q_lens: expected None (decode, s1 = T // B rows per batch) for the device kernel, "
            "got an array; prefill / ragged rows are golden-only (tilesim.reference.dsa_indexer)"
        )
    if a.path == "int8" and a.int8_order != "gym":
        raise ValueError(f"int8_order: the kernel implements 'gym' only, got {a.int8_order!r}")
    if a.topk % ALIGN:
        raise ValueError(f"topk: expected a multiple of {ALIGN} for the kernel, got {a.topk}")
    if a.path == "fp8" and a.block_size % FP8_BLOCK_ALIGN:
        raise ValueError(
            f"block_size: expected a multiple of {FP8_BLOCK_ALIGN} for the FP8 kernel (the "
            f"pages as whole {INDEX_DIM}-byte code rows), got {a.block_size}"
        )
    cols = padded_columns(a.max_blocks, a.topk, a.block_size)
    if cols * a.block_size > MAX_POSITIONS:
        raise ValueError(
            f"block_table, topk, block_size: expected the kernel's padded score width (block "
            f"table padded to {cols} columns) * block_size <= {MAX_POSITIONS} (its FP32 position "
            f"keys are exact up to there), got {cols * a.block_size}"
        )


def _kernel_inputs(a: Args, dev):
    """The kernel's input tensors (zero-copy views where possible) on ``dev``."""
    torch = require_torch()
    q, w, kc, bt, lens = _backend.to_tensors(a.q, a.weights, a.k_cache, a.block_table, a.seq_lens)
    t, bs = a.rows, a.block_size
    cols = padded_columns(a.max_blocks, a.topk, bs)
    table = torch.full((a.n_b, cols), -1, dtype=torch.int32, device=dev)
    table[:, : a.max_blocks] = bt.to(device=dev, dtype=torch.int32)
    q2 = q.contiguous().reshape(t * INDEX_HEADS, INDEX_DIM)
    w2 = w.contiguous().reshape(t * INDEX_HEADS, 1)
    if a.path == "int8":
        qs, ks = _backend.to_tensors(a.q_scale, a.k_scale)
        head = [q2, qs.contiguous().reshape(t * INDEX_HEADS, 1), w2,
                kc.contiguous().reshape(-1, INDEX_DIM), ks.contiguous()]  # fmt: skip
    else:  # the pages as INDEX_DIM-byte code rows and as FP32 words (index_page_view)
        pages = kc.contiguous()
        head = [q2, w2, pages.view(torch.float8_e4m3fn).reshape(-1, INDEX_DIM),
                pages.view(torch.float32)]  # fmt: skip
    width = cols * bs
    const = [-torch.arange(width + 1, dtype=torch.float32, device=dev)[None],
             torch.arange(a.topk, dtype=torch.float32, device=dev)[None]]  # fmt: skip
    lens32 = lens.to(device=dev, dtype=torch.int32).contiguous()
    codes = head[3] if a.path == "int8" else head[2]
    return [*head, table, lens32, *const], width, (codes.shape[0], cols)


def prepared_launch(
    q,
    weights,
    k_cache,
    block_table,
    seq_lens,
    *,
    q_scale=None,
    k_scale=None,
    q_lens=None,
    path="int8",
    int8_order="gym",
    topk=TOPK,
    block_size=DEEPSEEK_V32.block_size,
    soc=DEFAULT_SOC,
    validate=True,
    scores_only=False,
    tiling=PRODUCTION_TILING,
    build=None,
) -> dict:
    """What :func:`dsa_indexer` (``backend="sim"``) would launch for these arguments, checks
    included, without launching: ``{"kernel", "inputs", "outputs", "width", "target",
    "params", "build"}`` -- the kernel with its static parameters bound, the exact tensors
    (``outputs`` = the padded scores, the ids), the kernel's static parameters
    (:class:`~tilesim.device._dsa_indexer_kernel.IndexerParams`) and its build (one of
    :data:`~tilesim.shared.dsa_indexer.KERNEL_BUILDS`; ``build`` None: the call's,
    :func:`~tilesim.shared.dsa_indexer.kernel_build`; a name forces it). ``scores_only``: the
    same kernel without the selection (the reports' cost split). ``tiling``: an
    :class:`~tilesim.shared.dsa_indexer.IndexerTiling` (the call's is ``PRODUCTION_TILING``;
    ``SMALL_TILING`` runs the production branches at CI size; no output bit depends on it).
    Run it with ``tilesim.device.sim.run_compile(kernel, [*inputs, *outputs])`` (compile
    only), ``run_cost`` or ``run_kernel``."""
    check_bool(scores_only, "scores_only")
    check_instance(tiling, "tiling", IndexerTiling)
    if build is not None:
        check_choice(build, "build", KERNEL_BUILDS)
    _backend.validate_level(validate)
    a = check_meta(q, weights, k_cache, block_table, seq_lens, q_scale=q_scale, k_scale=k_scale,
                   q_lens=q_lens, path=path, int8_order=int8_order, topk=topk,
                   block_size=block_size)  # fmt: skip
    a, shape_only = _checked(a, validate)
    if shape_only:
        raise ValueError("dsa_indexer: shape-only inputs launch no kernel")
    return _prepare(a, _target(a, "sim", soc), select=not scores_only, tiling=tiling,
                    build=build)  # fmt: skip


def _prepare(a: Args, target, select: bool = True, tiling=PRODUCTION_TILING, build=None) -> dict:
    from tilesim.device import _dsa_indexer_kernel as kernels

    torch = require_torch()
    dev = _backend.to_tensors(a.q)[0].device
    inputs, width, static_dims = _kernel_inputs(a, dev)
    params = kernels.IndexerParams(path=a.path, block_size=a.block_size, topk=a.topk,
                                   width=width, soc=target.soc, tiling=tiling,
                                   select=select)  # fmt: skip
    if build is None:  # the call's: its row groups x the table columns it is built for
        groups = row_groups(a.n_b, a.s1)
        build = kernel_build(groups=groups, columns=static_dims[1], soc=target.soc)
    kernel = kernels.build(params, static_dims, build)
    outputs = [torch.full((a.rows, width), float("-inf"), dtype=torch.float32, device=dev),
               torch.full((a.rows, a.topk), -1, dtype=torch.int32, device=dev)]  # fmt: skip
    return {"kernel": functools.partial(kernel, params=params), "inputs": inputs,
            "outputs": outputs, "width": width, "target": target, "params": params,
            "build": build}  # fmt: skip


_NAMES = ("q", "weights", "k_cache", "block_table", "seq_lens", "q_scale", "k_scale", "q_lens")


def _checked(a: Args, validate) -> tuple[Args, bool]:
    """The shared contract's :func:`~tilesim.shared.dsa_indexer.check_meta` result ``a`` of
    the call, then the value checks ``validate`` asks for
    (:func:`tilesim.device.backend.value_checks`: by default the lengths and the block
    table, ``"full"`` also the float scans) when the inputs hold data, then the kernel's
    limits."""
    _backend.validate_level(validate)
    arrays = [(n, getattr(a, n)) for n in _NAMES if getattr(a, n) is not None]
    shape_only = _backend.is_shape_only(*(x for _, x in arrays),
                                        names=tuple(n for n, _ in arrays))  # fmt: skip
    a = _backend.value_checks(RECORD, a, validate, shape_only=shape_only)
    _check_kernel_limits(a)
    return a, shape_only


def _target(a: Args, backend: str, soc: str):
    target = _backend.resolve(backend, soc, a.q)
    if a.path == "fp8":
        require_fp8(target.soc, "path", "'fp8'", "use path='int8', or soc='950' in the simulator")
    return target


def _finish(ids, scores, us, target):
    """``(ids, scores)`` (NumPy for NumPy input), paired with ``cost_us`` on the simulator."""
    if target.numpy_io:
        from tilesim.shared.interop import to_numpy

        ids, scores = to_numpy(ids).copy(), to_numpy(scores).copy()
    return ((ids, scores), 0.0 if us is None else us) if target.sim else (ids, scores)


@_backend.graph_safe
def dsa_indexer(
    q,
    weights,
    k_cache,
    block_table,
    seq_lens,
    *,
    q_scale=None,
    k_scale=None,
    q_lens=None,
    path="int8",
    int8_order="gym",
    topk=TOPK,
    block_size=DEEPSEEK_V32.block_size,
    backend="auto",
    soc=DEFAULT_SOC,
    validate=True,
):
    """Lightning indexer on the device: ``(topk_indices, scores)``.

    Arguments as :func:`tilesim.reference.dsa_indexer` (checked by the same contract,
    :mod:`tilesim.shared.dsa_indexer`); decode only (``q_lens=None``: ``s1 = T // B`` rows per
    batch, ``1 <= s1 <= 4``), ``int8_order="gym"``. Device-only keywords: ``backend``
    (``"npu"``, ``"sim"`` or ``"auto"``, :func:`tilesim.device.backend.resolve`), ``soc``
    (the simulator's target, ``"910b"`` or ``"950"``; FP8 needs ``"950"``) and ``validate``
    (``True``, the default: host copies of ``seq_lens`` and ``block_table`` for their range
    checks, no float data read; ``"full"``: also every float scan of the golden -- finite
    weights and scales, a finite ``FP16(q_scale * weights)``, no NaN code or negative scale in
    a visible block of the cache; ``False``: metadata only. A bad value a check skipped is
    undefined behaviour: NaN scores make the top-k undefined).

    Returns INT32 ``[T, topk]`` ids (the ``min(topk, visible)`` best positions, score
    descending, equal scores lower position first, then ``-1``) and FP32 ``[T, max_blocks *
    block_size]`` scores (``-inf`` where a row sees no token), on the inputs' device; NumPy
    arrays for NumPy input; with ``backend="sim"`` the pair ``((ids, scores), cost_us)``.
    FakeTensor / ``meta`` inputs: empty outputs of those shapes, no data read, no kernel.
    Inputs are never modified.
    """
    _backend.validate_level(validate)
    a = check_meta(q, weights, k_cache, block_table, seq_lens, q_scale=q_scale, k_scale=k_scale,
                   q_lens=q_lens, path=path, int8_order=int8_order, topk=topk,
                   block_size=block_size)  # fmt: skip
    a, shape_only = _checked(a, validate)
    width = a.max_blocks * a.block_size
    if shape_only:
        torch = require_torch()
        check_choice(backend, "backend", _backend.BACKENDS)
        return (a.q.new_empty((a.rows, a.topk), dtype=torch.int32),
                a.q.new_empty((a.rows, width), dtype=torch.float32))  # fmt: skip
    target = _target(a, backend, soc)
    run = _prepare(a, target)
    scores, ids = run["outputs"]
    us = _backend.launch(run["kernel"], run["inputs"], run["outputs"], target)
    return _finish(ids, scores[:, :width], us, target)


def dsa_indexer_traffic(args: Args) -> dict:
    """HBM bytes and FLOPs of one call (the physical-limit columns of the reports): the op's
    one counter :func:`tilesim.shared.dsa_indexer.cost` (``args`` from ``check_values``)."""
    from tilesim.shared.dsa_indexer import cost

    return cost(args)


__all__ = ["ALIGN", "dsa_indexer", "dsa_indexer_traffic", "padded_columns", "prepared_launch"]
