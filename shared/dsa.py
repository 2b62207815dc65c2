"""The contract of DeepSeek-V3.2 sparse attention (op ``dsa``), shared by the golden and the
kernel wrapper: :class:`Args`, :func:`check_meta`, :func:`check_values`, :func:`host_plan`,
:func:`cost`. Everything here runs on host data and rounds nothing:

* :func:`check_meta` — shapes, dtypes and static sizes of ``sparse_attention_antiquant`` /
  ``..._kv_split`` (queries, the packed or kv_split cache, ``topk_indices``, ``block_table``,
  ``kv_act_seqs``), reading no value; returns :class:`Args`. :func:`check_values` — the
  checks that read the integer inputs (``kv_act_seqs`` bounds, every used top-k entry). Both
  twins call both, so they accept and reject the same arguments with the same messages;
  :func:`resolve_tiling` gives the tile config a call runs with, :func:`kernel_build` the
  kernel build (its JIT options) by the call's token count.
* :func:`packed_inputs`, :func:`kv_split_inputs`, :func:`model_keywords` — the two ops'
  inputs, written once: the golden's and the wrapper's written-out signatures begin with
  them (``tests/test_op_records.py``).
* :func:`host_plan` — the physical rows and stand-ins (:mod:`tilesim.shared.layouts.dsa_rows`) and
  the split (:mod:`tilesim.shared.layouts.dsa_split_rule`); the kernel's index tensor is packed from
  it by :mod:`tilesim.shared.layouts.dsa_kernel_index`.
* :func:`cost` — the one FLOP / byte counter (the golden's and the kernel's accounting), on
  :func:`attention_flop` (the matmul FLOPs of some heads over some keys, C1 + C2);
  :func:`cost_of_indices` counts a call known by its indices and lengths alone.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.layouts.dsa_rows import (
    NO_ROW,
    cur_seq_lengths,
    plan_physical_rows,
    stand_in_positions,
)
from tilesim.shared.layouts.dsa_split_rule import tiles_per_split
from tilesim.shared.layouts.mla_cache import KV_SPLIT, LAYOUTS, NOPE, NSCALES, PYPTO_ROW_BYTES, ROPE
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.registry.op_record import ROUNDS_LIKE_GOLDEN, Call, OpRecord, Output
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.validate import (
    INT32_MAX,
    check_array,
    check_bool,
    check_choice,
    check_float,
    check_instance,
    check_int,
    check_int_array,
    check_pos_int,
    check_range,
    check_trace,
    dtype_of,
    host_ints,
    require_values,
    shape_of,
)

HEAD_DIM = NOPE + ROPE  # 576
#: storage dtypes of the quantized latent, and their kernel names
QUANT_NAMES = {FP8_E4M3: "fp8", np.dtype(np.int8): "int8"}


class Args(NamedTuple):
    """The checked arguments of one sparse-attention call (:func:`check_meta`).

    ``query_nope`` / ``query_rope`` and ``caches`` are the caller's arrays or tensors (metadata
    checked, data not read). ``topk_indices``, ``block_table`` and ``kv_act_seqs`` are the
    caller's objects after :func:`check_meta` and host int64 copies after
    :func:`check_values` (``values`` tells which). ``caches``: ``(nope_cache,)`` for a packed
    ``layout`` (``"pypto"`` / ``"flashmla"``), ``(kn_quant, kr, kn_scales)`` for
    ``"kv_split"``; ``quant`` ``"fp8"`` or ``"int8"``; ``cache_rows`` its row count."""

    query_nope: object
    query_rope: object
    topk_indices: object
    block_table: object
    kv_act_seqs: object
    nq: int
    topk: int
    block_size: int
    softmax_scale: np.float32
    s1: int
    n_b: int
    rows: int
    tiling: SaTileShapeConfig
    caches: tuple = ()
    layout: str = "pypto"
    quant: str = "int8"
    cache_rows: int = 0
    values: bool = False


class HostPlan(NamedTuple):
    """The host rules of one checked call (:func:`host_plan`): ``phys`` int32 ``[T, topk]``
    physical rows (:data:`~tilesim.shared.layouts.dsa_rows.NO_ROW` for skipped ``-1`` entries and
    columns past ``cur_seq``), ``cur_seq`` int64 ``[T]``, ``skipped`` bool ``[T, topk]`` (used
    ``-1`` entries), ``stand_in`` int64 ``[B]`` positions for them (``None`` when there is
    none; see :func:`~tilesim.shared.layouts.dsa_rows.stand_in_positions`), ``tiles_per_split`` (all
    of a token's tiles when ``kv_splits = 1``)."""

    phys: np.ndarray
    cur_seq: np.ndarray
    skipped: np.ndarray
    stand_in: np.ndarray | None
    tiles_per_split: int


# ----------------------------------------------------------------------------- checks
def tiling_argument(tiling):
    """The ``tiling`` argument of a call: a ``SaTileShapeConfig`` or ``None`` (``TypeError``
    naming ``tiling`` otherwise)."""
    return check_instance(tiling, "tiling", SaTileShapeConfig, optional=True)


def resolve_tiling(tiling) -> SaTileShapeConfig:
    """The tile config the call runs with, in the golden and the kernel alike (what
    ``resolve_tiling`` means in every op: a given tiling is checked and used as it is, ``None``
    is the op's default for the call). A ``SaTileShapeConfig`` as given
    (:func:`tiling_argument`); ``None``: ``SaTileShapeConfig.from_env()``, read at the call.
    The default applies no split rule: the split is the config's ``kv_splits`` (1), and
    :func:`tilesim.shared.layouts.dsa_split_rule.split_tiling` sets it where a caller asks."""
    tiling = tiling_argument(tiling)
    return SaTileShapeConfig.from_env() if tiling is None else tiling


#: per SoC, the fewest (token, group tile) work items for which the kernel runs its
#: large-batch build (:func:`kernel_build`): the crossover measured in the cost model (decode
#: preset, 2048 keys per token: the 950 ties at 5 tokens and gains from 6, the 910B loses at 6
#: and gains from 7; docs/ops/dsa.md#kernel, "Builds by token count")
LARGE_BATCH_ITEMS = {"910b": 7, "950": 6}


#: per SoC, the fewest work items for which a call in :meth:`SaTileShapeConfig.large_batch`
#: tiles runs the large-batch build (:func:`kernel_build`; ``LARGE_BATCH_ITEMS`` is the other
#: tilings'): the crossover of the two builds measured in the cost model on those tiles (2048
#: keys per token: the 910B loses at 2 tokens and gains from 3, the 950 loses at 4 and gains
#: from 5; docs/ops/dsa.md#kernel, "The large-batch tiling")
LARGE_TILING_BUILD_ITEMS = {"910b": 3, "950": 5}


#: per SoC, the fewest (token, group tile) work items for which a call in the large-batch
#: tiling runs the many-token build (:func:`kernel_build`): the crossover measured in the cost
#: model (s1 2, 2048 keys per token: the 910B loses at 16 tokens and gains from 24, the 950
#: loses at 24 and gains from 32; docs/ops/dsa.md#kernel, "The 910B's b64 trace")
MANY_TOKENS_ITEMS = {"910b": 24, "950": 32}


def kernel_build(*, tokens: int, nq: int, tiling: SaTileShapeConfig, soc: str) -> str:
    """Which build of the device kernel a call runs on ``soc``
    (``tilesim.device._dsa_kernel.BUILDS``): for the online softmax, ``"many_tokens"`` when
    ``tiling`` is :meth:`SaTileShapeConfig.large_batch` and ``tokens * ceil(nq / g_tile)`` work
    items reach ``MANY_TOKENS_ITEMS[soc]``, else ``"large_batch"`` when they reach
    ``LARGE_TILING_BUILD_ITEMS[soc]`` (large-batch tiles) or ``LARGE_BATCH_ITEMS[soc]`` (any
    other online tiling), else ``"seeds"``. The builds differ only in JIT options that
    merge tasks and (many-token) in C1's N tiles, neither of which moves a K step (same
    arithmetic, same bits), so the golden needs no counterpart. The one rule, read by the
    wrapper."""
    check_choice(soc, "soc", tuple(LARGE_BATCH_ITEMS))
    items = check_pos_int(tokens, "tokens") * -(-check_pos_int(nq, "nq") // tiling.g_tile)
    big = tiling == SaTileShapeConfig.large_batch()
    least = (LARGE_TILING_BUILD_ITEMS if big else LARGE_BATCH_ITEMS)[soc]
    if tiling.softmax != "online" or items < least:
        return "seeds"
    return "many_tokens" if big and items >= MANY_TOKENS_ITEMS[soc] else "large_batch"


def build_tiling(tiling: SaTileShapeConfig, build: str) -> SaTileShapeConfig:
    """The tiles the device kernel compiles for a call in ``tiling`` with ``build`` (a name
    :func:`kernel_build` returns): ``tiling``, except that the many-token build runs C1 on N
    tiles of twice the keys with half the L0 K depth (``kL0 / 2``, ``nL0 * 2``, ``nL1 * 2``:
    the large-batch tiling's ``(128, 128, 256, 512, 128, 128)`` becomes ``(128, 128, 128, 512,
    256, 256)``). The L0B tile keeps its size (``kL0 * nL0``); the merged C1 task copies a
    token's keys in half as many, twice as large GM tiles and writes S in half as many copies,
    and a V0 task feeds one wider C1 tile. ``kL1`` -- the K steps, which set the bits -- is
    kept: the same outputs, so the golden needs no counterpart (docs/ops/dsa.md#kernel, "The
    910B's b64 trace", item 6)."""
    if build != "many_tokens":
        return tiling
    m0, m1, k0, k1, n0, n1 = tiling.c1_tile
    return tiling.replace(c1_tile=(m0, m1, k0 // 2, k1, 2 * n0, 2 * n1))


#: per SoC, the fewest (token, group tile) work items for which the device wrapper runs the
#: ``decode`` preset's calls with :meth:`SaTileShapeConfig.large_batch` tiles
#: (:func:`kernel_tiling`). The cost model's crossover (2048 keys per token, each tiling with
#: the build the wrapper picks) lies at 1 token on the 910B and 3 on the 950; the threshold is
#: 5 on both so that calls of up to 4 tokens -- the CI cases and kernel digests of the decode
#: preset (b2 s1 / s2) and the layer step's CI call -- keep the decode tiles and their bits
#: (docs/ops/dsa.md#kernel, "The large-batch tiling")
LARGE_TILING_ITEMS = {"910b": 5, "950": 5}


def kernel_tiling(*, tokens: int, nq: int, tiling: SaTileShapeConfig, soc: str):
    """The tile config the device kernel runs a call with on ``soc``:
    :meth:`SaTileShapeConfig.large_batch` in place of ``tiling`` when ``tiling`` is the
    ``decode`` preset and ``tokens * ceil(nq / g_tile)`` work items reach
    ``LARGE_TILING_ITEMS[soc]``, else ``tiling`` itself. The large-batch tiling moves bits (its
    K steps and KV tiles), so such a call's golden twin is the reference with the returned
    tiling and ``accumulation="k_steps"`` (:func:`golden_keywords`). The one rule, read by the
    wrapper (then :func:`kernel_build` picks the JIT options for the returned tiling)."""
    check_choice(soc, "soc", tuple(LARGE_TILING_ITEMS))
    items = check_pos_int(tokens, "tokens") * -(-check_pos_int(nq, "nq") // tiling.g_tile)
    if tiling != SaTileShapeConfig.decode() or items < LARGE_TILING_ITEMS[soc]:
        return tiling
    return SaTileShapeConfig.large_batch()


def golden_keywords(*, tokens: int, nq: int, tiling: SaTileShapeConfig, soc: str) -> dict:
    """The reference's keywords that reproduce the device wrapper's call on ``soc`` (its
    :func:`kernel_tiling`): ``{"tiling": ..}``, plus ``accumulation="k_steps"`` for the
    large-batch tiling, whose kernel the golden models step for step."""
    run = kernel_tiling(tokens=tokens, nq=nq, tiling=tiling, soc=soc)
    if run == SaTileShapeConfig.large_batch():
        return {"tiling": run, "accumulation": "k_steps"}
    return {"tiling": run}


def _check_queries(query_nope, query_rope) -> int:
    check_array(query_nope, "query_nope", dtype=BF16, ndim=2, layout="[T*nq, 512]")
    rows = shape_of(query_nope, "query_nope")[0]
    check_array(query_rope, "query_rope", dtype=BF16)
    check_array(query_nope, "query_nope", shape=(rows, NOPE), layout="[T*nq, 512]")
    check_array(query_rope, "query_rope", shape=(rows, ROPE), layout="[T*nq, 64]")
    return rows


def _check_scalars(nq, n_kv, softmax_scale, topk, block_size, tiling, trace, progress):
    """``(nq, topk, block_size, scale, tiling)`` checked (no array involved)."""
    nq = check_pos_int(nq, "nq")
    if check_pos_int(n_kv, "n_kv") != 1:
        raise ValueError(
            f"n_kv: expected 1 (the latent cache holds one KV head per row, as in DeepSeek-V3.2 "
            f"MQA; the seeds' kernels only index correctly for n_kv = 1), got {n_kv}"
        )
    topk = check_pos_int(topk, "topk")
    block_size = check_int(block_size, "block_size", lo=1, hi=INT32_MAX)
    scale = np.float32(check_float(softmax_scale, "softmax_scale", positive=True, fp32=True))
    cfg = resolve_tiling(tiling)
    if cfg.kv_splits > 1 and cfg.softmax != "online":
        raise ValueError(
            f"tiling.kv_splits: expected 1 with softmax 'per_tile' (split-KV combines "
            f"unnormalised online states), got {cfg.kv_splits}"
        )
    check_trace(trace)
    if progress is not None:
        check_bool(progress, "progress")
    return nq, topk, block_size, scale, cfg


def _check_int_shapes(rows, topk_indices, block_table, kv_act_seqs, *, nq, topk):
    """``(n_b, s1)`` from the integer inputs' shapes (metadata only)."""
    n_b = check_int_array(kv_act_seqs, "kv_act_seqs", ndim=1, layout="[B]")[0]
    if n_b == 0:
        raise ValueError("kv_act_seqs: expected at least one batch, got shape (0,)")
    if rows == 0 or rows % (n_b * nq):
        raise ValueError(
            f"query_nope: expected rows = B*s1*nq > 0 with B = len(kv_act_seqs) = {n_b} and "
            f"nq = {nq}, got {rows} rows"
        )
    s1 = rows // (n_b * nq)
    check_int_array(topk_indices, "topk_indices", shape=(n_b * s1, topk), layout="[T, n_kv*topk]")
    bt = check_int_array(block_table, "block_table", ndim=2, layout="[B, max_blocks]")
    if bt[0] != n_b:
        raise ValueError(
            f"block_table: expected shape ({n_b}, *) (B = len(kv_act_seqs) = {n_b}; "
            f"kv_act_seqs and block_table hold one entry / row per batch), got {bt}"
        )
    return n_b, s1


def check_meta(
    query_nope,
    query_rope,
    caches: tuple,
    topk_indices,
    block_table,
    kv_act_seqs,
    *,
    layout: str,
    nq,
    n_kv,
    softmax_scale,
    topk,
    block_size,
    tiling=None,
    trace=None,
    progress=None,
) -> Args:
    """Shapes, dtypes and static sizes of one call, before any work; reads no value (so it
    runs as it is on FakeTensor / ``meta`` tensors and for ``validate=False``).

    ``caches``: ``(nope_cache,)`` with ``layout`` ``"pypto"`` / ``"flashmla"``, or
    ``(kn_quant, kr, kn_scales)`` with ``layout="kv_split"``. Raises ``ValueError`` /
    ``TypeError`` naming the argument. Returns :class:`Args` (``values=False``)."""
    nq, topk, block_size, scale, cfg = _check_scalars(
        nq, n_kv, softmax_scale, topk, block_size, tiling, trace, progress
    )
    rows = _check_queries(query_nope, query_rope)
    n_b, s1 = _check_int_shapes(rows, topk_indices, block_table, kv_act_seqs, nq=nq, topk=topk)
    if layout == KV_SPLIT and len(caches) == 1:  # a packed op called with the split layout
        raise ValueError(f"layout: expected one of {LAYOUTS} for the packed nope_cache (the "
                         f"kv_split caches have their own op), got {layout!r}")  # fmt: skip
    if layout == KV_SPLIT:
        cache_rows, quant = check_split_cache(*caches)
    else:
        cache_rows, quant = check_packed_cache(caches[0], layout)
    return Args(
        query_nope, query_rope, topk_indices, block_table, kv_act_seqs, nq, topk, block_size,
        scale, s1, n_b, rows, cfg, tuple(caches), layout, quant, cache_rows, False,
    )  # fmt: skip


# the inputs of the two ops, written once: the golden and the wrapper write the same parameters
# out (tests/test_op_records.py holds them equal)
def packed_inputs(query_nope, query_rope, nope_cache, topk_indices, block_table, kv_act_seqs):
    """The arrays of ``sparse_attention_antiquant`` (golden and kernel), in order: BF16
    ``query_nope [T*nq, 512]`` and ``query_rope [T*nq, 64]``; the packed FP8 E4M3 / INT8
    ``nope_cache [rows, 656]``; int ``topk_indices [T, n_kv*topk]`` (``-1`` = skipped),
    ``block_table [B, max_blocks]``, ``kv_act_seqs [B]``."""


def kv_split_inputs(
    query_nope, query_rope, kn_quant, kr, kn_scales, topk_indices, block_table, kv_act_seqs
):
    """The arrays of ``sparse_attention_antiquant_kv_split``: as :func:`packed_inputs` with
    the kv_split cache ``kn_quant [rows, 512]`` FP8 E4M3 / INT8, ``kr [rows, 64]`` BF16,
    ``kn_scales [rows, 4]`` FP32 in place of ``nope_cache``."""


def model_keywords(
    *,
    nq: int = DEEPSEEK_V32.num_q_heads,
    n_kv: int = DEEPSEEK_V32.num_kv_heads,
    softmax_scale: float,
    topk: int = DEEPSEEK_V32.topk,
    block_size: int = DEEPSEEK_V32.block_size,
    tiling: SaTileShapeConfig | None = None,
):
    """The sizes both ops take after their arrays (DeepSeek-V3.2's by default): query heads
    ``nq``, KV heads ``n_kv`` (must be 1), ``softmax_scale``, ``topk`` entries per token, the
    cache's ``block_size``, and the tile config (``None``: :func:`resolve_tiling`)."""


def check_int_values(args: Args) -> Args:
    """The checks that read the integer inputs (host int64 copies, returned in the
    :class:`Args`, ``values=True``): ``kv_act_seqs`` in ``[0, max_blocks * block_size]``
    and every used top-k entry (:func:`~tilesim.shared.layouts.dsa_rows.plan_physical_rows`: ``-1``
    or a position inside the sequence, an allocated block, a row inside the cache).
    ``ValueError`` naming the entry."""
    acts = host_ints(args.kv_act_seqs, "kv_act_seqs", ndim=1, layout="[B]")
    check_range(acts, "kv_act_seqs", lo=0)
    ti = host_ints(args.topk_indices, "topk_indices", ndim=2, layout="[T, n_kv*topk]")
    bt = host_ints(args.block_table, "block_table", ndim=2, layout="[B, max_blocks]")
    _check_capacity(acts, bt.shape[1], args.block_size, args.cache_rows)
    checked = args._replace(topk_indices=ti, block_table=bt, kv_act_seqs=acts, values=True)
    _physical_rows(checked)
    return checked


def check_values(args: Args) -> Args:
    """Every value check of the op (the golden runs them all): :func:`check_int_values`; the op
    scans no bulk data."""
    return check_int_values(args)


def _check_capacity(acts: np.ndarray, max_blocks: int, block_size: int, cache_rows: int) -> None:
    """Every ``kv_act_seqs[b] <= max_blocks * block_size``: a length past the block table's
    capacity would address keys no block holds (and wrap in the kernel's INT32 arithmetic).
    The ``ValueError`` names where the bound comes from (the table's width and
    ``block_size``) and the cache's row count, since a ``block_size`` that does not match the
    cache's layout is the usual cause."""
    cap = max_blocks * block_size
    bad = np.flatnonzero(acts > cap)
    if bad.size:
        b = int(bad[0])
        fit = "" if cache_rows % block_size == 0 else ", not a multiple of block_size"
        raise ValueError(
            f"kv_act_seqs[{b}]: expected a value in [0, {cap}] (block_table width {max_blocks} "
            f"blocks * block_size {block_size}; the cache holds {cache_rows} rows{fit}: check "
            f"block_size against the cache's block layout), got {int(acts[b])}"
        )


def _physical_rows(a: Args) -> tuple[np.ndarray, np.ndarray]:
    return plan_physical_rows(
        a.topk_indices, a.block_table, a.kv_act_seqs,
        s1=a.s1, topk=a.topk, block_size=a.block_size, cache_rows=a.cache_rows,
    )  # fmt: skip


def host_plan(args: Args) -> HostPlan:
    """The host rules of a checked call (:func:`check_values` first): the physical rows
    (:func:`~tilesim.shared.layouts.dsa_rows.plan_physical_rows`), the used ``-1`` entries and their
    stand-in positions (:func:`~tilesim.shared.layouts.dsa_rows.stand_in_positions`, only when there
    is one), and the split (:func:`~tilesim.shared.layouts.dsa_split_rule.tiles_per_split` of
    ``args.tiling``). NumPy; the kernel's index tensor is packed from it by
    :func:`tilesim.shared.layouts.dsa_kernel_index.kernel_indices` (its torch twin for
    ``validate=False``: :func:`~tilesim.shared.layouts.dsa_kernel_index.kernel_indices_torch`)."""
    require_values(args, Args, "host_plan")
    phys, cur = _physical_rows(args)
    skipped = (np.arange(args.topk)[None, :] < cur[:, None]) & (phys == NO_ROW)
    stand_in = None
    if skipped.any():
        stand_in = stand_in_positions(
            skipped, args.block_table,
            s1=args.s1, block_size=args.block_size, cache_rows=args.cache_rows,
        )  # fmt: skip
    cfg = args.tiling
    tps = tiles_per_split(args.topk, cfg.s_kv_tile, cfg.kv_splits)
    return HostPlan(phys, cur, skipped, stand_in, tps)


def check_packed_cache(nope_cache, layout) -> tuple[int, str]:
    """``(rows, quant)`` of a packed ``[rows, 656]`` FP8 E4M3 / INT8 cache in ``layout``."""
    check_choice(layout, "layout", LAYOUTS)
    check_array(nope_cache, "nope_cache", dtype=tuple(QUANT_NAMES), ndim=2, layout="[rows, 656]")
    shp = check_array(
        nope_cache, "nope_cache", shape=(None, PYPTO_ROW_BYTES), layout="[rows, 656]"
    ).shape
    return int(shp[0]), QUANT_NAMES[dtype_of(nope_cache, "nope_cache")]


def check_split_cache(kn_quant, kr, kn_scales) -> tuple[int, str]:
    """``(rows, quant)`` of the kv_split triple ``kn_quant [rows, 512]`` FP8 E4M3 / INT8,
    ``kr [rows, 64]`` BF16, ``kn_scales [rows, 4]`` FP32."""
    check_array(kn_quant, "kn_quant", dtype=tuple(QUANT_NAMES), ndim=2, layout="[rows, 512]")
    rows = shape_of(kn_quant, "kn_quant")[0]
    check_array(kn_quant, "kn_quant", shape=(rows, NOPE), layout="[rows, 512]")
    check_array(kr, "kr", dtype=BF16, shape=(rows, ROPE), layout="[rows, 64]")
    check_array(kn_scales, "kn_scales", dtype=np.float32, shape=(rows, NSCALES), layout="[rows, 4]")
    return rows, QUANT_NAMES[dtype_of(kn_quant, "kn_quant")]


def attention_flop(heads: int, keys: int) -> int:
    """Matmul FLOPs of ``heads`` query heads over ``keys`` keys: ``2 * heads * keys * (576 +
    512)`` (C1 ``Q K^T`` over 576 columns, C2 ``P V`` over 512; 2 per multiply-add)."""
    return 2 * int(heads) * int(keys) * (HEAD_DIM + NOPE)


def cost(args: Args) -> dict:
    """The one FLOP / byte counter of the op (reads ``topk_indices`` and ``kv_act_seqs``).

    FlashMLA's accounting (``docs/sources.md``), with ``attended`` = the used entries that are
    not ``-1``: ``flop = attention_flop(nq, attended)`` (the sum of the golden's trace
    records' ``flop``), ``bytes`` = Q (BF16 576 per head) + ``attended`` gathered rows x 656 +
    O (BF16 512 per head); ``unique_kv_bytes`` counts each (batch, position) once. The
    kernel's traffic (``g_tile = args.tiling.g_tile``, ``nq / g_tile`` group tiles, each
    gathering all ``keys`` = ``sum(cur_seq)`` used entries, masked ``-1`` ones included):
    ``kernel_flop = (nq / g_tile) * attention_flop(g_tile, keys)`` and ``kernel_bytes`` = Q
    + O + ``(nq / g_tile) * keys`` x (656 + 4: the row and its INT32 index)."""
    ti = host_ints(args.topk_indices, "topk_indices", ndim=2)
    acts = host_ints(args.kv_act_seqs, "kv_act_seqs", ndim=1)
    n_t, nq, topk, s1 = ti.shape[0], args.nq, args.topk, args.s1
    cur = cur_seq_lengths(acts, s1, topk)
    live = (np.arange(topk)[None, :] < cur[:, None]) & (ti[:, :topk] != -1)
    attended, keys = int(live.sum()), int(cur.sum())
    unique = 0
    for b in range(acts.shape[0]):
        rows = slice(b * s1, (b + 1) * s1)
        unique += int(np.unique(ti[rows, :topk][live[rows]]).size)
    qo_bytes = n_t * nq * (HEAD_DIM + NOPE) * 2
    g_tile = args.tiling.g_tile
    g_loops = nq // g_tile
    return {
        "flop": attention_flop(nq, attended),
        "bytes": qo_bytes + attended * PYPTO_ROW_BYTES,
        "attended": attended,
        "unique_kv_bytes": qo_bytes + unique * PYPTO_ROW_BYTES,
        "keys": keys,
        "kernel_flop": g_loops * attention_flop(g_tile, keys),
        "kernel_bytes": g_loops
        * (n_t * g_tile * (HEAD_DIM + NOPE) * 2 + keys * (PYPTO_ROW_BYTES + 4)),  # fmt: skip
    }


def cost_of_indices(topk_indices, kv_act_seqs, *, nq: int, topk: int, s1: int | None = None,
                    g_tile: int | None = None) -> dict:  # fmt: skip
    """:func:`cost` of a call known by its top-k indices and lengths alone (no queries or
    cache; the integers are checked for their kind and rank only): ``s1`` defaults to
    ``len(topk_indices) // len(kv_act_seqs)``, ``g_tile`` to ``nq`` (one group tile)."""
    nq, topk = check_pos_int(nq, "nq"), check_pos_int(topk, "topk")
    ti = host_ints(topk_indices, "topk_indices", ndim=2)
    acts = host_ints(kv_act_seqs, "kv_act_seqs", ndim=1)
    s1 = ti.shape[0] // max(acts.shape[0], 1) if s1 is None else check_pos_int(s1, "s1")
    g = nq if g_tile is None else check_pos_int(g_tile, "g_tile")
    cfg = SaTileShapeConfig.decode().replace(g_tile=g)
    args = Args(None, None, ti, None, acts, nq, topk, 1, np.float32(1), s1, acts.shape[0],
                ti.shape[0] * nq, cfg, values=True)  # fmt: skip
    return cost(args)


# ----------------------------------------------------------------------------- record
#: the one output of both calls
_OUT = (Output("out", "float", ("token", "head")),)
#: the op's record in the registry of ops (:mod:`tilesim.shared.registry.ops`)
RECORD = OpRecord(
    name="dsa",
    calls=(
        Call("sparse_attention_antiquant", "dsa", _OUT, signature=(packed_inputs, model_keywords),
             judge_kind="dsa", device=True, l2_units=1.4),
        Call("sparse_attention_antiquant_kv_split", "dsa", _OUT,
             signature=(kv_split_inputs, model_keywords), judge_kind="dsa", device=True,
             l2_units=1.4),
    ),
    cost=cost,
    int_checks=check_int_values,
    names={"DSA_CASES": "cases.dsa"},
    # per-tile softmax over several KV tiles rounds each tile's output to BF16 before the merge
    # and the merged output again: one more row ULP (docs/ops/dsa.md, "Budget")
    budgets={**ROUNDS_LIKE_GOLDEN, "row_ulp_per_tile": 2.0},
)  # fmt: skip


__all__ = [
    "LARGE_BATCH_ITEMS",
    "LARGE_TILING_BUILD_ITEMS",
    "LARGE_TILING_ITEMS",
    "MANY_TOKENS_ITEMS",
    "RECORD",
    "Args",
    "HEAD_DIM",
    "HostPlan",
    "QUANT_NAMES",
    "attention_flop",
    "check_meta",
    "check_packed_cache",
    "check_split_cache",
    "check_values",
    "check_int_values",
    "cost",
    "cost_of_indices",
    "host_plan",
    "golden_keywords",
    "build_tiling",
    "kernel_build",
    "kernel_tiling",
    "kv_split_inputs",
    "model_keywords",
    "packed_inputs",
    "resolve_tiling",
    "tiling_argument",
]
