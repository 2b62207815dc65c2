"""The contract of the DeepSeek-V3.2 lightning indexer (op ``dsa_indexer``), written once for
the golden (:mod:`tilesim.reference.dsa_indexer`) and the device wrapper.

NumPy on host data; rounds nothing (``docs/ops/dsa_indexer.md``):

* :class:`Args`, :func:`check_meta` (dtypes, shapes, static sizes, the path switches, the
  outputs' sizes against :data:`MAX_POSITIONS` and ``MAX_ELEMENTS``; no value read),
  :func:`check_values` = :func:`check_int_values` (host copies of the lengths and the block
  table, every visible block's table entry: the device wrapper's default) then
  :func:`check_data_values` (finite non-negative scales, finite weights and a finite INT8
  factor ``FP16(q_scale * weights)``, and among the tokens that are read finite
  non-negative k scales and no FP8 NaN code: the wrapper's ``validate="full"``);
* :func:`host_plan`: per query row its batch, its visible length and its ``k``;
* :func:`cost`: the op's one FLOP / byte counter;
* :func:`select_topk`: the one top-k rule (NumPy): score descending, exactly equal scores ->
  the lower position first, ``-1`` in the unused slots;
* :class:`IndexerTiling`: the kernel's widths (``PRODUCTION_TILING``, ``SMALL_TILING``), and
  :func:`kernel_build`: which of its builds a call runs; no output bit depends on either.

Rows are batch-major: batch ``b`` owns ``q_lens[b]`` consecutive query rows (decode,
``q_lens=None``: ``s1 = T // B`` rows each, ``1 <= s1 <= 4``). Row ``r`` (0-based inside its
batch) sees the positions ``0 .. seq_lens[b] - q_lens[b] + r``, i.e. ``visible = seq_lens[b] -
(q_lens[b] - 1 - r)`` tokens (the MTP / causal offset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import FP8_E4M3
from tilesim.shared.layouts.index_cache import (
    FP8_SCALE_BYTES,
    INDEX_DIM,
    check_fp8_cache,
    check_int8_cache,
    fp8_page_views,
)
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.ranking import NO_ID, top_k
from tilesim.shared.registry.op_record import Call, OpRecord, Output
from tilesim.shared.tiling import normalize_unroll
from tilesim.shared.validate import (
    INT32_MAX,
    check_array,
    check_bool,
    check_choice,
    check_elements,
    check_finite,
    check_int,
    check_int_array,
    check_int_sequence,
    check_trace,
    e4m3_nan_codes,
    host_array,
    host_ints,
    require_values,
    shape_of,
)

INDEX_HEADS = 64  #: index-query heads (DeepSeek-V3.2 ``index_n_heads``)
TOPK = DEEPSEEK_V32.topk  #: DeepSeek-V3.2 ``index_topk`` (2048)
PATHS = ("int8", "fp8")
INT8_ORDERS = ("gym", "pypto")
MAX_DECODE_S1 = 4  #: decode query rows per batch (pypto-gym's kernel buffer)
#: the INT8 path's per-head scale before the FP16 rounding (keeps it below FP16's range)
INT8_QK_SCALE = 2.0**-11
#: the most positions a score row may hold and the largest ``topk``: ``2**24``, the integers
#: FP32 holds exactly -- the kernel orders equal scores by FP32 position keys -- and 100x
#: DeepSeek-V3.2's 160K context. Checked with :data:`~tilesim.shared.validate.MAX_ELEMENTS`
#: on the two outputs before any allocation.
MAX_POSITIONS = 2**24


#: the kernel's tile widths are powers of two of at least this many elements (the top-k's
#: 32-element sort groups)
TILE_ALIGN = 32


@dataclass(frozen=True)
class IndexerTiling:
    """How the indexer kernel (``device/_dsa_indexer_kernel.py``) cuts its selection and its
    score stage; part of the kernel's compile key. No output bit depends on it, so the golden
    does not read it: each span's top-k and the merge of the spans' candidates are exact for
    any span width, the head sum is a per-column tree and a tile's width rounds nothing
    (docs/ops/dsa_indexer.md, "Kernel"). ``TypeError`` / ``ValueError`` naming the field.

    * ``span_ratio``: columns of a selection span in units of ``topk`` (the kernel's
      ``span_count``: 16K at topk 2048, 4 spans over 64K, whose merge reads 8K candidates);
    * ``topk_tile``: the widest vector tile of a top-k input (a span's 16K scores in two);
    * ``vec_cols``: columns of one score slab (one V1 vector subgraph per row);
    * ``cumsum_tile``: the vector tile of the order's dense-rank cumsum (two at topk 2048);
    * ``chunk_steps``: the block loop's unroll factors below a whole span (each divides the
      one before: ``pypto.loop_unroll``'s rule).

    The three widths are powers of two, at least :data:`TILE_ALIGN`."""

    span_ratio: int = 8
    topk_tile: int = 8192
    vec_cols: int = 1024
    cumsum_tile: int = 1024
    chunk_steps: tuple = (32, 8, 1)

    def __post_init__(self) -> None:
        check_int(self.span_ratio, "IndexerTiling.span_ratio", lo=1, hi=MAX_POSITIONS)
        for name in ("topk_tile", "vec_cols", "cumsum_tile"):
            v = check_int(getattr(self, name), f"IndexerTiling.{name}", lo=1, hi=MAX_POSITIONS)
            if v < TILE_ALIGN or v & (v - 1):
                raise ValueError(f"IndexerTiling.{name}: expected a power of two >= "
                                 f"{TILE_ALIGN}, got {v}")  # fmt: skip
        check_int_sequence(self.chunk_steps, "IndexerTiling.chunk_steps", lo=1, hi=INT32_MAX)
        steps = normalize_unroll(self.chunk_steps)
        for big, small in zip(steps[:-1], steps[1:], strict=True):
            if big % small:
                raise ValueError(f"IndexerTiling.chunk_steps: expected each factor to divide "
                                 f"the one before, got {steps}")  # fmt: skip
        object.__setattr__(self, "chunk_steps", steps)


#: the tiling every call uses (DeepSeek-V3.2 decode at topk 2048: 16K-column spans, each
#: span's top-k over two 8K tiles, one 8K-candidate merge over 64K, 16 slabs per span chunk)
PRODUCTION_TILING = IndexerTiling()
#: the production tiling at 1/16 scale, for simulator cases at CI size: at topk 128 over 4K
#: columns (64-token blocks) it cuts the row as the production tiling cuts 64K at topk 2048 --
#: 4 spans of 8 * topk columns, each span's top-k over two tiles, one merge of exactly one
#: top-k tile of candidates, 16 slabs per span chunk, two cumsum tiles, a span then 3 smaller
#: unroll factors (tests/device/test_dsa_indexer_sim.py compares the two)
SMALL_TILING = IndexerTiling(span_ratio=8, topk_tile=512, vec_cols=64, cumsum_tile=64,
                             chunk_steps=(8, 2, 1))  # fmt: skip


#: the device kernel's builds, for calls of few row groups to many (:func:`kernel_build`). They
#: differ only in two task merges of the JIT -- how many blocks' C1 matmuls one cube task
#: holds (the L1 reuse) and how many V1 slabs one vector task holds (the vector n-buffer
#: merge) -- and run the same operations on the same tiles, so no output bit depends on the
#: build (``device/_dsa_indexer_kernel.py``, ``BUILD_MERGES``)
KERNEL_BUILDS = ("few_groups", "some_groups", "many_groups")

#: per SoC, the most block visits (:func:`kernel_build`) of a call that runs the
#: ``few_groups`` build, and of one that runs ``some_groups``: the cost model's crossovers
#: at s1 2 over 64K, topk 2048 (a row group visits the table's 512 columns of 128-token
#: blocks; docs/ops/dsa_indexer.md, "Builds by row groups")
FEW_GROUPS_VISITS = {"910b": 512, "950": 512}
SOME_GROUPS_VISITS = {"910b": 1536, "950": 2560}


def row_groups(batch: int, s1: int) -> int:
    """The kernel's row groups of a decode call: per batch ``s1 // 2`` pairs of rows and, for
    an odd ``s1``, its last row alone (the kernel's loop nest)."""
    return check_int(batch, "batch", lo=1) * -(-check_int(s1, "s1", lo=1) // 2)


def kernel_build(*, groups: int, columns: int, soc: str) -> str:
    """The build (:data:`KERNEL_BUILDS`) the device kernel runs a call with on ``soc``: by its
    block visits, ``groups`` (:func:`row_groups`) x ``columns`` (the block-table columns the
    kernel is built for: static per compile, so the choice reads no length), ``few_groups``
    up to ``FEW_GROUPS_VISITS[soc]``, ``some_groups`` up to ``SOME_GROUPS_VISITS[soc]``, else
    ``many_groups``. Fewer visits leave the cube and vector cores more idle between a few
    large tasks, so the smaller builds pack fewer blocks and slabs into a task. The one rule,
    read by the wrapper."""
    check_choice(soc, "soc", tuple(FEW_GROUPS_VISITS))
    visits = check_int(groups, "groups", lo=1) * check_int(columns, "columns", lo=1)
    if visits <= FEW_GROUPS_VISITS[soc]:
        return "few_groups"
    return "some_groups" if visits <= SOME_GROUPS_VISITS[soc] else "many_groups"


class Args(NamedTuple):
    """The checked arguments of one indexer call (:func:`check_meta`; after
    :func:`check_values` ``block_table``, ``seq_lens`` and ``q_lens`` are host int64 copies,
    ``q_lens`` resolved for decode, and ``values`` is True)."""

    q: object
    weights: object
    k_cache: object
    block_table: object
    seq_lens: object
    q_scale: object
    k_scale: object
    q_lens: object
    path: str
    int8_order: str
    topk: int
    block_size: int
    n_b: int
    rows: int
    max_blocks: int
    num_blocks: int
    s1: int | None  #: decode rows per batch, None for ``q_lens`` (prefill / ragged)
    values: bool = False


class Plan(NamedTuple):
    """The host rules of a checked call (:func:`host_plan`), all int64."""

    row_batch: np.ndarray  #: ``[T]`` batch of each query row
    row_start: np.ndarray  #: ``[B + 1]`` first row of each batch (and ``T``)
    visible: np.ndarray  #: ``[T]`` visible tokens of each row
    k: np.ndarray  #: ``[T]`` ids each row returns, ``min(topk, visible)``
    blocks: np.ndarray  #: ``[B]`` blocks read per batch, ``ceil(seq_lens / block_size)``
    width: int  #: columns of the score output, ``max_blocks * block_size``


# ----------------------------------------------------------------------------- meta checks
def _check_queries(q, weights, path: str) -> int:
    qdt = np.int8 if path == "int8" else FP8_E4M3
    check_array(q, "q", dtype=qdt, ndim=3, layout="[T, 64, 128]")
    rows = shape_of(q, "q")[0]
    if rows == 0:
        raise ValueError("q: expected at least one query row, got shape (0, 64, 128)")
    check_array(q, "q", shape=(rows, INDEX_HEADS, INDEX_DIM), layout="[T, 64, 128]")
    wdt = np.float16 if path == "int8" else np.float32
    check_array(weights, "weights", dtype=wdt, shape=(rows, INDEX_HEADS), layout="[T, 64]")
    return rows


def _check_scales(q_scale, k_scale, k_cache, path: str, rows: int, block_size: int) -> int:
    """The path's scale arguments and cache; returns ``num_blocks``."""
    if path == "fp8":
        for name, v in (("q_scale", q_scale), ("k_scale", k_scale)):
            if v is not None:
                raise ValueError(
                    f"{name}: expected None for path='fp8' (the q scale is folded into the FP32 "
                    f"weights, the k scales sit inside the paged cache), got {type(v).__name__}"
                )
        return check_fp8_cache(k_cache, block_size=block_size)[0]
    for name, v in (("q_scale", q_scale), ("k_scale", k_scale)):
        if v is None:
            raise TypeError(f"{name}: expected a float16 array for path='int8', got None")
    check_array(q_scale, "q_scale", dtype=np.float16, shape=(rows, INDEX_HEADS), layout="[T, 64]")
    return check_int8_cache(k_cache, k_scale, block_size=block_size)[0]


def _check_lengths(block_table, seq_lens, q_lens, rows: int) -> tuple[int, int, int | None]:
    """``(B, max_blocks, s1)`` from the integer inputs' shapes (``s1`` None with q_lens)."""
    n_b = check_int_array(seq_lens, "seq_lens", ndim=1, layout="[B]")[0]
    if n_b == 0:
        raise ValueError("seq_lens: expected at least one batch, got shape (0,)")
    bt = check_int_array(block_table, "block_table", ndim=2, layout="[B, max_blocks]")
    if bt[0] != n_b:
        raise ValueError(f"block_table: expected shape ({n_b}, *) (B = len(seq_lens)), got {bt}")
    if q_lens is not None:
        if check_int_array(q_lens, "q_lens", ndim=1, layout="[B]")[0] != n_b:
            raise ValueError(f"q_lens: expected shape ({n_b},), got {shape_of(q_lens, 'q_lens')}")
        return n_b, bt[1], None
    s1, rem = divmod(rows, n_b)
    if rem or not 1 <= s1 <= MAX_DECODE_S1:
        raise ValueError(
            f"q: expected T = B*s1 rows with 1 <= s1 <= {MAX_DECODE_S1} for decode (q_lens=None,"
            f" B = {n_b}), got T = {rows}; pass q_lens for prefill / ragged rows"
        )
    return n_b, bt[1], s1


def _check_output_sizes(rows: int, topk: int, max_blocks: int, block_size: int) -> None:
    """The two outputs, ``[T, max_blocks * block_size]`` FP32 scores and ``[T, topk]`` INT32
    ids, bounded before any allocation (``ValueError`` naming the arguments that size them)."""
    width = max_blocks * block_size
    if width > MAX_POSITIONS:
        raise ValueError(
            f"block_table, block_size: expected max_blocks * block_size <= {MAX_POSITIONS} score "
            f"columns (MAX_POSITIONS; the table's width sizes the [T, S] scores even where no "
            f"token is read), got {max_blocks} * {block_size} = {width}"
        )
    check_elements((rows, width), "q, block_table, block_size", "the [T, S] scores")
    check_elements((rows, topk), "q, topk", "the [T, topk] ids")


# ----------------------------------------------------------------------------- signature
def indexer_inputs(q, weights, k_cache, block_table, seq_lens, *, q_scale=None, k_scale=None,
                   q_lens=None, path="int8", int8_order="gym", topk=TOPK,
                   block_size=DEEPSEEK_V32.block_size):  # fmt: skip
    """The arguments of ``dsa_indexer`` that the golden, the kernel wrapper and
    :func:`check_meta` share, written once: each writes them out in this order
    (``tests/test_op_records.py`` holds them equal)."""


def check_meta(q, weights, k_cache, block_table, seq_lens, *, q_scale=None, k_scale=None,
               q_lens=None, path="int8", int8_order="gym", topk=TOPK,
               block_size=DEEPSEEK_V32.block_size, trace=None, progress=None) -> Args:  # fmt: skip
    """Metadata checks of ``dsa_indexer`` (no value read; works on ``meta`` tensors), on the
    arguments of :func:`indexer_inputs` and the golden's ``trace`` / ``progress``.

    INT8 path: ``q`` int8 ``[T, 64, 128]``, ``q_scale`` / ``weights`` float16 ``[T, 64]``,
    ``k_cache`` int8 ``[num_blocks, block_size, 128]``, ``k_scale`` float16 ``[num_blocks,
    block_size]``. FP8 path: ``q`` float8_e4m3fn, ``weights`` float32, ``k_cache`` uint8
    ``[num_blocks, block_size*132]``, ``q_scale`` / ``k_scale`` None. ``block_table`` int
    ``[B, max_blocks]``, ``seq_lens`` int ``[B]``, ``q_lens`` int ``[B]`` or None (decode).
    ``ValueError`` / ``TypeError`` naming the argument."""
    check_choice(path, "path", PATHS)
    check_choice(int8_order, "int8_order", INT8_ORDERS)
    topk = check_int(topk, "topk", lo=1, hi=INT32_MAX)
    if topk > MAX_POSITIONS:
        raise ValueError(
            f"topk: expected an int in [1, {MAX_POSITIONS}] (MAX_POSITIONS: the most positions a "
            f"score row may hold; DeepSeek-V3.2 uses {TOPK}), got {topk}"
        )
    block_size = check_int(block_size, "block_size", lo=1, hi=INT32_MAX)
    check_trace(trace)
    if progress is not None:
        check_bool(progress, "progress")
    rows = _check_queries(q, weights, path)
    num_blocks = _check_scales(q_scale, k_scale, k_cache, path, rows, block_size)
    n_b, max_blocks, s1 = _check_lengths(block_table, seq_lens, q_lens, rows)
    _check_output_sizes(rows, topk, max_blocks, block_size)
    return Args(q, weights, k_cache, block_table, seq_lens, q_scale,
                k_scale, q_lens, path, int8_order, topk, block_size, n_b, rows,
                max_blocks, num_blocks, s1)  # fmt: skip


# ----------------------------------------------------------------------------- value checks
def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_length_values(a: Args) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lens = host_ints(a.seq_lens, "seq_lens", ndim=1)
    ql = (np.full(a.n_b, a.s1, dtype=np.int64) if a.q_lens is None
          else host_ints(a.q_lens, "q_lens", ndim=1))  # fmt: skip
    if (ql < 0).any():
        b = _first_bad(ql < 0)
        raise ValueError(f"q_lens[{b}]: expected a value >= 0, got {int(ql[b])}")
    if int(ql.sum()) != a.rows:
        raise ValueError(f"q_lens: expected sum(q_lens) = T = {a.rows} rows of q, got {ql.sum()}")
    cap = a.max_blocks * a.block_size
    bad = (lens < ql) | (lens > cap)
    if bad.any():
        b = _first_bad(bad)
        raise ValueError(
            f"seq_lens[{b}]: expected q_lens[{b}] = {int(ql[b])} <= seq_lens[{b}] <= max_blocks"
            f"*block_size = {cap} (cached tokens including the new ones), got {int(lens[b])}"
        )
    bt = host_ints(a.block_table, "block_table", ndim=2)
    for b in range(a.n_b):
        n = -(-int(lens[b]) // a.block_size)
        row = bt[b, :n]
        bad = (row < 0) | (row >= a.num_blocks)
        if bad.any():
            j = _first_bad(bad)
            raise ValueError(
                f"block_table[{b}, {j}]: expected a physical block in [0, {a.num_blocks}) (block "
                f"{j} holds visible tokens: seq_lens[{b}] = {int(lens[b])}), got {int(row[j])}"
            )
    return bt, lens, ql


def _check_scale(a: np.ndarray, name: str, where: str) -> None:
    check_finite(a, name)
    if (a < 0).any():
        idx = [int(i) for i in np.argwhere(a < 0)[0]]
        raise ValueError(f"{name}: expected scales >= 0 {where}, got {float(a[tuple(idx)])!r} "
                         f"at index {idx}")  # fmt: skip


def _check_read_keys(a: Args, bt: np.ndarray, lens: np.ndarray) -> None:
    """Finite, non-negative k scales (and, FP8, no NaN code) in every token that is read."""
    int8 = a.path == "int8"  # INT8 codes are all valid: only the scales are read
    cache = None if int8 else host_array(a.k_cache, "k_cache")
    kscale = host_array(a.k_scale, "k_scale") if int8 else None
    for b in range(a.n_b):
        n_tok = int(lens[b])
        blocks = bt[b, : -(-n_tok // a.block_size)]
        where = f"(batch {b}, the first {n_tok} tokens)"
        if a.path == "int8":
            s = kscale[blocks].reshape(-1)[:n_tok]
            _check_scale(s, f"k_scale[block_table[{b}]]", where)
            continue
        pages = fp8_page_views(cache[blocks], block_size=a.block_size)
        codes = pages.codes.view(np.uint8).reshape(-1)[: n_tok * INDEX_DIM]
        nan = e4m3_nan_codes(codes)
        if nan.any():
            t = _first_bad(nan) // INDEX_DIM
            raise ValueError(f"k_cache: expected finite E4M3 codes {where}, got a NaN code in "
                             f"token {t}")  # fmt: skip
        s = pages.scales.reshape(-1)[:n_tok].astype(np.float32)
        _check_scale(s, f"k_cache scales of batch {b}", where)


def _check_int8_factors(a: Args) -> None:
    """INT8 ``"gym"`` order: the per (row, head) factor ``FP16(q_scale * weights)`` must stay
    finite (an overflow to inf makes ``inf * 0 = NaN`` scores, and the ranking void)."""
    qs = host_array(a.q_scale, "q_scale").astype(np.float32)
    w = host_array(a.weights, "weights").astype(np.float32)
    with np.errstate(over="ignore"):
        bad = ~np.isfinite((qs * w).astype(np.float16))
    if bad.any():
        r, h = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"weights, q_scale: expected FP16(q_scale * weights) finite (|product| <= 65504: "
            f"int8_order='gym' rounds it to FP16), got q_scale[{r}, {h}] = {float(qs[r, h])!r} "
            f"* weights[{r}, {h}] = {float(w[r, h])!r} (overflows to inf)"
        )


def check_int_values(args: Args) -> Args:
    """The value checks of the small integer inputs (host int64 copies of ``seq_lens``,
    ``block_table`` and ``q_lens``; the device wrapper's default): ``0 <= q_lens``,
    ``sum(q_lens) = T``, ``q_lens <= seq_lens <= max_blocks * block_size``; every block that
    holds a visible token has a table entry in ``[0, num_blocks)`` (entries past them are
    never read, so anything goes there). Returns ``args`` with host int64 ``block_table``,
    ``seq_lens``, ``q_lens`` and ``values=True`` (what :func:`host_plan` needs)."""
    bt, lens, ql = _check_length_values(args)
    return args._replace(block_table=bt, seq_lens=lens, q_lens=ql, values=True)


def check_data_values(args: Args) -> Args:
    """The scans of the float data, after :func:`check_int_values` (``ValueError`` naming the
    entry): ``weights`` finite, ``q_scale`` finite and ``>= 0``, ``FP16(q_scale * weights)``
    finite (INT8 ``"gym"``), no NaN code in ``q`` (FP8); among the tokens that are read,
    finite ``>= 0`` k scales and no FP8 NaN code (reads every visible block of the cache).
    Returns ``args``."""
    require_values(args, Args, "check_data_values")
    check_finite(host_array(args.weights, "weights"), "weights")
    if args.path == "int8":
        _check_scale(host_array(args.q_scale, "q_scale"), "q_scale", "(every row is read)")
        if args.int8_order == "gym":
            _check_int8_factors(args)
    else:
        check_finite(host_array(args.q, "q"), "q")
    _check_read_keys(args, args.block_table, args.seq_lens)
    return args


def check_values(args: Args) -> Args:
    """Every value check, on host copies, before any work (the golden's):
    :func:`check_int_values` then :func:`check_data_values`. Returns ``args`` with host int64
    ``block_table``, ``seq_lens``, ``q_lens`` and ``values=True``."""
    return check_data_values(check_int_values(args))


# ----------------------------------------------------------------------------- plan and cost
def visible_lengths(seq_lens, q_lens) -> np.ndarray:
    """int64 ``[sum(q_lens)]``: ``seq_lens[b] - (q_lens[b] - 1 - r)`` for row ``r`` of batch
    ``b``, batch-major."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    ql = np.asarray(q_lens, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(ql)])
    rb = np.repeat(np.arange(lens.size), ql)
    r = np.arange(int(start[-1])) - start[rb]
    return lens[rb] - (ql[rb] - 1 - r)


def host_plan(args: Args) -> Plan:
    """The host rules of a checked call (:func:`check_values` first), NumPy int64."""
    require_values(args, Args, "host_plan")
    ql, lens = args.q_lens, args.seq_lens
    vis = visible_lengths(lens, ql)
    return Plan(
        np.repeat(np.arange(args.n_b, dtype=np.int64), ql),
        np.concatenate([[0], np.cumsum(ql)]).astype(np.int64),
        vis,
        np.minimum(vis, args.topk),
        -(-lens // args.block_size),
        args.max_blocks * args.block_size,
    )


def cost(args: Args) -> dict:
    """``{"flop", "bytes", "keys", "scored"}`` of one checked call, as the kernel runs it:
    every row of batch ``b`` is scored against all ``seq_lens[b]`` tokens (``scored`` = sum of
    ``q_lens[b] * seq_lens[b]``; later rows mask the tail). ``flop`` = ``2 * 64 * (128 + 1) *
    scored`` (the q.k dots and the weighted head sum, 2 per multiply-add). ``bytes`` (HBM): q
    codes + the q scale and weights (INT8: 2 + 2 bytes per head, FP8: the 4-byte weight) + every
    read block whole (``block_size * (128 + scale bytes)``) + the FP32 scores ``[T, width]``
    + the INT32 ids ``[T, topk]``; ``keys`` = sum of ``seq_lens``."""
    require_values(args, Args, "cost")
    plan = host_plan(args)
    scored = int((args.q_lens * args.seq_lens).sum())
    sbytes = 2 if args.path == "int8" else FP8_SCALE_BYTES
    t = args.rows
    key_bytes = int(plan.blocks.sum()) * args.block_size * (INDEX_DIM + sbytes)
    q_bytes = t * INDEX_HEADS * (INDEX_DIM + 4)  # INT8: FP16 q scale + FP16 weight; FP8: FP32 w
    out_bytes = t * plan.width * 4 + t * args.topk * 4
    return {
        "flop": 2 * INDEX_HEADS * (INDEX_DIM + 1) * scored,
        "bytes": q_bytes + key_bytes + out_bytes,
        "keys": int(args.seq_lens.sum()),
        "scored": scored,
    }


# ----------------------------------------------------------------------------- top-k rule
def select_topk(scores, visible, topk: int, *, nan_last: bool = False) -> np.ndarray:
    """The one top-k rule: INT32 ``[T, topk]`` from FP32 ``scores [T, >= max(visible)]`` and
    the visible length of each row (``visible [T]``, ints).

    Row ``i`` holds the ``min(topk, visible[i])`` best positions among ``0 .. visible[i]-1``,
    ordered by score descending; exactly equal scores (``-0.0 == 0.0``) put the lower position
    first; the remaining slots are :data:`NO_ID`. Columns at or past ``visible[i]`` are never
    read. A NaN among the visible scores is a ``ValueError`` (the ranking would be void), or,
    with ``nan_last`` (the layer step, whose own stages made the NaN and warned), ranked by
    the one ranking rule: below every number, lower position first."""
    topk = check_int(topk, "topk", lo=1)
    s = host_array(scores, "scores")
    check_array(s, "scores", dtype=np.float32, ndim=2, layout="[T, S]")
    vis = host_ints(visible, "visible", ndim=1)
    if vis.shape[0] != s.shape[0] or (vis < 0).any() or (vis > s.shape[1]).any():
        raise ValueError(f"visible: expected {s.shape[0]} lengths in [0, {s.shape[1]}], got "
                         f"{vis.tolist()[:8]}")  # fmt: skip
    for i, v in enumerate([] if nan_last else vis.tolist()):
        row = s[i, :v]
        if np.isnan(row).any():
            raise ValueError(f"scores[{i}, {_first_bad(np.isnan(row))}]: expected a number, got "
                             "NaN (the ranking would be void)")  # fmt: skip
    return top_k(s, topk, visible=vis).astype(np.int32)  # the one rule (shared/ranking.py)


# ----------------------------------------------------------------------------- record
#: the ids (tie-aware with the scores) and the scores a device may leave out
_IDS = Output("topk_indices", "ids", ("token",))
_SCORES = Output("scores", "float", ("token",), optional=True)
#: the op's record in the registry of ops (:mod:`tilesim.shared.registry.ops`)
RECORD = OpRecord(
    name="dsa_indexer",
    calls=(
        Call("dsa_indexer", "dsa_indexer", (_IDS, _SCORES), signature=(indexer_inputs,),
             judge_kind="dsa_indexer", judged_by="indexer", device=True),
    ),
    cost=cost,
    int_checks=check_int_values,
    scan_checks=check_data_values,
)  # fmt: skip


__all__ = [
    "FEW_GROUPS_VISITS",
    "KERNEL_BUILDS",
    "RECORD",
    "SOME_GROUPS_VISITS",
    "INDEX_HEADS",
    "PRODUCTION_TILING",
    "SMALL_TILING",
    "TILE_ALIGN",
    "IndexerTiling",
    "INT8_ORDERS",
    "INT8_QK_SCALE",
    "MAX_DECODE_S1",
    "MAX_POSITIONS",
    "NO_ID",
    "PATHS",
    "TOPK",
    "Args",
    "Plan",
    "check_data_values",
    "check_int_values",
    "check_meta",
    "check_values",
    "cost",
    "host_plan",
    "indexer_inputs",
    "kernel_build",
    "row_groups",
    "select_topk",
    "visible_lengths",
]
