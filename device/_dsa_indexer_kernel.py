"""The ``@pypto.frontend.jit`` kernel of the DeepSeek-V3.2 lightning indexer (op ``dsa_indexer``):
scores of every visible cached token and the top-k ids, both on the device. The public op and
its host glue are :mod:`tilesim.device.dsa_indexer`; the contract is
:mod:`tilesim.shared.dsa_indexer`.

Loop nest (``b``, ``r`` and every length are runtime values; one compile per model config)::

    L0 b < B              L = seq_lens[b]
    L1 r < s1 = T / B     row = b*s1 + r, visible = L - (s1-1-r), nblk = ceil(visible / bs)
      L2 c < nblk / U     a chunk of U blocks (then L2t: the nblk % U last blocks one by one)
         C1  d_j = q_row [64, 128] @ K_j^T        per block j of the chunk (cube, one K step)
             int8: INT32 (exact); fp8: FP32
         V1  int8 "gym": t = FP32(FP16(relu(FP32(d)) * 2^-11)) * FP32(w_h), w_h = FP16(qs*w)
             fp8:        t = relu(d) * w_h                       (FP32)
             s = the head sum of t, a fixed pairwise tree (:func:`head_sum`), FP32
             score = s * FP32(k_scale)            written for the row's visible positions only
      SEL  the top-k of the row (:func:`select_row`), ids written for min(topk, visible) slots

Selection with the documented tie rule from PyPTO's ``topk`` alone: 0.2.0's ``topk`` breaks
ties arbitrarily (in the interpreter it is ``torch.topk``), so every ``topk`` whose order
matters is fed UNIQUE keys, where any correct top-k gives the same answer:

1. ``(v1, i1) = topk(row)``: the values are right whatever the tie order; ``tau = v1[k-1]``,
   the k-th best score, and ``n_gt = #{v1 > tau}``;
2. ``i2 = topk(where(row == tau, -position, -inf))``: the positions scoring ``tau``, lowest
   first (unique keys) -- slots ``n_gt ..`` take them, so the tied boundary keeps the lower
   positions;
3. the order: key ``dense_rank(value) * k + rank(id)`` (both below ``k``, exact in FP32 and
   unique), one more ``topk`` of ``-key``: score descending, equal scores lower position first.
   ``rank(id)`` is the inverse of the permutation that sorts the ids (two ``topk`` of unique
   keys).

Steps 1 and 2 read the row through a static width, the smallest bucket holding ``max(visible,
k)`` columns (:func:`buckets`; one 0/1-trip loop per bucket: 0.2.0's ``view`` takes static
shapes only, and a narrower top-k is cheaper: one row on the 910B cost model, 1.7 µs at 8K
columns, 11 µs at 64K); positions the kernel does not write hold the ``-inf`` the wrapper
prefilled. Private; importing it needs neither torch
nor pypto.
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto
from tilesim.device._pypto_common import jit_options
from tilesim.shared.dsa_indexer import INDEX_HEADS as HEADS  # 64 index heads
from tilesim.shared.dsa_indexer import INT8_QK_SCALE  # 2^-11
from tilesim.shared.index_cache import INDEX_DIM as DIM  # 128
from tilesim.shared.index_cache import index_page_view

NEG_INF = float("-inf")
#: blocks per score chunk (the unrolled block loop; then single blocks)
CHUNK_BLOCKS = 4
#: widest vector tile of the full-row top-k (the PyPTO example's topk_tile)
TOPK_TILE = 8192
#: vector tile of the dense-rank cumsum (its transposes need ~100 B of UB per column)
CUMSUM_TILE = 1024
#: bucket widths grow by this factor (fewer branches = less compile time)
BUCKET_STEP = 4
#: the jit options (PyPTO's own indexer example: stitch 128, scheduling mode 1)
JIT = (("runtime", "stitch_function_max_num", 128), ("runtime", "device_sched_mode", 1))
READY_ON_HOST = ("block_table", "seq_lens")


class IndexerParams:
    """Static (trace-time) parameters of one build; ``repr`` keys pypto's compiled-kernel
    cache (equal parameters reuse a kernel)."""

    def __init__(self, *, path, block_size, topk, width, chunk=CHUNK_BLOCKS, select=True):
        self.path, self.bs, self.topk, self.width, self.chunk = path, block_size, topk, width, chunk
        self.select = bool(select)  # False: the scores only (the cost split of the reports)
        self.buckets = buckets(topk, width)
        # how the kernel addresses a block of the cache (tilesim.shared.index_cache): the codes
        # view's rows per block, the scales view's first column of a block
        page = index_page_view(path, block_size)
        self.rows_per_block, self.scale_col0 = page.code_rows, page.scale_col0

    @property
    def key(self) -> tuple:
        return (self.path, self.bs, self.topk, self.width, self.chunk, self.select)

    def __repr__(self) -> str:
        return ("IndexerParams(path={}, bs={}, topk={}, width={}, chunk={}, select={})"
                .format(*self.key))  # fmt: skip


def buckets(topk: int, width: int) -> tuple:
    """The static row widths of the selection: ``topk`` rounded up to a power of two, times
    :data:`BUCKET_STEP` ``**i``, the last one ``width`` (the score buffer's padded width)."""
    w, out = 1 << max(int(topk) - 1, 0).bit_length(), []
    while w < width:
        out.append(w)
        w *= BUCKET_STEP
    return (*out, width)


# ----------------------------------------------------------------------------- scores
def c1_tiles(pypto, bs: int) -> None:
    """The cube tiles of C1 (``[64, 128] @ [128, bs]``, one K step): shared with the probe."""
    pypto.set_cube_tile_shapes([HEADS, HEADS], [DIM, DIM], [bs, bs])


def head_sum(pypto, t, w: int):
    """``sum_h t[h]`` of FP32 ``t [64, w]`` as a fixed pairwise tree: ``t = t[:32] + t[32:]``,
    then halves of 16, 8, 4, 2, 1 rows -- one IEEE FP32 add per element and level, so the bits
    are the same on every device and in the golden's emulation. Returns ``[1, w]``."""
    n = HEADS
    while n > 1:
        n //= 2
        pypto.set_vec_tile_shapes(min(n, 16), min(w, 512))
        t = pypto.add(pypto.view(t, [n, w], [0, 0]), pypto.view(t, [n, w], [n, 0]))
    return t


def chunk_terms(pypto, d, wcol, w: int, p):
    """V1 before the head sum: FP32 ``[64, w]`` terms from the C1 output ``d``."""
    pypto.set_vec_tile_shapes(16, min(w, 512))
    if p.path == "int8":
        x = pypto.maximum(pypto.cast(d, pypto.DT_FP32), 0.0)
        v = pypto.cast(pypto.mul(x, INT8_QK_SCALE), pypto.DT_FP16)
        return pypto.mul(pypto.cast(v, pypto.DT_FP32), wcol)
    return pypto.mul(pypto.maximum(d, 0.0), wcol)


def chunk_scores(pypto, ins, qrow, wcol, b, blk0, nb: int, p):
    """Scores ``[1, nb*bs]`` of the blocks ``blk0 .. blk0+nb-1`` of batch ``b`` for one row."""
    bs, w = p.bs, nb * p.bs
    acc = pypto.DT_INT32 if p.path == "int8" else pypto.DT_FP32
    d = pypto.tensor([HEADS, w], acc, "li_dots")
    ks = pypto.tensor([1, w], pypto.DT_FP32, "li_kscale")
    for j in range(nb):
        phys = ins.block_table[b, blk0 + j]
        kb = pypto.view(ins.k_codes, [bs, DIM], [phys * ins.rows_per_block, 0])
        c1_tiles(pypto, bs)
        pypto.assemble(pypto.matmul(qrow, kb, acc, b_trans=True), [0, j * bs], d)
        pypto.set_vec_tile_shapes(1, bs)
        sc = pypto.view(ins.k_scales, [1, bs], [phys, ins.scale_col0])
        pypto.assemble(pypto.cast(sc, pypto.DT_FP32), [0, j * bs], ks)
    s = head_sum(pypto, chunk_terms(pypto, d, wcol, w, p), w)
    pypto.set_vec_tile_shapes(1, min(w, 2048))
    return pypto.mul(s, ks)


def row_weights(pypto, ins, row, p):
    """FP32 ``[64, 1]`` per-head factors of query row ``row``: INT8 ``FP16(q_scale * w)``
    (one FP16 multiply), FP8 the FP32 weights."""
    pypto.set_vec_tile_shapes(HEADS, 1)
    w = pypto.view(ins.weights, [HEADS, 1], [row * HEADS, 0])
    if p.path == "int8":
        w = pypto.mul(pypto.view(ins.q_scale, [HEADS, 1], [row * HEADS, 0]), w)
        return pypto.cast(w, pypto.DT_FP32)
    return pypto.add(w, 0.0)


def score_row(pypto, ins, b, row, visible, scores, p):
    """C1 + V1 of one query row over its ``ceil(visible / bs)`` blocks: chunks of
    ``p.chunk`` blocks, then the remaining blocks one by one; each chunk's visible columns
    (``valid_shape``) are written to ``scores[row]`` (the rest keeps the caller's -inf)."""
    bs, u = p.bs, p.chunk
    nblk = (visible + bs - 1) // bs
    full = nblk // u
    qrow = pypto.view(ins.q, [HEADS, DIM], [row * HEADS, 0])
    wcol = row_weights(pypto, ins, row, p)
    for c in pypto.loop(0, full, 1, name="LI_CHUNK", idx_name="c"):
        s = chunk_scores(pypto, ins, qrow, wcol, b, c * u, u, p)
        n = (visible - c * u * bs).min(u * bs)
        pypto.assemble(pypto.view(s, [1, u * bs], [0, 0], valid_shape=[1, n]), [row, c * u * bs],
                       scores)  # fmt: skip
    for j in pypto.loop(0, nblk - full * u, 1, name="LI_BLOCK", idx_name="j"):
        blk = full * u + j
        s = chunk_scores(pypto, ins, qrow, wcol, b, blk, 1, p)
        n = (visible - blk * bs).min(bs)
        pypto.assemble(pypto.view(s, [1, bs], [0, 0], valid_shape=[1, n]), [row, blk * bs],
                       scores)  # fmt: skip


# ----------------------------------------------------------------------------- selection
def bucket_topk(pypto, scores, negpos, row, width: int, k: int, sel):
    """Steps 1 and 2 of the selection (module docstring) over the first ``width`` columns of
    the row (every one of them: the columns the kernel did not write hold the wrapper's
    ``-inf``; a ``valid_shape`` view is NOT used -- under ``pass_verify`` of every pass the
    tile-level top-k read its padding as 0, which outranks negative scores; PyPTO's own
    indexer pads its top-k input explicitly too): ``v1`` / ``i1`` and the tied-boundary
    positions ``i2`` (FP32 ids) into the row's scratch ``sel``."""
    pypto.set_vec_tile_shapes(1, min(width, TOPK_TILE))
    src = pypto.view(scores, [1, width], [row, 0])
    v1, i1 = pypto.topk(src, k, -1, True)
    pypto.set_vec_tile_shapes(1, k)
    tau = pypto.view(v1, [1, 1], [0, k - 1])
    sel[0][:] = v1
    sel[1][:] = pypto.cast(i1, pypto.DT_FP32)
    pypto.set_vec_tile_shapes(1, min(width, TOPK_TILE))
    pos = pypto.view(negpos, [1, width], [0, 0])
    key = pypto.where(pypto.eq(src, tau), pos, NEG_INF)
    _v2, i2 = pypto.topk(key, k, -1, True)
    pypto.set_vec_tile_shapes(1, k)
    sel[2][:] = pypto.cast(i2, pypto.DT_FP32)


def ascending_order(pypto, key, k: int):
    """INT32 ``[1, k]``: the permutation that sorts the UNIQUE FP32 ``key`` ascending."""
    _v, perm = pypto.topk(pypto.mul(key, -1.0), k, -1, True)
    return perm


def order_ids(pypto, v1, ids, k: int):
    """Step 3: ``ids`` (FP32, unique, their scores ``v1`` descending) ordered by (score
    descending, id ascending): the key ``dense_rank(v1) * k + rank(id)``."""
    newrun = pypto.where(pypto.ne(pypto.view(v1, [1, k - 1], [0, 1]),
                                  pypto.view(v1, [1, k - 1], [0, 0])), 1.0, 0.0)  # fmt: skip
    first = pypto.full([1, 1], 0.0, pypto.DT_FP32)
    runs = pypto.concat([first, newrun], -1)
    pypto.set_vec_tile_shapes(1, min(k, CUMSUM_TILE))
    rank = pypto.cumsum(runs, -1)
    pypto.set_vec_tile_shapes(1, k)
    by_id = ascending_order(pypto, ids, k)  # by_id[m] = slot of the m-th smallest id
    id_rank = ascending_order(pypto, pypto.cast(by_id, pypto.DT_FP32), k)  # its inverse
    key = pypto.add(pypto.mul(rank, float(k)), pypto.cast(id_rank, pypto.DT_FP32))
    return pypto.gather(ids, -1, ascending_order(pypto, key, k))


def select_row(pypto, ins, row, visible, scores, ids, p):
    """SEL of one row: the bucket branch that holds ``max(visible, k)`` columns (one 0/1-trip
    loop per bucket), then the tie fix-up and the order on ``[1, k]``, and the first
    ``min(visible, k)`` ids written to ``ids[row]`` (the rest keeps the caller's -1)."""
    k = p.topk
    n = visible.max(k)
    sel = [pypto.tensor([1, k], pypto.DT_FP32, f"li_sel{i}") for i in range(3)]
    lo = 0
    for width in p.buckets:
        trips = (n - lo).max(0).min(1) - (n - width).max(0).min(1)
        for _u in pypto.loop(0, trips, 1, name=f"LI_TOPK_{width}", idx_name=f"u{width}"):
            bucket_topk(pypto, scores, ins.negpos, row, width, k, sel)
        lo = width
    pypto.set_vec_tile_shapes(1, k)
    v1, i1, i2 = sel
    tau = pypto.view(v1, [1, 1], [0, k - 1])
    n_gt = pypto.sum(pypto.where(pypto.gt(v1, tau), 1.0, 0.0), -1, True)
    slots = pypto.view(ins.slots, [1, k], [0, 0])
    shift = pypto.cast(pypto.maximum(pypto.sub(slots, n_gt), 0.0), pypto.DT_INT32)
    merged = pypto.where(pypto.lt(slots, n_gt), i1, pypto.gather(i2, -1, shift))
    out = pypto.cast(order_ids(pypto, v1, merged, k), pypto.DT_INT32)
    m = visible.min(k)
    pypto.assemble(pypto.view(out, [1, k], [0, 0], valid_shape=[1, m]), [row, 0], ids)


# ----------------------------------------------------------------------------- the nest
class _Inputs:
    """The kernel's input tensors as the nest reads them (path-independent names)."""

    def __init__(self, q, weights, q_scale, k_codes, k_scales, block_table, seq_lens, negpos,
                 slots, rows_per_block, scale_col0):  # fmt: skip
        self.q, self.weights, self.q_scale = q, weights, q_scale
        self.k_codes, self.k_scales = k_codes, k_scales
        self.block_table, self.seq_lens = block_table, seq_lens
        self.negpos, self.slots = negpos, slots
        self.rows_per_block, self.scale_col0 = rows_per_block, scale_col0


def indexer_nest(pypto, ins, scores, ids, p):
    """The loop nest of the module docstring."""
    n_b = ins.seq_lens.shape[0]
    s1 = ins.q.shape[0] // HEADS // n_b
    for b in pypto.loop(0, n_b, 1, name="LI_B", idx_name="b"):
        seq = ins.seq_lens[b]
        for r in pypto.loop(0, s1, 1, name="LI_S1", idx_name="r"):
            row = b * s1 + r
            visible = seq - (s1 - 1 - r)
            visible.as_variable()
            score_row(pypto, ins, b, row, visible, scores, p)
            if p.select:
                select_row(pypto, ins, row, visible, scores, ids, p)


def _sources(pypto):
    """The two undecorated kernel sources (INT8, FP8)."""

    def li_int8(
        q: pypto.Tensor([pypto.DYNAMIC, DIM], pypto.DT_INT8),  # [T*64, 128]
        q_scale: pypto.Tensor([pypto.DYNAMIC, 1], pypto.DT_FP16),  # [T*64, 1]
        weights: pypto.Tensor([pypto.DYNAMIC, 1], pypto.DT_FP16),  # [T*64, 1]
        k_cache: pypto.Tensor([pypto.STATIC, DIM], pypto.DT_INT8),  # [num_blocks*bs, 128]
        k_scale: pypto.Tensor([pypto.STATIC, pypto.STATIC], pypto.DT_FP16),  # [num_blocks, bs]
        block_table: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
        seq_lens: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
        negpos: pypto.Tensor([1, pypto.STATIC], pypto.DT_FP32),  # [1, width]: -position
        slots: pypto.Tensor([1, pypto.STATIC], pypto.DT_FP32),  # [1, topk]: 0 .. topk-1
        scores: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_FP32),  # [T, width]
        ids: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),  # [T, topk]
        params,
    ):
        ins = _Inputs(q, weights, q_scale, k_cache, k_scale, block_table, seq_lens, negpos,
                      slots, params.rows_per_block, params.scale_col0)  # fmt: skip
        indexer_nest(pypto, ins, scores, ids, params)

    def li_fp8(
        q: pypto.Tensor([pypto.DYNAMIC, DIM], pypto.DT_FP8E4M3),  # [T*64, 128]
        weights: pypto.Tensor([pypto.DYNAMIC, 1], pypto.DT_FP32),  # [T*64, 1]
        k_codes: pypto.Tensor([pypto.STATIC, DIM], pypto.DT_FP8E4M3),  # pages as 128-byte rows
        k_scales: pypto.Tensor([pypto.STATIC, pypto.STATIC], pypto.DT_FP32),  # pages as FP32 words
        block_table: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
        seq_lens: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
        negpos: pypto.Tensor([1, pypto.STATIC], pypto.DT_FP32),
        slots: pypto.Tensor([1, pypto.STATIC], pypto.DT_FP32),
        scores: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_FP32),
        ids: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
        params,
    ):
        ins = _Inputs(q, weights, None, k_codes, k_scales, block_table, seq_lens, negpos, slots,
                      params.rows_per_block, params.scale_col0)  # fmt: skip
        indexer_nest(pypto, ins, scores, ids, params)

    return {"int8": li_int8, "fp8": li_fp8}


def build(params: IndexerParams, static_dims: tuple, jit: tuple = JIT):
    """The jit kernel of ``params.path`` on this process's target, built once per
    (params, static dims = cache rows and block-table width, options)
    (:func:`tilesim.device.backend.compiled`); batch, ``s1`` and every length are runtime
    values."""
    pypto = require_pypto()
    key = (params.key, tuple(static_dims), jit)
    return _backend.compiled(
        "dsa_indexer", key,
        lambda: pypto.frontend.jit(**jit_options(jit, ready_on_host=READY_ON_HOST))(
            _sources(pypto)[params.path]),
    )  # fmt: skip


__all__ = [
    "BUCKET_STEP",
    "CHUNK_BLOCKS",
    "JIT",
    "READY_ON_HOST",
    "IndexerParams",
    "buckets",
    "build",
    "c1_tiles",
    "head_sum",
]
