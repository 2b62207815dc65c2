"""MiniMax-M3 MSA block-sparse decode on Ascend — PyPTO kernel + wrapper.

Same name and arguments as the golden ``msa_sparse_decode`` (``reference/msa_decode.py``),
plus ``gather`` / ``backend`` / ``soc``; NumPy arrays or torch tensors in, the same kind out
(:mod:`tilesim.device.backend`). The arguments are checked by :mod:`tilesim.shared.msa_select`,
the functions the reference uses (``validate=False``: metadata only, no host copy); the
keep-mask (the same rule, tested equal) and the page table are built on the inputs' device.

Kernel loop nest (one compile per model configuration and tiling: batch and ``nb`` are
runtime values): a ``pypto.loop_unroll`` over the batch rows (bodies of :data:`BATCH_UNROLL`
rows, run side by side in a body), per batch row ``b`` and KV head ``h`` (``outer = b*HKV +
h``, static inside a body), the ``G = HQ/HKV`` (16) query heads of the group on the cube M
axis::

    for each split range of chunks (MsaTiling.kv_splits; one range = the plain loop):
      for c in the range's NTILE-wide chunks of the topk*128 keys (the last may be partial):
        K_c, V_c = the chunk's keys/values            "device": K as page views, V by
                                                      gather_in_ub; "host": compact copy
        S   = fp32(Q[G,128] @ K_c^T)                  cube, FP32 out, one matmul per page
                                                      (page_pieces): the same dot products
        S   = S * SCALE                               FP32, SCALE = fp32(1/sqrt(128))
        S   = where(keep, S, -3e38)                   FP32 select, keep = bool keep-mask
                                                      (built on the device: device_keep_mask)
        m_c = rowmax(S); P = exp(S - m_c); l_c = rowsum(P)     FP32, P unrounded
        V_c = where(keep, V_c, 0)                     "paged"/"host": dropped keys' V rows
                                                      zeroed ("device": never read, below)
        O_c = fp32(bf16(P) @ V_c)                     cube, FP32 accumulation
        the range's first chunk is its state (m, l, O); later chunks merge online (FP32)
    fold ranges 1, 2, .. into range 0's state, in order (the same online merge)
    out = bf16(O / l)                                 +0 where the batch row keeps no key

The merges run after the chunks, in ONE vector task per pair (:func:`_merge`): every chunk
writes ``m_c`` / ``l_c`` into the pair's ``[2*n*G, 1]`` column tensor and ``O_c`` into its
``[n*G, D]`` tensor; the task brings both in with one copy each, computes the merge tree's
``(m, l)`` half and weights (:func:`tilesim.device._msa_tiles.merge_plan`), then the ``O``
half (one multiply of every ``O_c`` by its weight, then the chained sums) -- the same
operations on the same values as merging chunk by chunk.

C1 reads K where it lies: one matmul per page piece of the chunk
(:func:`tilesim.device._msa_tiles.page_pieces`; a whole 128-key page at the default NTILE),
its K operand a view of the page's rows, the products assembled into the chunk's ``S`` by
columns. Each score is the same one dot product over D as in a single matmul over the chunk,
so the numbers do not change; what changes is that no gather task stands between the root
and C1 (docs/device.md, block-sparse decode).

The rounding points are the reference's one for one (split-KV included:
:mod:`tilesim.shared.msa_decode`), and so is the NaN-robust masking: a dropped key's score is
SET to -3e38 (a select, not the seeds' ``S*m + (1-m)*(-3e38)``, where ``0*NaN = NaN``), and
its V row is either SET to zero (``"paged"``, ``"host"``: the rows
:func:`tilesim.shared.msa_decode.decode_read_mask` says P.V does not read) or never read
(``"device"``: the gather position of a dropped key is the row's first kept key,
:func:`_redirected`; its P is exactly 0, and a row that keeps no key -- the row whose final
max is the mask value -3e38 -- is set to +0 by a final per-row select). So whatever a
dropped slot holds -- the tail of the current block past ``seq_len``, a selected future
block, garbage or NaN in unwritten cache rows -- never reaches the output (blocks that are
not selected are never read). On finite inputs both forms give the bits of the multiply
form (``tests/device/test_sim_nan_poison.py``).

Three ways to bring the selected blocks in:

* ``gather="device"`` (default): the kernel reads the paged cache itself. ``k_blocks`` and
  ``v_blocks`` are viewed as rows ``[(b*HKV + h)*nb*128 + blk*128 + t]``, addressed through the
  global page table (:func:`page_table`: ``(b*HKV + h)*nb + block_ids[b]``, built on the
  inputs' device). K: C1 takes each page piece as a view whose row offset comes from the page
  table (read by the control flow). V: per chunk ``gather_in_ub`` takes the chunk's logical
  key positions (``slot*128 + t``) and the pair's page-table row and fetches the rows into UB
  (:func:`_gather_chunk`). No K/V copy.
* ``gather="paged"``: K as in ``"device"``; V's page pieces are read the same way and
  assembled into the chunk's V tile -- no gather instruction, pages are contiguous.
* ``gather="host"``: the seeds' scheme — the wrapper copies the selected blocks into compact
  ``[B*HKV*topk*128, 128]`` K/V buffers (a torch gather of ``2*B*HKV*topk*32 KB`` on the
  inputs' device) and the kernel views them.

All three give identical bits (tested); the cost-model comparison is in ``docs/device.md``.

Where the seeds' kernel is wrong at the edges, this one is right (and the tests check it): a
last partial chunk is processed when ``topk*128`` is not a multiple of NTILE (the seeds floor
the chunk count and drop those keys; with ``topk < 4`` they write nothing); ``seq_len`` may be
one int per batch row; a batch row whose every key is masked returns zeros (the seeds' kernel
returns the mean of the gathered V there).

Tiling: ``MsaTiling.from_env()`` (``MSA_NTILE``, default 512, same on both SoCs because it
changes the numbers; ``kv_splits`` from :func:`tilesim.shared.msa_decode.split_tiling` when
``tiling=None``), the per-SoC V-gather tile :data:`V_GATHER_ROWS` (``MSA_V_GATHER_ROWS``) and
the V-select tile of ``"paged"`` / ``"host"``, :data:`GATHER_ROWS` (``MSA_GATHER_ROWS``, which,
set alone, also sets the V-gather tile).
Importing this module needs neither torch nor pypto.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto, require_torch
from tilesim.device._msa_tiles import (
    L1_REUSE_BY_ROWS,
    SEED_RUNTIME,
    c1_cube_tiles,
    c2_cube_tiles,
    eval_tree,
    jit_options,
    merge_plan,
    operation_options,
    page_pieces,
    without,
)
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.msa_decode import (
    check_decode_inputs,
    decode_keep_mask,
    split_ranges,
    split_tiling,
)
from tilesim.shared.soc import DEFAULT_SOC, MSA_DEVICE_TILES, msa_device_tile
from tilesim.shared.tiling import MsaTiling
from tilesim.shared.validate import (
    check_bool,
    check_choice,
    check_instance,
    env_mapping,
    is_array,
    shape_of,
)

OP_NAME = "msa_sparse_decode"
GATHERS = ("device", "paged", "host")
_CFG = MINIMAX_M3.msa
BY = _CFG.block_size  # 128 keys per block
LARGE_NEG = _CFG.decode_mask_neg  # -3e38


#: the V-select tile of ``gather="paged"`` / ``"host"`` per SoC (rows; set alone, the env
#: override also sets the V-gather tile); defaults and override in :mod:`tilesim.shared.soc`
GATHER_ROWS = MSA_DEVICE_TILES["MSA_GATHER_ROWS"][0]


def gather_rows(soc=DEFAULT_SOC, env=None) -> int:
    """GATHER_ROWS of ``soc`` (``MSA_GATHER_ROWS`` overrides; see
    :func:`tilesim.shared.soc.msa_device_tile`)."""
    return msa_device_tile("MSA_GATHER_ROWS", soc, env)


#: rows of one ``gather="device"`` V-gather tile per SoC family (``MSA_V_GATHER_ROWS`` of
#: :data:`~tilesim.shared.soc.MSA_DEVICE_TILES`): V is needed only by P.V, so its gather may
#: move a whole 512-key chunk in few, large tiles: few gather tasks leave the root
#: (docs/device.md, block-sparse decode)
V_GATHER_ROWS = MSA_DEVICE_TILES["MSA_V_GATHER_ROWS"][0]


def v_gather_rows(soc=DEFAULT_SOC, env=None) -> int:
    """The V-gather tile of ``soc``: ``MSA_V_GATHER_ROWS`` (env, else :data:`V_GATHER_ROWS`);
    when only ``MSA_GATHER_ROWS`` is set, that one."""
    env = env_mapping(env)
    if "MSA_GATHER_ROWS" in env and "MSA_V_GATHER_ROWS" not in env:
        return gather_rows(soc, env)
    return msa_device_tile("MSA_V_GATHER_ROWS", soc, env)


# ----------------------------------------------------------------------------- kernel
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
#: hashable spec (:func:`tilesim.device._msa_tiles.jit_options`); the cost-model sweep and
#: which of them are kept: docs/device.md, "JIT options of the MSA kernels"
SEED_JIT = (
    *SEED_RUNTIME,
    ("pass", "cube_l1_reuse_setting", ((-1, 3),)),
    ("pass", "cube_nbuffer_setting", ((-1, 4),)),
    ("pass", "vec_nbuffer_setting", ((-1, 1),)),
    ("operation", "combine_axis", True),
)
#: the options the kernel runs with, the sweep's verdict (docs/device.md): the seeds' runtime
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


def _chunk_kv(pypto, k, v, block_table, positions, outer, c0: int, w: int, p: _Static,
              spread: bool):  # fmt: skip
    """The chunk's K pieces (``[(view [n, D], n), ...]``, contiguous runs of K rows in key
    order, for :func:`_scores`) and its V ``[w, D]`` BF16 tile, of pair ``outer``, by the
    ``gather`` variant. ``"device"`` / ``"paged"``: one piece per page piece
    (:func:`page_pieces`), its rows starting at ``block_table[outer, slot]*128 + t0`` of the
    paged cache (a page-table value read by the control flow); ``"host"``: the chunk's rows
    of the compact copy, one piece (the seeds' one C1 matmul per chunk). ``spread``
    (``"device"``, bodies of several batch rows): the chunk's page-table row goes through a
    producer task first (an exact INT32 ``+ 0``), so its V gather is that task's successor
    rather than a source of the root function, whose successor edges one AICPU thread
    resolves one by one (docs/device.md, block-sparse decode)."""
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
    tree (:func:`tilesim.device._msa_tiles.merge_plan`) runs on ``[G, 1]`` columns; the ``O``
    half is one ``[n*G, D]`` multiply by the chunks' weights, then the chained sums -- the
    values of the chunk loop's merges, operation for operation."""
    g, n = p.g, len(p.bounds)
    pypto.set_pass_options(sg_set_scope=scope)
    pypto.set_vec_tile_shapes(2 * n * g, 8)
    ml = ml * 1.0  # the whole column tensor in one copy; the views below are UB views
    pypto.set_vec_tile_shapes(g, 8)
    m_c = [pypto.view(ml, [g, 1], [c * g, 0]) for c in range(n)]
    l_c = [pypto.view(ml, [g, 1], [(n + c) * g, 0]) for c in range(n)]
    plan = merge_plan(pypto, m_c, l_c, p.ranges)
    cols = [w for w in plan.pre if w is not None] + plan.chained + [plan.l]
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
    res = eval_tree(plan.tree, prods, wv[n if n > 1 else 0 : -1]) / wv[-1]
    if p.gather == "device":
        # a row that keeps no key read stand-in rows: its output is +0. It is the row whose
        # final max is the mask value (every score selected away); ``l - l`` is 0, or NaN when
        # a NaN reached l, so such a row still shows its NaN
        pypto.set_vec_tile_shapes(g, 8)
        seen = pypto.ne(plan.m + (plan.l - plan.l), LARGE_NEG)
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
                             b * p.hkv + h, p, ub > 1, u * p.hkv + h)  # fmt: skip


