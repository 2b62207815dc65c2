"""The ``@pypto.frontend.jit`` builders of the MSA lightning indexer -- the score kernel
(:func:`build_kernel`), the fused block-max kernel (:func:`build_block_max_kernel`) and the
fused select kernel (:func:`build_select_kernel`) -- and their kernel-body helpers. The public
ops and their host glue are :mod:`tilesim.device.msa_indexer` (whose docstring describes the
kernels and the ranking rule).

Private; importing it needs neither torch nor pypto (a kernel is built on first call).
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto
from tilesim.device._msa_tiles import SEED_RUNTIME, l0_tile
from tilesim.device._pypto_common import jit_options, without
from tilesim.shared.msa_indexer import BY, DIM, NIDX, NOT_CANDIDATE, NPAD, TOPK  # op's sizes

NEG_INF = float("-inf")  # the score of a key that takes no part in the block max
NAN_OFFSET = float(1 << 20)  # added to the tie id of a NaN block: after every number

#: the seeds' jit options of the indexer kernel (hicann/pypto-gym,
#: src/pypto_gym/ops/pypto_tensor/minimax/minimax_m3_msa_indexer_impl.py) as a hashable spec
#: (:func:`tilesim.device._pypto_common.jit_options`); the sweep: docs/ops/msa.md#kernels
SEED_JIT = (
    *SEED_RUNTIME,
    ("pass", "cube_l1_reuse_setting", ((-1, 4),)),
    ("pass", "vec_nbuffer_setting", ((-1, 2),)),
)
#: the options the kernels run with, the sweep's verdict (docs/ops/msa.md#kernels): all but the L1
#: reuse setting, which makes the cost model slower on both SoCs (the rest it is indifferent to)
JIT = without(SEED_JIT, "cube_l1_reuse_setting")


def _tile_scores(pypto, q_pad, idx_k, k0, w: int):
    """Inside a kernel body: ``fp32(q_pad @ idx_k[k0:k0+w]^T)`` ``[16, w]`` (one K step)."""
    kt = pypto.view(idx_k, [w, DIM], [k0, 0])
    pypto.set_cube_tile_shapes([NPAD, NPAD], [DIM, DIM], [l0_tile(w, 256), w])
    s = pypto.matmul(q_pad, kt, pypto.DT_FP32, b_trans=True)
    pypto.set_vec_tile_shapes(NPAD, w)
    return s


def _key_loops(pypto, idx_k, ktile: int):
    """The key tiles of a dynamic ``idx_k`` as two ``pypto.loop`` s: whole ``ktile`` tiles,
    then the remaining 128-key blocks one by one. Yields ``(k0, w)`` (``k0`` symbolic, ``w``
    static) -- the body is traced once per loop, so ``nb`` stays a runtime value."""
    nkeys = idx_k.shape[0]
    full = nkeys // ktile
    for t in pypto.loop(0, full, 1, name="LOOP_KTILE", idx_name="t"):
        yield t * ktile, ktile
    tail = (nkeys - full * ktile) // BY
    for j in pypto.loop(0, tail, 1, name="LOOP_KBLOCK", idx_name="j"):
        yield full * ktile + j * BY, BY


def _kept_tiles(pypto, q_pad, idx_k, key_keep, ktile: int):
    """The key tiles of :func:`_key_loops` with their scores (:func:`_tile_scores`) and the
    ``[1, w]`` view of the bool ``key_keep`` over their keys: yields ``(k0, w, s, keep)``."""
    for k0, w in _key_loops(pypto, idx_k, ktile):
        s = _tile_scores(pypto, q_pad, idx_k, k0, w)
        yield k0, w, s, pypto.view(key_keep, [1, w], [0, k0])


@_backend.compile_once("msa_indexer_scores")
def build_kernel(ktile: int, jit=JIT):
    """The ``@pypto.frontend.jit`` score kernel for one key tile, built once
    (:func:`tilesim.device.backend.compiled`); ``nb`` is the dynamic first axis of
    ``idx_k`` (and the last of ``scores``)."""
    pypto = require_pypto()

    @pypto.frontend.jit(**jit_options(jit))
    def msa_indexer_scores_kernel(
        q_pad: pypto.Tensor([pypto.STATIC, pypto.STATIC], pypto.DT_BF16),  # [16, 128]
        idx_k: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # [nb*128, 128]
        scores: pypto.Tensor([pypto.STATIC, pypto.DYNAMIC], pypto.DT_FP32),  # [16, nb*128]
    ):
        for k0, w in _key_loops(pypto, idx_k, ktile):
            s = _tile_scores(pypto, q_pad, idx_k, k0, w)
            pypto.assemble(s * 1.0, [0, k0], scores)

    return msa_indexer_scores_kernel


@_backend.compile_once("msa_indexer_block_max")
def build_block_max_kernel(ktile: int, jit=JIT):
    """Score kernel with the block max fused in (the seeds' "next step"): per key tile
    ``S = where(key_keep, fp32(q_pad @ K_tile^T), -inf)`` (``key_keep`` bool, False for keys at
    or beyond ``seq_len``: a select, so NaN in those key rows vanishes), then the max over each
    128-key block, written to ``[16, nb]`` FP32. ``max`` is exact, so the result equals the
    block max of the full scores; the output shrinks 128-fold (built once; ``nb`` dynamic)."""
    pypto = require_pypto()

    @pypto.frontend.jit(**jit_options(jit))
    def msa_indexer_block_max_kernel(
        q_pad: pypto.Tensor([pypto.STATIC, pypto.STATIC], pypto.DT_BF16),  # [16, 128]
        idx_k: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # [nb*128, 128]
        key_keep: pypto.Tensor([pypto.STATIC, pypto.DYNAMIC], pypto.DT_BOOL),  # [1, nb*128]
        block_max: pypto.Tensor([pypto.STATIC, pypto.DYNAMIC], pypto.DT_FP32),  # [16, nb]
    ):
        for k0, w, s, keep in _kept_tiles(pypto, q_pad, idx_k, key_keep, ktile):
            s = pypto.where(keep, s, NEG_INF)
            for j in range(w // BY):  # the blocks of this tile (static)
                pypto.set_vec_tile_shapes(NPAD, BY)
                blk = pypto.view(s, [NPAD, BY], [0, j * BY])
                pypto.assemble(pypto.amax(blk, dim=-1, keepdim=True), [0, k0 // BY + j], block_max)

    return msa_indexer_block_max_kernel


def _tile_block_max(pypto, s, keep, k0, w: int, block_max) -> None:
    """Inside a kernel body: the 4 index heads of one key tile's scores ``s`` ``[16, w]``, the
    keys past ``seq_len`` SET to -inf (``keep`` ``[1, w]`` bool), the max over each 128-key
    block by one ``reshape`` + ``amax`` per tile, assembled into ``block_max[:, k0/128:]``.
    One task pair per tile instead of one per block (fewer tasks: docs/perf/journal.md)."""
    pypto.set_vec_tile_shapes(NIDX, w)
    s = pypto.where(keep, pypto.view(s, [NIDX, w], [0, 0]), NEG_INF)
    s = pypto.reshape(s, [NIDX, w // BY, BY])
    pypto.set_vec_tile_shapes(NIDX, w // BY, BY)
    pypto.assemble(pypto.amax(s, -1), [0, k0 // BY], block_max)


def _rank_inputs(pypto, hm4, order, rows: int):
    """Inside a kernel body: the ranking's start ``(score, tie)`` ``[rows, W]`` from the
    per-head maxima ``hm4`` ``[4, W]`` and the tie ids ``order`` ``[1, W]`` (block id, or
    :data:`NOT_CANDIDATE` for the local block and the padding). NaN is explicit, not left to
    ``amax``: a block with a NaN maximum (in any head, for ``rows == 1``) scores -inf and gets
    the tie id ``id + NAN_OFFSET``, so it ranks after every number, -inf included, lower id
    first -- the place NumPy's stable ``argsort`` gives it in the shared rule."""
    nan = pypto.ne(hm4, hm4)
    score = pypto.where(nan, NEG_INF, hm4)
    if rows == 1:  # head_reduce="max": max over the index heads
        score = pypto.amax(score, 0, keepdim=True)
        nan = pypto.gt(pypto.amax(pypto.where(nan, 1.0, 0.0), 0, keepdim=True), 0.5)
        score = pypto.where(nan, NEG_INF, score)
    score = pypto.where(pypto.lt(order, NOT_CANDIDATE), score, NEG_INF)
    tie = pypto.where(nan, order + NAN_OFFSET, order)
    return score, tie


def _rank_rows(pypto, score, tie, ids) -> None:
    """Inside a kernel body: the ``TOPK - 1`` best blocks of each row, written as INT32 to
    ``ids[:, :TOPK-1]``. Round by round: ``m`` = the row max, the pick = the smallest tie id
    among the blocks scoring ``m`` (so equal scores: lower block id first), then the pick
    leaves the race (score -inf, tie id :data:`NOT_CANDIDATE`). Exact: only max / min /
    compares / selects, no arithmetic on the scores."""
    picks = []
    for r in range(TOPK - 1):  # static: 15 rounds
        m = pypto.amax(score, -1, keepdim=True)
        p = pypto.amin(pypto.where(pypto.eq(score, m), tie, NOT_CANDIDATE), -1, keepdim=True)
        picks.append(p)
        if r < TOPK - 2:
            hit = pypto.eq(tie, p)
            score = pypto.where(hit, NEG_INF, score)
            tie = pypto.where(hit, NOT_CANDIDATE, tie)
    p = pypto.concat(picks, -1)
    p = pypto.where(pypto.ge(p, NAN_OFFSET), p - NAN_OFFSET, p)  # the NaN blocks' ids
    pypto.assemble(pypto.cast(p, pypto.DT_INT32), [0, 0], ids)


@_backend.compile_once("msa_indexer_select")
def build_select_kernel(ktile: int, width: int, rows: int, jit=JIT):
    """The fused kernel of ``rank="device"``: the scores and the seq_len select of the
    block-max kernel (:func:`build_block_max_kernel`), the block maxima of the 4 heads by
    :func:`_tile_block_max` into the ``[4, nb]`` scratch ``block_max``, then
    the ranking on the device (:func:`_rank_inputs`, :func:`_rank_rows`) over a row padded to
    the static ``width`` (a :data:`RANK_WIDTHS` bucket, ``nb <= width``); ``rows`` 1
    (``head_reduce="max"``) or 4 (``"none"``). Writes ``ids[:, :15]``; column 15 (the local
    block ``nb - 1``) is the caller's. Built once per (key tile, width, rows); ``nb`` dynamic."""
    pypto = require_pypto()

    @pypto.frontend.jit(**jit_options(jit))
    def msa_indexer_select_kernel(
        q_pad: pypto.Tensor([pypto.STATIC, pypto.STATIC], pypto.DT_BF16),  # [16, 128]
        idx_k: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # [nb*128, 128]
        key_keep: pypto.Tensor([pypto.STATIC, pypto.DYNAMIC], pypto.DT_BOOL),  # [1, nb*128]
        order: pypto.Tensor([pypto.STATIC, pypto.STATIC], pypto.DT_FP32),  # [1, width]
        block_max: pypto.Tensor([pypto.STATIC, pypto.DYNAMIC], pypto.DT_FP32),  # [4, nb]
        ids: pypto.Tensor([pypto.STATIC, pypto.STATIC], pypto.DT_INT32),  # [rows, 16]
    ):
        nb = block_max.shape[1]
        for k0, w, s, keep in _kept_tiles(pypto, q_pad, idx_k, key_keep, ktile):
            _tile_block_max(pypto, s, keep, k0, w, block_max)
        pypto.set_vec_tile_shapes(NIDX, width)
        hm4 = pypto.view(block_max, [NIDX, width], [0, 0], valid_shape=[NIDX, nb])
        order = pypto.view(order, [1, width], [0, 0], valid_shape=[1, nb])  # same valid shape
        score, tie = _rank_inputs(pypto, hm4, order, rows)
        _rank_rows(pypto, score, tie, ids)

    return msa_indexer_select_kernel


__all__ = [
    "JIT",
    "NAN_OFFSET",
    "NEG_INF",
    "SEED_JIT",
    "build_block_max_kernel",
    "build_kernel",
    "build_select_kernel",
]
