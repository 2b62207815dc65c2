"""MiniMax-M3 MSA lightning indexer on Ascend — PyPTO score, block-max and ranking kernels.

Same names and arguments as the goldens ``msa_indexer_scores`` and ``msa_indexer``
(``reference/msa_indexer.py``), plus ``rank`` / ``block_max`` / ``backend`` /
``soc`` / ``validate``; NumPy arrays or torch tensors in, the same kind out
(:mod:`tilesim.device.backend`).

Score kernel (one compile per key tile and SoC; ``nb`` is a runtime value: ``idx_k``'s first
axis is dynamic): the 4 index-query heads zero-padded to 16 cube rows; a ``pypto.loop`` over
the whole key tiles of ``KTILE`` keys, then one over the remaining 128-key blocks, each step
``S = fp32(q_pad @ K_tile^T)`` (cube, FP32 out, one K step of 128), times 1.0 on the vector
unit, assembled into the FP32 ``[16, nb*128]`` score buffer. Every score is one 128-term dot
product, so the key tile width changes the data movement, not the numbers.

Selection, ``rank="device"`` (the default, :func:`build_select_kernel`): the same scores, the
keys at or beyond ``seq_len`` SET to -inf (a select on a bool key mask), the per-block maxima
of the 4 heads, then the rule of :mod:`tilesim.shared.msa_select` on the device -- 15 rounds
of "row max, then the lowest block id scoring it" over a row padded to a static width
(:data:`RANK_WIDTHS`), NaN blocks explicitly last -- and only the INT32 ids are written; they
stay on the device. ``rank="host"`` keeps the former split: the score kernel (``block_max=
"host"``) or the block-max kernel (``"device"``, :func:`build_block_max_kernel`, ``[16, nb]``
maxima) and the shared rule on a host copy. Max, compares and selects are exact, so every
mode gives the same ids from the same FP32 scores, whatever the key rows past ``seq_len``
hold (NaN, inf, garbage; ``tests/device/test_sim_nan_poison.py``). :func:`select_blocks` /
:func:`select_from_head_max` are the shared module's functions, re-exported under their former
names here.

Per-SoC key tile :data:`KTILE` (``MSA_INDEXER_KTILE``). Importing needs neither torch nor pypto.
"""

from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto, require_torch
from tilesim.device._msa_tiles import SEED_RUNTIME, jit_options, l0_tile, without
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.msa_indexer import (
    HEAD_REDUCES,
    IndexerArgs,
    block_head_max,
    check_indexer,
    select_blocks,
    select_from_head_max,
)
from tilesim.shared.soc import DEFAULT_SOC, MSA_DEVICE_TILES, msa_device_tile
from tilesim.shared.validate import check_bool, check_choice, host_array, is_array

_CFG = MINIMAX_M3.msa
BY = _CFG.block_size  # 128
NIDX = _CFG.num_index_heads  # 4
NPAD = _CFG.index_heads_padded  # 16
DIM = _CFG.index_dim  # 128
TOPK = _CFG.topk_blocks  # 16
BLOCK_MAX = ("host", "device")
RANKS = ("device", "host")
NEG_INF = float("-inf")  # the score of a key that takes no part in the block max
#: the device ranking's static row widths (compile buckets): the smallest one ``>= nb`` is
#: used; a row of ``nb`` block scores is a ``valid_shape`` view of that width (an op that
#: touches the padding at all sees tie id NOT_CANDIDATE and score -inf there: it never wins).
#: One bucket: the cost model prices the width at nothing
#: (nb 40: 17.82 µs at 64, 17.85 at 256, 17.87 at 1024), a ``[4, 1024]`` FP32 buffer is 16 KB
#: of UB. ``nb`` beyond it (128K tokens) is ranked on the host (``rank="host"``).
RANK_WIDTHS = (1024,)
NAN_OFFSET = float(1 << 20)  # added to the tie id of a NaN block: after every number
NOT_CANDIDATE = float(1 << 23)  # tie id of the local block, the padding and taken blocks


#: per-SoC defaults and the env override live in :mod:`tilesim.shared.soc`
KTILE = MSA_DEVICE_TILES["MSA_INDEXER_KTILE"][0]


def key_tile(soc=DEFAULT_SOC, env=None) -> int:
    """KTILE of ``soc`` (``MSA_INDEXER_KTILE`` overrides; see
    :func:`tilesim.shared.soc.msa_device_tile`)."""
    return msa_device_tile("MSA_INDEXER_KTILE", soc, env)