#: batch rows per body of the batch loop (``pypto.loop_unroll`` factors)
BATCH_UNROLL = (4, 2, 1)


@_backend.compile_once("msa_sparse_decode")
def build_kernel(hq, hkv, topk, dim, ntile, gather, vrows=128, jit=JIT, kv_splits=1,
                 unroll=BATCH_UNROLL, vg_rows=128, l1_reuse=L1_REUSE_BY_ROWS):  # fmt: skip
    """The ``@pypto.frontend.jit`` kernel for one model configuration and tiling, built once
    (:func:`tilesim.device.backend.compiled`). Batch and ``nb`` are runtime values: a
    ``pypto.loop_unroll`` over the batch rows (``keep``'s dynamic first axis, ``unroll`` rows
    per body), the KV heads static inside it, the chunks in ``kv_splits`` ranges, and the
    cache addressed through the global page ids of ``block_table``; ``l1_reuse``: the L1
    reuse of each body (every factor of ``unroll`` needs one, and pypto's ``loop_unroll``
    always adds 1)."""
    missing = sorted((set(unroll) | {1}) - set(dict(l1_reuse)))
    if missing:
        raise ValueError(f"l1_reuse: expected an entry for every body size, missing {missing}")
    pypto = require_pypto()
    sel = topk * BY
    bounds = tuple((c0, min(ntile, sel - c0)) for c0 in range(0, sel, ntile))  # tail kept
    ranges = tuple(split_ranges(len(bounds), kv_splits))
    p = _Static(hkv, hq // hkv, dim, topk, bounds, ranges, tuple(unroll), gather, vrows,
                dim**-0.5, vg_rows, tuple(l1_reuse))  # fmt: skip
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


