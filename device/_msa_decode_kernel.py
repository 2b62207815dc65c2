"""The ``@pypto.frontend.jit`` builder of the MSA block-sparse decode (:func:`build_kernel`)
and its kernel-body helpers; the public op and its host glue are :mod:`tilesim.device.msa_decode`
(whose docstring gives the loop nest, the masking and the gather variants).

Private; importing it needs neither torch nor pypto (the kernel is built on first call).
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
from dataclasses import dataclass

from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto
from tilesim.device._msa_tiles import (
    L1_REUSE_BY_ROWS,
    SEED_RUNTIME,
    c1_cube_tiles,
    c2_cube_tiles,
    page_pieces,
)
from tilesim.device._pypto_common import (
    eval_tree,
    jit_options,
    merge_tree,
    operation_options,
    without,
)
from tilesim.shared.layouts.splitkv import split_ranges
from tilesim.shared.models import MINIMAX_M3

_CFG = MINIMAX_M3.msa
BY = _CFG.block_size  # 128 keys per block
LARGE_NEG = _CFG.decode_mask_neg  # -3e38


def _gather_chunk(pypto, cache, positions, table, rows: int):
    """``gather="device"``: fetch the chunk's ``positions`` (logical key ``slot*128 + t``) of
    one (batch row, KV head) from its paged ``cache`` ``[nb*128, D]`` through ``table``
    (``[1, topk]`` block ids) into UB, ``rows`` rows per tile.
    Row ``j`` of the result = ``cache[table[pos_j // 128]*128 + pos_j % 128]``."""
    pypto.set_vec_tile_shapes(rows, cache.shape[1])
    return pypto.experimental.gather_in_ub(cache, positions, table, BY, -2)


def _scores(pypto, qg, k_pieces, w: int, g: int):
    """C1 of one chunk: FP32 ``S[g, w] = Q[g, 128] @ K_c^T``, one matmul per piece of K
    (``k_pieces``: ``[(view [n, 128] BF16, n), ...]``, contiguous rows in key order; the page
    pieces of :func:`page_pieces`, or the whole chunk), the products assembled into their
    ``n`` columns. Every score is one dot product over the 128 dims, however K is cut."""
    if len(k_pieces) == 1:
        pypto.set_cube_tile_shapes(*c1_cube_tiles(g, w))
        return pypto.matmul(qg, k_pieces[0][0], pypto.DT_FP32, b_trans=True)
    s = pypto.tensor([g, w], pypto.DT_FP32, "s")
    col = 0
    for kp, n in k_pieces:
        pypto.set_cube_tile_shapes(*c1_cube_tiles(g, n))
        s_n = pypto.matmul(qg, kp, pypto.DT_FP32, b_trans=True)
        pypto.set_vec_tile_shapes(g, 128)
        pypto.assemble(s_n, [0, col], s)
        col += n
    return s


def _chunk_softmax(pypto, qg, k_pieces, vc, keep, keep_rows, w: int, p: "_Static"):
    """One chunk: scores (:func:`_scores`), scale, the keep select, chunk max / exp / row sum,
    the V select, bf16(P) @ V. ``keep``: bool ``[1, w]`` (broadcast over the G query rows),
    ``keep_rows``: the same mask as a bool ``[w, 1]`` column (broadcast over the D columns of
    V)."""
    g = p.g
    s = _scores(pypto, qg, k_pieces, w, g)
    pypto.set_vec_tile_shapes(g, w)
    s = s * p.scale
    s = pypto.where(keep, s, LARGE_NEG)  # a select: NaN/inf scores of dropped keys vanish
    m_c = pypto.amax(s, dim=-1, keepdim=True)
    e = pypto.exp(s - m_c)
    l_c = pypto.sum(e, dim=-1, keepdim=True)
    p16 = pypto.cast(e, pypto.DT_BF16)
    if p.gather != "device":  # "device" never reads a dropped key's V row (_redirected)
        pypto.set_vec_tile_shapes(p.vrows, p.dim)  # [vrows, D] BF16 tiles: fit the UB
        vc = pypto.where(keep_rows, vc, 0.0)  # dropped keys' V rows are exactly zero (BF16)
    pypto.set_cube_tile_shapes(*c2_cube_tiles(g, w))
    o_c = pypto.matmul(p16, vc, pypto.DT_FP32)
    return m_c, l_c, o_c


#: the seeds' jit options of the decode kernel (hicann/pypto-gym,
#: src/pypto_gym/ops/pypto_tensor/minimax/minimax_m3_msa_sparse_attention_impl.py), as a
#: hashable spec (:func:`tilesim.device._pypto_common.jit_options`); the cost-model sweep and
#: which of them are kept: docs/ops/msa.md#kernels
SEED_JIT = (
    *SEED_RUNTIME,
    ("pass", "cube_l1_reuse_setting", ((-1, 3),)),
    ("pass", "cube_nbuffer_setting", ((-1, 4),)),
    ("pass", "vec_nbuffer_setting", ((-1, 1),)),
    ("operation", "combine_axis", True),
)
#: the options the kernel runs with, the sweep's verdict (docs/ops/msa_decode.md#kernel): the
#: seeds' runtime
#: options, which the cost model is indifferent to; their pass options and combine_axis make
#: the model slower on at least one SoC or case and are left out (the L1 reuse is set per body
#: of the batch loop instead: :data:`L1_REUSE_BY_ROWS`)
JIT = without(SEED_JIT, "cube_l1_reuse_setting", "cube_nbuffer_setting", "vec_nbuffer_setting",
              "combine_axis")  # fmt: skip


@dataclass(frozen=True)
class _Static:
    """What a decode kernel is specialised on (closed over by its body; a dataclass, since the
    jit parser turns a tuple -- NamedTuple included -- into a plain tuple)."""

    hkv: int
    g: int  #: query heads per KV head (cube M)
    dim: int
    topk: int
    bounds: tuple  #: ``((c0, w), ...)`` key chunks of the topk*128 selected keys
    ranges: tuple  #: ``((first, stop), ...)`` chunk ranges of the kv splits
    unroll: tuple  #: batch rows per body of the batch loop (``pypto.loop_unroll`` factors)
    gather: str
    vrows: int  #: V-select tile rows (the SoC's default gather tile at most: UB-safe)
    scale: float
    vg_rows: int  #: V-gather tile rows (``gather="device"``, :data:`V_GATHER_ROWS`)
    l1_reuse: tuple  #: ``((rows per body, N), ...)``: :data:`L1_REUSE_BY_ROWS`
    spread_rows: int  #: bodies of at least this many rows spread (:data:`SPREAD_ROWS`)


def _chunk_kv(pypto, k, v, block_table, positions, outer, c0: int, w: int, p: _Static,
              spread: bool):  # fmt: skip
    """The chunk's K pieces (``[(view [n, D], n), ...]``, contiguous runs of K rows in key
    order, for :func:`_scores`) and its V ``[w, D]`` BF16 tile, of pair ``outer``, by the
    ``gather`` variant. ``"device"`` / ``"paged"``: one piece per page piece
    (:func:`page_pieces`), its rows starting at ``block_table[outer, slot]*128 + t0`` of the
    paged cache (a page-table value read by the control flow); ``"host"``: the chunk's rows
    of the compact copy, one piece (the seeds' one C1 matmul per chunk). ``spread``
    (``"device"``, bodies of at least :data:`SPREAD_ROWS` batch rows): the chunk's page-table
    row goes through a producer task first (an exact INT32 ``+ 0``), so its V gather is that
    task's successor rather than a source of the root function, whose successor edges one
    AICPU thread resolves one by one (docs/ops/msa_decode.md#kernel)."""
    if p.gather == "host":  # the compact rows of the chunk are contiguous: one piece
        row = outer * p.topk * BY + c0
        return [(pypto.view(k, [w, p.dim], [row, 0]), w)], pypto.view(v, [w, p.dim], [row, 0])
    starts = [(block_table[outer, slot] * BY + t0, n) for slot, t0, n in page_pieces(c0, w, BY)]
    k_pieces = [(pypto.view(k, [n, p.dim], [r, 0]), n) for r, n in starts]
    if p.gather == "device":
        table = pypto.view(block_table, [1, p.topk], [outer, 0])
        if spread:
            pypto.set_vec_tile_shapes(1, p.topk)
            table = table + 0
        pos = pypto.view(positions, [1, w], [outer // p.hkv, c0])
        return k_pieces, _gather_chunk(pypto, v, pos, table, p.vg_rows)
    vc = pypto.tensor([w, p.dim], pypto.DT_BF16, "vc")  # "paged": V's pieces assembled
    pypto.set_vec_tile_shapes(BY, p.dim)
    col = 0
    for r, n in starts:
        pypto.assemble(pypto.view(v, [n, p.dim], [r, 0]), [col, 0], vc)
        col += n
    return k_pieces, vc


def _merge(pypto, ml, o_all, q0, out, p: _Static, scope: int):
    """The pair's online merge and output in ONE vector task (``sg_set_scope``): the chunks'
    ``m_c`` / ``l_c`` come in as one ``[2*n*G, 1]`` column tensor ``ml`` and their ``O_c`` as
    one ``[n*G, D]`` tensor ``o_all`` (two copies in, instead of three per chunk: the cost
    model charges ~1.4 k cycles per copy, one after another). The ``(m, l)`` half of the merge
    tree (:func:`tilesim.device._msa_tiles.merge_tree`) runs on ``[G, 1]`` columns; the ``O``
    half is one ``[n*G, D]`` multiply by the chunks' weights, then the chained sums -- the
    values of the chunk loop's merges, operation for operation."""
    g, n = p.g, len(p.bounds)
    pypto.set_pass_options(sg_set_scope=scope)
    pypto.set_vec_tile_shapes(2 * n * g, 8)
    ml = ml * 1.0  # the whole column tensor in one copy; the views below are UB views
    pypto.set_vec_tile_shapes(g, 8)
    m_c = [pypto.view(ml, [g, 1], [c * g, 0]) for c in range(n)]
    l_c = [pypto.view(ml, [g, 1], [(n + c) * g, 0]) for c in range(n)]
    merge = merge_tree(pypto, m_c, l_c, p.ranges)
    cols = [w for w in merge.pre if w is not None] + merge.chained + [merge.l]
    wts = pypto.tensor([len(cols) * g, 1], pypto.DT_FP32, "merge_weights")
    for i, col in enumerate(cols):  # one [len(cols)*G, 1] column: a UB buffer of the task
        pypto.assemble(col, [i * g, 0], wts)
    wv = [pypto.view(wts, [g, 1], [i * g, 0]) for i in range(len(cols))]
    if n > 1:
        pypto.set_vec_tile_shapes(n * g, p.dim)
        prod = o_all * pypto.view(wts, [n * g, 1], [0, 0])  # O_c * pre[c], every chunk at once
        pypto.set_vec_tile_shapes(g, p.dim)
        prods = [pypto.view(prod, [g, p.dim], [c * g, 0]) for c in range(n)]
    else:
        pypto.set_vec_tile_shapes(g, p.dim)
        prods = [o_all]
    res = eval_tree(merge.tree, prods, wv[n if n > 1 else 0 : -1]) / wv[-1]
    if p.gather == "device":
        # a row that keeps no key read stand-in rows: its output is +0. It is the row whose
        # final max is the mask value (every score selected away); ``l - l`` is 0, or NaN when
        # a NaN reached l, so such a row still shows its NaN
        pypto.set_vec_tile_shapes(g, 8)
        seen = pypto.ne(merge.m + (merge.l - merge.l), LARGE_NEG)
        pypto.set_vec_tile_shapes(g, p.dim)
        res = pypto.where(seen, res, 0.0)
    # otherwise every V row such a row reads is zeroed, so O = +0 and O / l = +0. A NaN read
    # from a kept slot is not hidden: it shows, as in the reference
    pypto.assemble(pypto.cast(res, pypto.DT_BF16), [q0, 0], out)
    pypto.set_pass_options(sg_set_scope=-1)


def _decode_pair(pypto, q, k, v, block_table, positions, keep, keep_rows, out, b, outer,
                 p: _Static, spread: bool, slot: int):  # fmt: skip
    """Inside a kernel body: one (batch row ``b``, KV head) pair ``outer = b*HKV + h``, its G
    query heads over the selected keys, chunk by chunk, into ``out``. Each chunk's softmax
    writes its ``m_c`` / ``l_c`` into the pair's column tensor and its P.V into the pair's
    ``O`` tensor; :func:`_merge` folds them (``slot``: the pair's place in the body, its
    merge task's scope id)."""
    g, n = p.g, len(p.bounds)
    q0 = outer * g
    pypto.set_vec_tile_shapes(g, p.dim)
    qg = pypto.view(q, [g, p.dim], [q0, 0])
    ml = pypto.tensor([2 * n * g, 1], pypto.DT_FP32, "ml")
    o_all = pypto.tensor([n * g, p.dim], pypto.DT_FP32, "o_all")
    kvs = [_chunk_kv(pypto, k, v, block_table, positions, outer, c0, w, p, spread)
           for c0, w in p.bounds]  # fmt: skip
    for c, (c0, w) in enumerate(p.bounds):
        kp = pypto.view(keep, [1, w], [b, c0])
        kr = pypto.view(keep_rows, [w, 1], [b * p.topk * BY + c0, 0])
        m_c, l_c, o_c = _chunk_softmax(pypto, qg, *kvs[c], kp, kr, w, p)
        pypto.set_vec_tile_shapes(g, 8)
        pypto.assemble(m_c, [c * g, 0], ml)
        pypto.assemble(l_c, [(n + c) * g, 0], ml)
        pypto.set_vec_tile_shapes(g, p.dim)
        pypto.assemble(o_c, [c * g, 0], o_all)
    _merge(pypto, ml, o_all, q0, out, p, MERGE_SCOPE + slot)


#: scope ids (``sg_set_scope``) of the merge tasks: ``MERGE_SCOPE + u*HKV + h`` for the pair
#: of row ``u``, head ``h`` of a body (each pair's merge is one task of its own)
MERGE_SCOPE = 100


def _decode_nest(pypto, q, k, v, block_table, positions, keep, keep_rows, out, p: _Static):
    """The loop nest: a ``pypto.loop_unroll`` over the batch rows (``keep``'s dynamic first
    axis), ``ub`` rows per body (static ``p.unroll`` factors, largest first), the rows' KV
    heads static inside it: ``ub * HKV`` independent (batch row, KV head) bodies per iteration.
    The model runs the iterations of one loop one after another, the bodies of one side by
    side. In the ``"device"`` and ``"paged"`` variants each body sets its own L1 reuse
    (:data:`L1_REUSE_BY_ROWS`); ``"host"``, one C1 matmul per chunk as in the seeds, keeps
    PyPTO's automatic setting."""
    loop = pypto.loop_unroll(0, keep.shape[0], 1, name="LOOP_B", idx_name="b0",
                             unroll_list=list(p.unroll))  # fmt: skip
    l1_reuse = dict(p.l1_reuse)
    for b0, ub in loop:
        if p.gather != "host":
            pypto.set_pass_options(cube_l1_reuse_setting={-1: l1_reuse[ub]})
        for u in range(ub):
            for h in range(p.hkv):
                b = b0 + u
                _decode_pair(pypto, q, k, v, block_table, positions, keep, keep_rows, out, b,
                             b * p.hkv + h, p, ub >= p.spread_rows, u * p.hkv + h)  # fmt: skip


#: batch rows per body of the batch loop (``pypto.loop_unroll`` factors)
BATCH_UNROLL = (4, 2, 1)
#: per SoC arch, the smallest body (batch rows) whose V gathers hang below the ``+ 0``
#: producer (``spread`` of :func:`_chunk_kv`) instead of on the root: every body on the 950
#: (DAV_3510), bodies of 2 and 4 rows on the 910B (DAV_2201: at B 1 its 32 smaller gathers'
#: producers cost more edges than the fan-out they spread; the figures:
#: docs/ops/msa_decode.md#kernel)
SPREAD_ROWS = {"DAV_3510": 1, "DAV_2201": 2}


@_backend.compile_once("msa_sparse_decode")
def build_kernel(hq, hkv, topk, dim, ntile, gather, vrows=128, jit=JIT, kv_splits=1,
                 unroll=BATCH_UNROLL, vg_rows=128, l1_reuse=L1_REUSE_BY_ROWS,
                 spread_rows=2):  # fmt: skip
    """The ``@pypto.frontend.jit`` kernel for one model configuration and tiling, built once
    (:func:`tilesim.device.backend.compiled`). Batch and ``nb`` are runtime values: a
    ``pypto.loop_unroll`` over the batch rows (``keep``'s dynamic first axis, ``unroll`` rows
    per body), the KV heads static inside it, the chunks in ``kv_splits`` ranges, and the
    cache addressed through the global page ids of ``block_table``; ``l1_reuse``: the L1
    reuse of each body (every factor of ``unroll`` needs one, and pypto's ``loop_unroll``
    always adds 1); ``spread_rows``: the smallest body whose V gathers hang below the ``+ 0``
    producer (:data:`SPREAD_ROWS`)."""
    missing = sorted((set(unroll) | {1}) - set(dict(l1_reuse)))
    if missing:
        raise ValueError(f"l1_reuse: expected an entry for every body size, missing {missing}")
    pypto = require_pypto()
    sel = topk * BY
    bounds = tuple((c0, min(ntile, sel - c0)) for c0 in range(0, sel, ntile))  # tail kept
    ranges = tuple(split_ranges(len(bounds), kv_splits))
    p = _Static(hkv, hq // hkv, dim, topk, bounds, ranges, tuple(unroll), gather, vrows,
                dim**-0.5, vg_rows, tuple(l1_reuse), spread_rows)  # fmt: skip
    combine = bool(operation_options(jit).get("combine_axis", False))

    @pypto.frontend.jit(**jit_options(jit))
    def msa_sparse_decode_kernel(
        q: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # [B*HQ, D]
        k: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # pages as rows
        v: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),
        block_table: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),  # [B*HKV, topk]
        positions: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),  # [B, sel]
        keep: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BOOL),  # [B, sel]
        keep_rows: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BOOL),  # [B*sel, 1]
        out: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # [B*HQ, D]
    ):
        pypto.experimental.set_operation_options(combine_axis=combine)
        _decode_nest(pypto, q, k, v, block_table, positions, keep, keep_rows, out, p)

    return msa_sparse_decode_kernel


__all__ = ["BATCH_UNROLL", "JIT", "MERGE_SCOPE", "SEED_JIT", "SPREAD_ROWS", "build_kernel"]