#: the seeds' jit options of the indexer kernel (hicann/pypto-gym,
#: src/pypto_gym/ops/pypto_tensor/minimax/minimax_m3_msa_indexer_impl.py) as a hashable spec
#: (:func:`tilesim.device._msa_tiles.jit_options`); the sweep: docs/device.md
SEED_JIT = (
    *SEED_RUNTIME,
    ("pass", "cube_l1_reuse_setting", ((-1, 4),)),
    ("pass", "vec_nbuffer_setting", ((-1, 2),)),
)
#: the options the kernels run with, the sweep's verdict (docs/device.md): all but the L1
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
        for k0, w in _key_loops(pypto, idx_k, ktile):
            s = _tile_scores(pypto, q_pad, idx_k, k0, w)
            s = pypto.where(pypto.view(key_keep, [1, w], [0, k0]), s, NEG_INF)
            for j in range(w // BY):  # the blocks of this tile (static)
                pypto.set_vec_tile_shapes(NPAD, BY)
                blk = pypto.view(s, [NPAD, BY], [0, j * BY])
                pypto.assemble(pypto.amax(blk, dim=-1, keepdim=True), [0, k0 // BY + j], block_max)

    return msa_indexer_block_max_kernel


def _tile_block_max(pypto, s, keep, k0, w: int, block_max) -> None:
    """Inside a kernel body: the 4 index heads of one key tile's scores ``s`` ``[16, w]``, the
    keys past ``seq_len`` SET to -inf (``keep`` ``[1, w]`` bool), the max over each 128-key
    block by one ``reshape`` + ``amax`` per tile, assembled into ``block_max[:, k0/128:]``.
    One task pair per tile instead of one per block (cost model, nb 40: 17.8 vs 24.2 µs)."""
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
        for k0, w in _key_loops(pypto, idx_k, ktile):
            s = _tile_scores(pypto, q_pad, idx_k, k0, w)
            _tile_block_max(pypto, s, pypto.view(key_keep, [1, w], [0, k0]), k0, w, block_max)
        pypto.set_vec_tile_shapes(NIDX, width)
        hm4 = pypto.view(block_max, [NIDX, width], [0, 0], valid_shape=[NIDX, nb])
        order = pypto.view(order, [1, width], [0, 0], valid_shape=[1, nb])  # same valid shape
        score, tie = _rank_inputs(pypto, hm4, order, rows)
        _rank_rows(pypto, score, tie, ids)

    return msa_indexer_select_kernel


def _padded_query(q):
    """``[16, 128]`` BF16: the 4 index heads and 12 zero rows (the cube's M)."""
    torch = require_torch()
    q_pad = torch.zeros(NPAD, DIM, dtype=torch.bfloat16, device=q.device)
    q_pad[:NIDX] = q
    return q_pad


def score_launch(q, k, nb: int, soc: str):
    """``(kernel, inputs, outputs)`` of the score kernel: the padded query, the keys and the
    zeroed FP32 ``[16, nb*128]`` score buffer, on the inputs' device."""
    torch = require_torch()
    scores = torch.zeros(NPAD, nb * BY, dtype=torch.float32, device=q.device)
    return build_kernel(key_tile(soc)), [_padded_query(q), k.contiguous()], [scores]


def block_max_launch(q, k, args: IndexerArgs, soc: str):
    """``(kernel, inputs, outputs)`` of the fused block-max kernel: the padded query, the
    keys, the bool key mask of ``seq_len`` (``[1, nb*128]``, True below it) and the FP32
    ``[16, nb]`` output."""
    torch = require_torch()
    keep = torch.zeros(1, args.nb * BY, dtype=torch.bool, device=q.device)
    keep[0, : args.valid] = True  # keys at or beyond seq_len take no part in the max
    block_max = torch.zeros(NPAD, args.nb, dtype=torch.float32, device=q.device)
    kernel = build_block_max_kernel(key_tile(soc))
    return kernel, [_padded_query(q), k.contiguous(), keep], [block_max]


def rank_width(nb: int) -> int | None:
    """The :data:`RANK_WIDTHS` bucket of ``nb`` blocks (``None``: beyond the last one)."""
    return next((w for w in RANK_WIDTHS if nb <= w), None)


def select_launch(q, k, args: IndexerArgs, soc: str):
    """``(kernel, inputs, outputs)`` of the fused select kernel (``rank="device"``, ``nb > 16``
    and ``nb <= RANK_WIDTHS[-1]``): the block-max kernel's inputs, the tie ids ``order``
    ``[1, width]`` FP32 (``0 .. nb-2``, then :data:`NOT_CANDIDATE` for the local block and the
    padding), the ``[4, nb]`` block-max scratch and the INT32 ids ``[rows, 16]`` with column
    15 preset to the local block ``nb - 1``. All built with torch on the inputs' device."""
    torch = require_torch()
    nb, dev = args.nb, q.device
    width = rank_width(nb)
    rows = 1 if args.head_reduce == "max" else NIDX
    keep = torch.zeros(1, nb * BY, dtype=torch.bool, device=dev)
    keep[0, : args.valid] = True
    order = torch.full((1, width), NOT_CANDIDATE, dtype=torch.float32, device=dev)
    order[0, : nb - 1] = torch.arange(nb - 1, dtype=torch.float32, device=dev)
    block_max = torch.zeros(NIDX, nb, dtype=torch.float32, device=dev)
    ids = torch.full((rows, TOPK), nb - 1, dtype=torch.int32, device=dev)
    kernel = build_select_kernel(key_tile(soc), width, rows)
    return kernel, [_padded_query(q), k.contiguous(), keep, order], [block_max, ids]


def _run_scores(q, k, nb: int, target: _backend.Target):
    """FP32 ``[4, nb*128]`` kernel scores (tensor) and the cost-model µs (``None`` on the NPU)."""
    kernel, ins, outs = score_launch(q, k, nb, target.soc)
    us = _backend.launch(kernel, ins, outs, target)
    return outs[0][:NIDX].contiguous(), us


def _run_block_max(q, k, args: IndexerArgs, target: _backend.Target):
    """FP32 ``[4, nb]`` per-head block maxima from the fused kernel, and the cost-model µs."""
    kernel, ins, outs = block_max_launch(q, k, args, target.soc)
    us = _backend.launch(kernel, ins, outs, target)
    return outs[0][:NIDX].contiguous(), us


def _run_select(q, k, args: IndexerArgs, target: _backend.Target):
    """INT32 ``[rows, 16]`` ids ranked on the device (on the inputs' device), and the µs."""
    kernel, ins, outs = select_launch(q, k, args, target.soc)
    us = _backend.launch(kernel, ins, outs, target)
    return outs[1], us


def _check(idx_q, idx_k, nb, validate, **kw) -> tuple[IndexerArgs, bool]:
    """The shared checks (:func:`tilesim.shared.msa_indexer.check_indexer`) and whether the
    inputs are shape-only; without ``validate`` (or on shape-only inputs) the finiteness check
    runs on zero stand-ins of ``idx_q`` / ``idx_k`` (their metadata checked, no data read)."""
    check_bool(validate, "validate")
    shape_only = _backend.is_shape_only(idx_q, idx_k)
    q, k = idx_q, idx_k
    if (shape_only or not validate) and is_array(idx_q) and is_array(idx_k):
        q, k = _backend.standin(idx_q), _backend.standin(idx_k)
    args = check_indexer(q, k, nb, **kw)
    return args, shape_only


@_backend.graph_safe
def msa_indexer_scores(idx_q, idx_k, nb, *, backend="auto", soc=DEFAULT_SOC, validate=True):
    """Lightning-indexer scores on the device: FP32 ``[4, nb*128]``.

    ``idx_q`` ``[4, 128]`` BF16, ``idx_k`` ``[nb*128, 128]`` BF16 (NumPy or torch; checked by
    :func:`tilesim.shared.msa_indexer.check_indexer`, as in the reference). ``backend`` /
    ``soc``: :func:`tilesim.device.backend.resolve`; ``"sim"`` returns ``(scores, cost_us)``.
    ``validate``: ``True`` (default) copies ``idx_q`` / ``idx_k`` to the host to check that
    they are finite; ``False`` checks metadata only. FakeTensor / ``meta`` inputs: an empty
    ``[4, nb*128]`` FP32 tensor, no data read. Promise: within the FP32 dot-product bound of
    the reference (``tests/device/test_msa_indexer_sim.py``).
    """
    args, shape_only = _check(idx_q, idx_k, nb, validate)
    if shape_only:
        check_choice(backend, "backend", _backend.BACKENDS)
        return idx_q.new_empty((NIDX, args.nb * BY), dtype=require_torch().float32)
    target = _backend.resolve(backend, soc, idx_q)
    q, k = _backend.to_tensors(idx_q, idx_k)
    s, us = _run_scores(q, k, args.nb, target)
    return _backend.finish(s, us, target)


def resolve_rank(rank, block_max, nb: int) -> tuple[str, str]:
    """``(rank, block_max)`` from the wrapper's arguments. ``rank=None`` is ``"device"``
    unless ``block_max="host"`` (scores on the host are ranked there) or ``nb`` is beyond
    :data:`RANK_WIDTHS` (then ``"host"``); ``rank="device"`` takes ``block_max`` ``None`` /
    ``"device"`` and ``nb <= RANK_WIDTHS[-1]`` only; ``rank="host"`` with ``block_max=None``
    is the host block max."""
    if rank is not None:
        check_choice(rank, "rank", RANKS)
    if block_max is not None:
        check_choice(block_max, "block_max", BLOCK_MAX)
    if rank is None:
        wide = rank_width(nb) is None
        rank = "host" if block_max == "host" or wide else "device"
    if rank == "device" and block_max == "host":
        raise ValueError(
            "block_max: 'host' puts the scores on the host, so the ranking is too; pass "
            "rank='host' with it, or block_max=None/'device' for rank='device'"
        )
    if rank == "device" and rank_width(nb) is None:
        raise ValueError(
            f"rank: 'device' ranks at most nb={RANK_WIDTHS[-1]} blocks, got nb={nb}; pass "
            "rank='host' (or rank=None, which picks it)"
        )
    return rank, ("device" if rank == "device" else (block_max or "host"))


def _host_ranked(q, k, args: IndexerArgs, block_max: str, target: _backend.Target):
    """``rank="host"``: device scores (or block maxima), the shared rule on a host copy."""
    if block_max == "device":
        hm, us = _run_block_max(q, k, args, target)
        head_max = host_array(hm, "block_max")
    else:
        s, us = _run_scores(q, k, args.nb, target)
        head_max = block_head_max(host_array(s, "scores"), args.nb, args.valid)
    ids = select_from_head_max(head_max, args.nb, head_reduce=args.head_reduce)
    return require_torch().from_numpy(ids), us


@_backend.graph_safe
def msa_indexer(
    idx_q,
    idx_k,
    nb,
    *,
    seq_len=None,
    head_reduce="max",
    rank=None,
    block_max=None,
    backend="auto",
    soc=DEFAULT_SOC,
    validate=True,
):
    """Lightning-indexer block selection: device scores, block maxima and ranking.

    ``rank="device"`` (the default): one fused kernel (:func:`build_select_kernel`) computes
    the scores, the seq_len rule (a select to -inf), the per-block maxima and the ranking --
    the shared rule of :mod:`tilesim.shared.msa_select` (15 best non-local blocks, equal
    scores: lower block id first, NaN blocks last, then the local block ``nb - 1``) -- and
    writes only the ids, which stay on the inputs' device: no device-to-host copy unless
    ``validate``. ``rank="host"``: the kernel writes the ``[16, nb*128]`` scores
    (``block_max="host"``, the seeds' split) or the ``[16, nb]`` block maxima
    (``block_max="device"``, :func:`build_block_max_kernel`) and the host applies the shared
    rule (:func:`resolve_rank` says which combinations are accepted). Same ids in every mode;
    key rows at or beyond ``seq_len`` may hold anything (NaN included).
    ``validate``: as for :func:`msa_indexer_scores`.

    Returns INT32 ``[1, min(16, nb)]`` (``head_reduce="none"``: ``[4, min(16, nb)]``): on the
    inputs' device for ``rank="device"``, a CPU tensor for ``"host"``, a NumPy array for NumPy
    input; ``backend="sim"`` returns ``(ids, cost_us)``. ``nb <= 16`` launches no kernel (the
    answer is ``arange(nb)``; ``cost_us`` 0.0). FakeTensor / ``meta`` inputs: an empty INT32
    tensor of that shape on the inputs' device, no data read.
    """
    args, shape_only = _check(idx_q, idx_k, nb, validate, seq_len=seq_len,
                              head_reduce=head_reduce)  # fmt: skip
    rank, block_max = resolve_rank(rank, block_max, args.nb)
    torch = require_torch()
    rows = 1 if args.head_reduce == "max" else NIDX
    if shape_only:
        check_choice(backend, "backend", _backend.BACKENDS)
        return idx_q.new_empty((rows, min(TOPK, args.nb)), dtype=torch.int32)
    target = _backend.resolve(backend, soc, idx_q)
    q, k = _backend.to_tensors(idx_q, idx_k)
    if args.nb <= TOPK:  # nothing to rank (the seeds' short-context guard)
        dev = q.device if rank == "device" else "cpu"
        ids = torch.arange(args.nb, dtype=torch.int32, device=dev).repeat(rows, 1)
        return _backend.finish(ids, None, target)
    if rank == "device":
        ids, us = _run_select(q, k, args, target)
    else:
        ids, us = _host_ranked(q, k, args, block_max, target)
    return _backend.finish(ids, us, target)


__all__ = [
    "BLOCK_MAX",
    "HEAD_REDUCES",
    "RANKS",
    "RANK_WIDTHS",
    "JIT",
    "KTILE",
    "SEED_JIT",
    "block_max_launch",
    "build_block_max_kernel",
    "build_kernel",
    "build_select_kernel",
    "key_tile",
    "msa_indexer",
    "msa_indexer_scores",
    "rank_width",
    "resolve_rank",
    "score_launch",
    "select_launch",
    "select_blocks",
    "select_from_head_max",
]