# ----------------------------------------------------------------------------- host side
#: the keep-mask of :mod:`tilesim.shared.msa_select` under its former name here
keep_mask = decode_keep_mask


def device_keep_mask(ids, seq):
    """FP32 ``[B, topk*128]`` keep-mask built where ``ids`` live (torch, no host copy): key
    ``t`` of the block in a slot is kept iff ``128*block + t < seq_len`` -- the per-token form
    of :func:`tilesim.shared.msa_decode.decode_keep_mask` (tested equal to it). ``ids``:
    integer ``[B, topk]`` tensor, ``seq``: integer ``[B]`` tensor on the same device."""
    torch = require_torch()
    t = torch.arange(BY, device=ids.device, dtype=torch.int64)
    pos = ids.to(torch.int64)[:, :, None] * BY + t  # [B, topk, 128] absolute key positions
    keep = pos < seq.to(torch.int64).reshape(-1, 1, 1)
    return keep.reshape(ids.shape[0], -1).to(torch.float32)


def page_table(ids, hkv: int, nb: int):
    """INT32 ``[B*HKV, topk]`` global page ids, computed where ``ids`` live: row ``b*HKV + h``
    holds ``(b*HKV + h)*nb + block_ids[b]`` -- the pages of (batch row, KV head) in the cache
    viewed as ``[B*HKV*nb*128, 128]`` rows."""
    torch = require_torch()
    batch = ids.shape[0]
    base = torch.arange(batch * hkv, device=ids.device, dtype=torch.int64).reshape(batch, hkv, 1)
    return (ids.to(torch.int64)[:, None, :] + base * nb).reshape(batch * hkv, -1).to(torch.int32)


