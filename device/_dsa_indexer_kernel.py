"""The ``@pypto.frontend.jit`` kernel of the DeepSeek-V3.2 lightning indexer (op ``dsa_indexer``):
scores of every visible cached token and the top-k ids, both on the device. The public op and
its host glue are :mod:`tilesim.device.dsa_indexer`; the contract is
:mod:`tilesim.shared.dsa_indexer`.

Loop nest (``b`` and every length are runtime values; one compile per model config)::

    L0 b < B                 L = seq_lens[b], s1 = T / B
    L1 g < s1 // 2, then s1 % 2    groups of 2 query rows (M = 128), then 1 (M = 64);
                             nblk = ceil(visible of the group's last row / bs)
      L2 chunks of U blocks  pypto.loop_unroll over nblk, U in :func:`chunk_unroll`: up
                             to ROW_SPANS whole selection spans (the whole row at 64K),
                             one span (span_ratio * topk columns, :func:`span_count` spans
                             per row), then the tiling's smaller chunk_steps; a chunk of
                             whole spans runs C1 .. SP span by span
         C1  d_j = q_group [M, 128] @ K_j^T   per block j of the chunk: every block read
             once per group; the L1 reuse of JIT packs 32 blocks into one cube task
             int8: the fix-pipe epilogue FP16(relu(d) * 2^-11); fp8: FP32 logits
         V1  per query row and vec_cols columns, one vector subgraph (sg_set_scope; JIT's
             vector n-buffer merge packs 4 of them into one task): the row's w_h and the
             slab's key scales (910B INT8: one index_select by the block-table entries
             under it; else a view of the chunk's, gathered by a vector task per span),
             int8 "gym": t = FP32(d) * FP32(w_h), w_h = FP16(qs*w)
             fp8:        t = relu(d) * w_h                       (FP32)
             s = the head sum of t, a fixed pairwise tree (:func:`head_sum`), FP32
             score = s * k_scale        written for the row's visible positions only
         SP  whole-span chunks: per row, the span's top-k under the tie rule from the
             chunk's own scores (:func:`span_topk`; the chunk's last span masked to the
             visible columns): the span's candidates; the same task writes the row's span
      SP'  the span the smaller chunks end (0/1 trips): its top-k from the written rows
      MG   per row: the top-k of its candidates (:func:`merge_spans`; one span: its own)
      ORD  the order; ids written for min(topk, visible) slots (:func:`select_row`)

The selection (SP, SP', MG, ORD) is :mod:`tilesim.device._dsa_indexer_select`, which states
its tie rule and why the merge is exact.

The widths (span, tiles, slabs, unroll steps) are a :class:`~tilesim.shared.dsa_indexer.
IndexerTiling` (``PRODUCTION_TILING`` for every call; ``SMALL_TILING`` cuts a CI-size row the
same way). The host-side plan -- :class:`IndexerParams` (a build's static parameters),
:meth:`IndexerParams.shape` and :func:`group_chunks` (which branches a build and a row group
take), the spans, chunks and slabs -- is :mod:`tilesim.device._dsa_indexer_plan`, re-exported
here. Private; importing it needs neither torch nor pypto.
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
from tilesim.device import backend as _backend
from tilesim.device._dsa_indexer_plan import (  # the host-side plan, re-exported
    ROW_SPANS,
    SLAB_GATHER_SOCS,
    IndexerParams,
    chunk_unroll,
    gathers_in_slab,
    group_chunks,
    slabs,
    span_count,
)
from tilesim.device._dsa_indexer_select import keep_span, select_row, span_topk, visible_only
from tilesim.device._lazy import require_pypto
from tilesim.shared.dsa_indexer import INDEX_HEADS as HEADS  # 64 index heads
from tilesim.shared.dsa_indexer import INT8_QK_SCALE  # 2^-11
from tilesim.shared.layouts.index_cache import INDEX_DIM as DIM  # 128

#: rows of the score stage's vector tiles
TERM_ROWS = 8
#: the INT8 path's V1: rows of one FP16 load of the C1 values (``[32, 1024]``: 64 KiB), and
#: the split of a slab's columns for its FP32 terms and head-sum tree (``[8, 256]`` tiles);
#: the FP8 path's FP32 logits keep ``[TERM_ROWS, vec_cols]`` tiles (docs/ops/dsa_indexer.md,
#: "Kernel", for the variants measured)
INT8_LOAD_ROWS, INT8_TERM_SPLIT = 32, 4
#: ``sg_set_scope`` of the FP8 path's key-scale gather of a chunk (``+ part``)
KSCALE_SCOPE = 7
#: ``sg_set_scope`` of the score slabs: ``SLAB_SCOPE + (part * rows + row) * MAX_SLABS + slab``
SLAB_SCOPE, MAX_SLABS = 100, 100
#: the jit options of the ``many_groups`` build (:data:`BUILD_MERGES` has the merges of the
#: others): PyPTO's own indexer example's stitch 128 (the cost model's machine crashes
#: above 128) and scheduling mode 1; an L1 reuse of 32 (pypto-gym's is 16), which packs 32
#: blocks' C1 matmuls (one copy of the query rows) into one cube task: a cube task is one key
#: page copy per block whatever the merge, so the merge sets how many tasks (each with its
#: scheduling gap) a chunk's blocks take, and 32 blocks are exactly the columns of one V1
#: task of a row (4 slabs of 1024), which then waits for one cube task instead of two; and the
#: vector n-buffer merge of 4, which packs 4 identically shaped vector subgraphs (V1 slabs)
#: into one vector task: a quarter of the V1 tasks, so a quarter of the successor edges that
#: the weights and key-scale tasks resolve one by one on the scheduler thread that polled them
#: (the measured variants of both: docs/ops/dsa_indexer.md, "Kernel")
L1_REUSE, VEC_MERGE = 32, 4
JIT = (
    ("runtime", "stitch_function_max_num", 128),
    ("runtime", "device_sched_mode", 1),
    ("pass", "cube_l1_reuse_setting", ((-1, L1_REUSE),)),
    ("pass", "vec_nbuffer_setting", ((-1, VEC_MERGE),)),
)
#: per build (:data:`tilesim.shared.dsa_indexer.KERNEL_BUILDS`, picked by the call's block
#: visits, :func:`tilesim.shared.dsa_indexer.kernel_build`): its L1 reuse (blocks per cube
#: task) and vector n-buffer merge (V1 slabs per vector task). A call of few row groups makes
#: few cube and V1 tasks, so the cores idle in the last wave of long ones and the selection
#: waits for the last long V1 task: smaller tasks end the score stage sooner there (measured:
#: docs/ops/dsa_indexer.md, "Builds by row groups"). Task merges only: the same bits
BUILD_MERGES = {"few_groups": (8, 1), "some_groups": (16, 2),
                "many_groups": (L1_REUSE, VEC_MERGE)}  # fmt: skip
READY_ON_HOST = ("block_table", "seq_lens")


# ----------------------------------------------------------------------------- scores
def c1_tiles(pypto, m: int, bs: int) -> None:
    """The cube tiles of C1 (``[m, 128] @ [128, bs]``, one K step): shared with the probe."""
    pypto.set_cube_tile_shapes([m, m], [DIM, DIM], [bs, bs])


def head_sum(pypto, t, w: int, tile_cols: int):
    """``sum_h t[h]`` of FP32 ``t [64, w]`` as a fixed pairwise tree: ``t = t[:32] + t[32:]``,
    then halves of 16, 8, 4, 2, 1 rows -- one IEEE FP32 add per element and level, so the bits
    are the same on every device and in the golden's emulation; vector tiles of up to
    :data:`TERM_ROWS` x ``tile_cols``. Returns ``[1, w]``."""
    n = HEADS
    while n > 1:
        n //= 2
        pypto.set_vec_tile_shapes(min(n, TERM_ROWS), tile_cols)
        t = pypto.add(pypto.view(t, [n, w], [0, 0]), pypto.view(t, [n, w], [n, 0]))
    return t


def term_cols(w: int, p) -> int:
    """Columns of the vector tiles of a ``w``-column slab's FP32 terms and head-sum tree: the
    INT8 path a quarter of the slab (:data:`INT8_TERM_SPLIT`) when ``w`` is a multiple of 64
    (quarters of whole 64-byte FP32 blocks), else, and on the FP8 path, the whole slab."""
    if p.path == "int8" and w % (16 * INT8_TERM_SPLIT) == 0:
        return w // INT8_TERM_SPLIT
    return w


def slab_terms(pypto, d, wcol, w: int, p):
    """V1 before the head sum: FP32 ``[64, w]`` terms of one query row from its C1 output
    ``d`` (INT8: the epilogue's ``FP16(relu(dot) * 2^-11)``; FP8: the FP32 logits) and its
    FP32 ``[64, 1]`` weight column ``wcol`` (:func:`row_weights`). INT8 loads the FP16 values
    as ``[INT8_LOAD_ROWS, w]`` tiles through an exact FP16 ``* 1.0`` and forms the FP32 terms
    from them on narrower tiles (:func:`term_cols`): the load takes a quarter of the copies of
    ``[TERM_ROWS, w]`` tiles (each copy in costs the model a fixed latency whatever its size,
    docs/perf/cost_model.md), and the FP32 tiles stay small enough that the OOO pass does not
    spill (a spill makes the cost model's function builder refuse the function)."""
    if p.path == "int8":
        pypto.set_vec_tile_shapes(INT8_LOAD_ROWS, w)
        v = pypto.mul(d, 1.0)  # FP16, exact: one copy in per INT8_LOAD_ROWS heads
        pypto.set_vec_tile_shapes(TERM_ROWS, term_cols(w, p))
        return pypto.mul(pypto.cast(v, pypto.DT_FP32), wcol)
    pypto.set_vec_tile_shapes(TERM_ROWS, w)
    return pypto.mul(pypto.maximum(d, 0.0), wcol)


def row_weights(pypto, ins, row, p):
    """FP32 ``[64, 1]`` per-head factors of query row ``row``: INT8 ``FP16(q_scale * w)``
    (one FP16 multiply), FP8 the FP32 weights (``+ 0.0``: exact, keeps ``-0.0``). Formed in
    the slab's own vector subgraph: two ``[64, 1]`` copies in, and no task of its own."""
    pypto.set_vec_tile_shapes(HEADS, 1)
    w = pypto.view(ins.weights, [HEADS, 1], [row * HEADS, 0])
    if p.path == "int8":
        w = pypto.mul(pypto.view(ins.q_scale, [HEADS, 1], [row * HEADS, 0]), w)
        return pypto.cast(w, pypto.DT_FP32)
    return pypto.add(w, 0.0)


def gather_kscales(pypto, ins, b, blk0, nb: int, p):
    """FP32 ``[1, nb*bs]`` key scales of the blocks ``blk0 .. blk0+nb-1`` of batch ``b``: one
    ``index_select`` of the scale rows by their block-table entries (a gather reads the cache
    without a copy in)."""
    bs = p.bs
    pypto.set_vec_tile_shapes(1, nb)
    idx = pypto.view(ins.block_table, [1, nb], [b, blk0])
    table = pypto.view(ins.k_scales, [ins.k_scales.shape[0], bs], [0, ins.scale_col0])
    pypto.set_vec_tile_shapes(1, nb, bs)
    sc = pypto.index_select(table, 0, idx)  # [1, nb, bs]
    pypto.set_vec_tile_shapes(1, nb * bs)
    return pypto.cast(pypto.reshape(sc, [1, nb * bs]), pypto.DT_FP32)


def slab_kscales(pypto, ins, b, blk0, c0: int, c: int, p):
    """FP32 ``[1, c]`` key scales of the chunk columns ``c0 .. c0+c-1`` (the chunk's first
    block is ``blk0``): :func:`gather_kscales` of the blocks under the slab, in the slab's
    own vector subgraph (no task of its own)."""
    b0, b1 = c0 // p.bs, -(-(c0 + c) // p.bs)
    ks = gather_kscales(pypto, ins, b, blk0 + b0, b1 - b0, p)
    return pypto.view(ks, [1, c], [0, c0 - b0 * p.bs])


def chunk_kscales(pypto, ins, b, blk0, nb: int, p, part: int):
    """FP32 ``[1, nb*bs]`` key scales of a chunk's blocks (:func:`gather_kscales`) in a vector
    task of its own (``part``: the span of a multi-span chunk). The FP8 path's (its V1
    subgraph, with ``[8, 1024]`` FP32 tiles, fails PyPTO's pass pipeline with the gather
    inside, :func:`slab_kscales`) and the INT8 path's off :data:`SLAB_GATHER_SOCS`."""
    pypto.set_pass_options(sg_set_scope=KSCALE_SCOPE + part)
    ks = gather_kscales(pypto, ins, b, blk0, nb, p)
    pypto.set_pass_options(sg_set_scope=-1)
    return ks


def c1_dots(pypto, qg, kb, m: int, p):
    """One C1 matmul ``[m, 128] @ K_j^T``: INT8 with the fix-pipe epilogue ``FP16(relu(d) *
    2^-11)`` (the dot is an exact integer, so this is one rounding); FP8 the FP32 logits."""
    c1_tiles(pypto, m, p.bs)
    if p.path == "int8":
        ext = {"scale": INT8_QK_SCALE, "relu_type": pypto.ReLuType.RELU}
        return pypto.matmul(qg, kb, pypto.DT_FP16, b_trans=True, extend_params=ext)
    return pypto.matmul(qg, kb, pypto.DT_FP32, b_trans=True)


def chunk_scores(pypto, ins, row0, b, blk0, nb: int, rows: int, p, part: int = 0):
    """Scores ``[1, nb*bs]`` of each of the group's ``rows`` query rows (``row0 ..``) against
    the blocks ``blk0 .. blk0+nb-1`` of batch ``b``: one ``[rows*64, 128] @ K_j^T`` per block
    (every block read once for the whole group; :data:`JIT`'s L1 reuse packs them into cube
    tasks), then per row and ``vec_cols`` columns (the tiling's) one vector subgraph
    (``sg_set_scope``, distinct per ``part``: the span of a multi-span chunk; :data:`JIT`'s
    vector n-buffer merge packs four into one task): the row's weights, the slab's key
    scales (off :func:`gathers_in_slab`: a view of the chunk's, :func:`chunk_kscales`), the
    terms, the head-sum tree, the scaled sums. With the gather in V1, only cube and V1 tasks:
    every other task would read only kernel inputs, and such tasks, ready at the launch, are
    dispatched one by one ahead of the V1 tasks."""
    bs, w, m = p.bs, nb * p.bs, rows * HEADS
    qg = pypto.view(ins.q, [m, DIM], [row0 * HEADS, 0])
    d = pypto.tensor([m, w], pypto.DT_FP16 if p.path == "int8" else pypto.DT_FP32, "li_dots")
    for j in range(nb):
        phys = ins.block_table[b, blk0 + j]
        kb = pypto.view(ins.k_codes, [bs, DIM], [phys * ins.rows_per_block, 0])
        pypto.assemble(c1_dots(pypto, qg, kb, m, p), [0, j * bs], d)
    out = [pypto.tensor([1, w], pypto.DT_FP32, f"li_row{r}") for r in range(rows)]
    kch = None if p.slab_gather else chunk_kscales(pypto, ins, b, blk0, nb, p, part)
    for r in range(rows):
        for j, (c0, c) in enumerate(slabs(w, p.tiling.vec_cols)):
            pypto.set_pass_options(sg_set_scope=SLAB_SCOPE + (part * rows + r) * MAX_SLABS + j)
            wcol = row_weights(pypto, ins, row0 + r, p)
            if kch is None:
                ks = slab_kscales(pypto, ins, b, blk0, c0, c, p)
            else:
                ks = pypto.view(kch, [1, c], [0, c0])
            pypto.set_vec_tile_shapes(TERM_ROWS, c)
            t = slab_terms(pypto, pypto.view(d, [HEADS, c], [r * HEADS, c0]), wcol, c, p)
            s = head_sum(pypto, t, c, term_cols(c, p))
            pypto.set_vec_tile_shapes(1, c)
            pypto.assemble(pypto.mul(s, ks), [0, c0], out[r])
            pypto.set_pass_options(sg_set_scope=-1)
    return out


def score_group(pypto, ins, b, row0, vis0, rows: int, scores, ids, p):
    """C1 + V1 + SEL of the ``rows`` consecutive query rows ``row0 ..`` of batch ``b`` (row
    ``i`` sees ``vis0 + i`` tokens) over the last row's ``ceil(visible / bs)`` blocks, in
    chunks of ``p.unroll`` blocks (``pypto.loop_unroll``; the whole row, then a whole span
    first). A chunk below a span writes the columns each row sees (``valid_shape``; the rest
    keeps the caller's -inf); a chunk of whole spans selects each row's span candidates from
    its own scores, span by span, and writes each row's span whole from that top-k's input
    (in the span's top-k task; no copy task per row and span): its last span masked to the
    columns the row sees (:func:`visible_only`, ``-inf`` as the caller's), the spans before
    it as computed -- every row of a group (one or two consecutive rows, the first seeing at
    most one token fewer) sees every column before the group's last block, which is in the
    last chunk's last span. The span the smaller chunks end (if any) selects from the
    written rows, then each row merges its candidates (:func:`select_row`). Nothing runs
    before the block loop (the chunk views the query rows, each V1 subgraph forms its row's
    weights; the candidates of spans past the group are masked in :func:`select_row`): a
    full-context row group is two root-function calls, its chunk and its selection."""
    bs, k, sb = p.bs, p.topk, p.span_blocks
    nblk = (vis0 + rows - 1 + bs - 1) // bs
    cand = None
    if p.select:  # per row: values, negated positions of each span's top-k
        m = p.spans * k
        pypto.set_vec_tile_shapes(1, min(m, p.tiling.topk_tile))
        cand = [pypto.tensor([rows, m], pypto.DT_FP32, f"li_cand{i}") for i in range(2)]
    for c0, u in pypto.loop_unroll(0, nblk, 1, name=f"LI_CHUNK{rows}", idx_name=f"c{rows}",
                                   unroll_list=list(p.unroll)):  # fmt: skip
        parts = max(1, u // sb)  # the chunk's spans (one part below a span)
        for part in range(parts):
            pb, pu = c0 + part * sb, min(u, sb)
            out = chunk_scores(pypto, ins, row0, b, pb, pu, rows, p, part)
            for i, s in enumerate(out):
                if cand is None or pu < sb:
                    n = (vis0 + i - pb * bs).max(0).min(pu * bs)
                    pypto.assemble(pypto.view(s, [1, pu * bs], [0, 0], valid_shape=[1, n]),
                                   [row0 + i, pb * bs], scores)  # fmt: skip
                    continue
                span = pb // sb
                src = s if part < parts - 1 else visible_only(pypto, ins, s, span * p.span,
                                                              vis0 + i, p)  # fmt: skip
                pypto.assemble(src, [row0 + i, pb * bs], scores)
                keep_span(pypto, span_topk(pypto, ins, src, span, p), cand, i, span, k)
    if cand is None:
        return
    tail = (nblk % sb).min(1)  # a span the smaller chunks end
    for _t in pypto.loop(0, tail, 1, name=f"LI_TAIL{rows}", idx_name=f"t{rows}"):
        span = nblk // sb
        for i in range(rows):
            pypto.set_vec_tile_shapes(1, min(p.span, p.tiling.topk_tile))
            src = pypto.view(scores, [1, p.span], [row0 + i, span * p.span])
            keep_span(pypto, span_topk(pypto, ins, src, span, p), cand, i, span, k)
    written = (nblk + sb - 1) // sb  # spans with candidates; the rest are past the group
    for i in range(rows):
        select_row(pypto, ins, cand, i, row0 + i, vis0 + i, written, ids, p)


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
        for g in pypto.loop(0, s1 // 2, 1, name="LI_PAIR", idx_name="g"):
            r0 = 2 * g
            vis0 = seq - (s1 - 1 - r0)
            vis0.as_variable()
            score_group(pypto, ins, b, b * s1 + r0, vis0, 2, scores, ids, p)
        for _g in pypto.loop(0, s1 % 2, 1, name="LI_SINGLE", idx_name="g1"):
            score_group(pypto, ins, b, b * s1 + s1 - 1, seq, 1, scores, ids, p)


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
        negpos: pypto.Tensor([1, pypto.STATIC], pypto.DT_FP32),  # [1, width + 1]: -position
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


#: the most blocks per cube task of a build whose whole span has fewer than 4 x :data:`L1_REUSE`
#: blocks (pypto-gym's L1 reuse): there an ``L1_REUSE``-block cube task would hold most of a
#: short row's blocks in one task on one core
SHORT_SPAN_L1_REUSE = 16


def build_jit(params: IndexerParams, build: str = "many_groups") -> tuple:
    """:data:`JIT` with the two task merges of ``build`` (:data:`BUILD_MERGES`), the L1 reuse
    at most :data:`SHORT_SPAN_L1_REUSE` when a whole span of ``params`` has fewer than ``4 *
    L1_REUSE`` blocks (tables of a few thousand columns)."""
    from tilesim.shared.dsa_indexer import KERNEL_BUILDS
    from tilesim.shared.validate import check_choice

    reuse, merge = BUILD_MERGES[check_choice(build, "build", KERNEL_BUILDS)]
    if params.span_blocks < 4 * L1_REUSE:
        reuse = min(reuse, SHORT_SPAN_L1_REUSE)
    merges = {"cube_l1_reuse_setting": ((-1, reuse),), "vec_nbuffer_setting": ((-1, merge),)}
    return tuple((kind, key, merges.get(key, val)) for kind, key, val in JIT)


def build(params: IndexerParams, static_dims: tuple, build_name: str = "many_groups",
          jit: tuple | None = None):  # fmt: skip
    """The jit kernel of ``params.path`` on this process's target, built once per
    (params, static dims = cache rows and block-table width, options; ``None``:
    :func:`build_jit` of ``build_name``) (:func:`tilesim.device.backend.compiled`); batch,
    ``s1`` and every length are runtime values."""
    jit = build_jit(params, build_name) if jit is None else jit
    return _backend.compiled_jit(
        "dsa_indexer", (params.key, tuple(static_dims)), jit,
        lambda: _sources(require_pypto())[params.path], ready_on_host=READY_ON_HOST)  # fmt: skip


__all__ = [
    "BUILD_MERGES",
    "JIT",
    "READY_ON_HOST",
    "ROW_SPANS",
    "SLAB_GATHER_SOCS",
    "IndexerParams",
    "build",
    "build_jit",
    "c1_tiles",
    "chunk_unroll",
    "gathers_in_slab",
    "group_chunks",
    "slabs",
    "head_sum",
    "span_count",
]