def _cache_rows(k_blocks, v_blocks, ids, gather: str, dim: int):
    """K / V as the kernel reads them: the paged cache as rows (``"device"``, ``"paged"``) or
    the seeds' compact copy of the selected blocks (``"host"``, a device-side gather),
    ``[rows, D]``."""
    torch = require_torch()
    if gather in ("device", "paged"):  # the paged cache as rows; the kernel gathers
        return k_blocks.contiguous().reshape(-1, dim), v_blocks.contiguous().reshape(-1, dim)
    dev = k_blocks.device
    bi = torch.arange(k_blocks.shape[0], device=dev)[:, None, None]
    hi = torch.arange(k_blocks.shape[1], device=dev)[None, :, None]
    sel = ids.to(torch.int64)[:, None, :]
    return k_blocks[bi, hi, sel].reshape(-1, dim), v_blocks[bi, hi, sel].reshape(-1, dim)


def _seq_tensor(seq_len, batch: int, dev):
    """``seq_len`` (one int, or an integer array / tensor of ``B`` values) as int64 ``[B]`` on
    ``dev`` (a tensor on ``dev`` is used as it is: no host copy)."""
    torch = require_torch()
    if is_array(seq_len):
        (s,) = _backend.to_tensors(seq_len)
        return s.to(device=dev, dtype=torch.int64).reshape(-1).expand(batch)
    return torch.full((batch,), int(seq_len), dtype=torch.int64, device=dev)


class CallShape(NamedTuple):
    """The sizes of a call and the compile key's shape part."""

    batch: int
    hq: int
    hkv: int
    nb: int
    dim: int
    topk: int


def decode_launch(q, k_blocks, v_blocks, ids, seq, sh: CallShape, tiling: MsaTiling | int,
                  gather: str, soc: str):  # fmt: skip
    """``(kernel, inputs, outputs)`` of one call, built on the inputs' device (no host copy):
    the page table (:func:`page_table`), the positions ``0 .. topk*128-1``, the keep-mask
    (:func:`device_keep_mask`) as bool ``[B, topk*128]`` and the same data as a ``[B*topk*128,
    1]`` column (the V select's; the rows P.V reads, as
    :func:`tilesim.shared.msa_decode.decode_read_mask` without ``seeds_compat``), K / V as the
    ``gather`` variant reads them, and the zeroed BF16 ``[B*HQ, D]`` output. ``soc``: the
    gather tile's SoC; ``tiling``: an :class:`MsaTiling` (NTILE, kv_splits) or an int NTILE
    (unsplit)."""
    torch = require_torch()
    if not isinstance(tiling, MsaTiling):
        tiling = MsaTiling(ntile=tiling)
    dev = q.device
    keep = device_keep_mask(ids, seq) > 0
    table = page_table(ids, sh.hkv, sh.nb)
    positions = _redirected(keep)
    k2, v2 = _cache_rows(k_blocks, v_blocks, ids, gather, sh.dim)
    # the V select's tile: MSA_GATHER_ROWS, capped at the SoC's default (a larger override
    # may still fit a gather, not a [rows, 128] select: 256 fails on the 910B)
    vrows = min(gather_rows(soc), GATHER_ROWS[soc])
    kernel = build_kernel(sh.hq, sh.hkv, sh.topk, sh.dim, tiling.ntile, gather, vrows, JIT,
                          tiling.kv_splits, BATCH_UNROLL, v_gather_rows(soc),
                          L1_REUSE_BY_ROWS)  # fmt: skip
    q2 = q.contiguous().reshape(-1, sh.dim)
    out = torch.zeros(sh.batch * sh.hq, sh.dim, dtype=torch.bfloat16, device=dev)
    return kernel, [q2, k2, v2, table, positions, keep, keep.reshape(-1, 1)], [out]


def _redirected(keep):
    """INT32 ``[B, topk*128]`` V-gather positions of ``gather="device"``: key ``i`` of a row
    where it is kept, else the row's first kept key (0 in a row that keeps none) -- a dropped
    key's V row is never read (its K row is, and its score is selected away), so whatever it
    holds (NaN, garbage) cannot reach P.V, and no V row needs zeroing. Its ``P`` is exactly 0,
    so the stand-in row adds ``+-0`` to a partly kept chunk; a chunk with no kept key enters
    the merge with weight exactly 0."""
    torch = require_torch()
    idx = torch.arange(keep.shape[1], dtype=torch.int64, device=keep.device).expand_as(keep)
    first = keep.to(torch.int8).argmax(dim=1, keepdim=True)  # 0 when the row keeps nothing
    return torch.where(keep, idx, first).to(torch.int32)


def _ids_standin(block_ids, k_blocks):
    """Host stand-in of ``block_ids`` for the shared checks when its values are not read:
    ``0 .. topk-1`` per row (valid and unique whenever ``topk <= nb``)."""
    nb = shape_of(k_blocks, "k_blocks")[2] if len(shape_of(k_blocks, "k_blocks")) == 5 else 1
    if len(shape_of(block_ids, "block_ids")) != 2:
        return _backend.standin(block_ids)
    return _backend.standin(
        block_ids, lambda sh: np.tile(np.arange(sh[1]) % max(nb, 1), (sh[0], 1))
    )


def _check(q, k_blocks, v_blocks, block_ids, seq_len, tiling, gather, validate):
    """The shared checks (:func:`tilesim.shared.msa_decode.check_decode_inputs`); without
    ``validate`` (or on shape-only inputs) on metadata stand-ins for the value arrays."""
    check_choice(gather, "gather", GATHERS)
    tiling = MsaTiling.from_env() if tiling is None else tiling
    check_instance(tiling, "tiling", MsaTiling)
    check_bool(validate, "validate")
    ids, seq = block_ids, seq_len
    shape_only = _backend.is_shape_only(q, k_blocks, v_blocks, block_ids, seq_len)
    if (shape_only or not validate) and is_array(block_ids) and is_array(k_blocks):
        ids = _ids_standin(block_ids, k_blocks)
        seq = _backend.standin(seq_len, lambda sh: np.ones(sh)) if is_array(seq_len) else seq_len
    d = check_decode_inputs(q, k_blocks, v_blocks, ids, seq, block_size=BY)
    return tiling, CallShape(d.batch, d.hq, d.hkv, d.nb, d.dim, d.topk), shape_only


@_backend.graph_safe
def msa_sparse_decode(
    q,
    k_blocks,
    v_blocks,
    block_ids,
    seq_len,
    *,
    tiling: MsaTiling | None = None,
    gather: str = "device",
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
    validate: bool = True,
):
    """Block-sparse decode attention over the selected key blocks (PyPTO kernel).

    Args:
        q: ``[B, HQ, 128]`` BF16 (HQ = 64 in M3); k_blocks, v_blocks: ``[B, HKV, nb, 128, 128]``
            BF16 paged cache; block_ids: ``[B, topk]`` integer ids, unique per row, in
            ``[0, nb)``; seq_len: KV length incl. the current token, one int or an integer
            array / tensor of ``B`` values. NumPy arrays or torch tensors; checked by
            :func:`tilesim.shared.msa_decode.check_decode_inputs` as in the reference.
        tiling: :class:`MsaTiling` (``ntile``, ``kv_splits``); ``None`` =
            ``MsaTiling.from_env()`` with ``kv_splits`` by the shared rule
            (:func:`tilesim.shared.msa_decode.split_tiling` for this shape and ``soc``; give
            the reference that tiling to compare bits). An explicit tiling is used as given.
        gather: ``"device"`` (gather_in_ub + block table in the kernel), ``"paged"`` (page
            views at block-table offsets) or ``"host"`` (the seeds' compact K/V copies, made
            by a device-side gather); same numbers, different data movement.
        backend, soc: :func:`tilesim.device.backend.resolve` (``"auto"``: NPU tensors ->
            ``"npu"``, else an error naming both; ``"sim"``: PyPTO's CPU simulator for ``soc``).
        validate: ``True`` (default) copies ``block_ids`` and a ``seq_len`` array to the host
            for the value checks (range, unique per row, ``1 <= seq_len <= nb*128``);
            ``False`` checks metadata only -- no host copy at all (the keep-mask and the page
            table are built on the inputs' device); out-of-range ids are then undefined.

    Returns:
        BF16 ``[B, HQ, 128]`` of the kind of ``q``; ``backend="sim"`` returns
        ``(out, cost_us)``. FakeTensor / ``meta`` inputs (torch.compile tracing): an empty
        ``[B, HQ, 128]`` BF16 tensor, no data read. Inputs are never modified. Budget against
        the reference: ``docs/device.md`` (## MSA kernels).
    """
    auto_split = tiling is None
    tiling, sh, shape_only = _check(q, k_blocks, v_blocks, block_ids, seq_len, tiling, gather,
                                    validate)  # fmt: skip
    if shape_only:
        check_choice(backend, "backend", _backend.BACKENDS)
        return q.new_empty((sh.batch, sh.hq, sh.dim))
    target = _backend.resolve(backend, soc, q)
    qt, kt, vt, ids = _backend.to_tensors(q, k_blocks, v_blocks, block_ids)
    seq = _seq_tensor(seq_len, sh.batch, qt.device)
    if auto_split:  # the default: the MSA_* env tiling, kv_splits by the shared rule
        tiling = split_tiling(MsaTiling.from_env(), batch=sh.batch, hkv=sh.hkv, topk=sh.topk,
                              soc=target.soc)  # fmt: skip
    kernel, ins, outs = decode_launch(qt, kt, vt, ids.to(qt.device), seq, sh, tiling, gather,
                                      target.soc)  # fmt: skip
    us = _backend.launch(kernel, ins, outs, target)
    return _backend.finish(outs[0].reshape(sh.batch, sh.hq, sh.dim), us, target)


__all__ = [
    "GATHERS",
    "GATHER_ROWS",
    "CallShape",
    "JIT",
    "L1_REUSE_BY_ROWS",
    "SEED_JIT",
    "V_GATHER_ROWS",
    "build_kernel",
    "decode_launch",
    "device_keep_mask",
    "gather_rows",
    "keep_mask",
    "msa_sparse_decode",
    "page_table",
    "v_gather_rows",
]
