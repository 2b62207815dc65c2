"""MiniMax-M3 MSA lightning indexer on Ascend — PyPTO score kernel + the shared host tail.

Same names and arguments as the goldens ``msa_indexer_scores`` and ``msa_indexer``
(``reference/msa_lightning_indexer.py``), plus ``block_max`` / ``backend`` / ``soc``; NumPy
arrays or torch tensors in, the same kind out (:mod:`tilesim.device.backend`).

Kernel (one compile per key tile and SoC; ``nb`` is a runtime value: ``idx_k``'s first axis
is dynamic): the 4 index-query heads zero-padded to 16 cube rows; a ``pypto.loop`` over the
whole key tiles of ``KTILE`` keys, then one over the remaining 128-key blocks, each step
``S = fp32(q_pad @ K_tile^T)`` (cube, FP32 out, one K step of 128), times 1.0 on the vector
unit, assembled into the FP32 ``[16, nb*128]`` score buffer. Every score is one 128-term dot
product, so the key tile width changes the data movement, not the numbers.

Tail (host, NumPy): :mod:`tilesim.shared.msa_select` — the very rule of the reference (keys
at or beyond ``seq_len`` out of the block max, max over keys then heads, the top 15 non-local
blocks by a stable sort of the negated scores, then the local block ``nb-1``; ``nb <= 16``
gives ``arange(nb)``), applied to a host copy of the kernel's output. Identical FP32 scores
give identical ids. :func:`select_blocks` / :func:`select_from_head_max` are that module's
functions, re-exported under their former names here.

``block_max="device"`` (beyond the seeds, their listed next step): a second kernel
(:func:`build_block_max_kernel`) SETS the scores of keys at or beyond ``seq_len`` to -inf (a
select on a bool key mask: an added -inf bias would leave a NaN score of an unwritten key row
NaN and poison its block's max) and writes only the per-block maxima ``[16, nb]`` (128x less
output); the ranking then runs on ``[4, nb]``. Max is exact, so the ids are the same as with
the host block max, whatever the rows past ``seq_len`` hold (NaN, inf, garbage; tested in
``tests/device/test_sim_nan_poison.py``).

Per-SoC key tile :data:`KTILE` (``MSA_INDEXER_KTILE``). Importing needs neither torch nor pypto.
"""

import numpy as np
from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto, require_torch
from tilesim.device._msa_tiles import SEED_RUNTIME, jit_options, l0_tile, without
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.msa_select import (
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
NEG_INF = float("-inf")  # the score of a key that takes no part in the block max


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


def _check(idx_q, idx_k, nb, validate, **kw) -> tuple[IndexerArgs, bool]:
    """The shared checks (:func:`tilesim.shared.msa_select.check_indexer`) and whether the
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
    :func:`tilesim.shared.msa_select.check_indexer`, as in the reference). ``backend`` /
    ``soc``: :func:`tilesim.device.backend.resolve`; ``"sim"`` returns ``(scores, cost_us)``.
    ``validate``: ``True`` (default) copies ``idx_q`` / ``idx_k`` to the host to check that
    they are finite; ``False`` checks metadata only. FakeTensor / ``meta`` inputs: an empty
    ``[4, nb*128]`` FP32 tensor, no data read. Promise: within the FP32 dot-product bound of
    the reference (``tests/device/test_sim_msa_lightning_indexer.py``).
    """
    args, shape_only = _check(idx_q, idx_k, nb, validate)
    if shape_only:
        check_choice(backend, "backend", _backend.BACKENDS)
        return idx_q.new_empty((NIDX, args.nb * BY), dtype=require_torch().float32)
    target = _backend.resolve(backend, soc, idx_q)
    q, k = _backend.to_tensors(idx_q, idx_k)
    s, us = _run_scores(q, k, args.nb, target)
    return _backend.finish(s, us, target)


@_backend.graph_safe
def msa_indexer(
    idx_q,
    idx_k,
    nb,
    *,
    seq_len=None,
    head_reduce="max",
    block_max="host",
    backend="auto",
    soc=DEFAULT_SOC,
    validate=True,
):
    """Lightning-indexer block selection: device scores + the shared host tail.

    ``block_max="host"`` (the seeds' split): the kernel writes the ``[16, nb*128]`` scores and
    the host takes the block max; ``"device"``: the fused kernel
    (:func:`build_block_max_kernel`) writes only the ``[16, nb]`` block maxima (the seq_len
    rule applied in the kernel as a select to -inf). Same ids either way (max is exact), and
    key rows at or beyond ``seq_len`` may hold anything (NaN included) in both.
    ``validate``: as for :func:`msa_indexer_scores`. The ranking itself reads the scores (or
    block maxima) on the host: ``docs/device.md`` ("Host round trips") says why.

    Returns INT32 ``[1, min(16, nb)]`` (``head_reduce="none"``: ``[4, min(16, nb)]``), a CPU
    tensor for tensor input, a NumPy array for NumPy input; ``backend="sim"`` returns
    ``(ids, cost_us)``. ``nb <= 16`` launches no kernel (the answer is ``arange(nb)``;
    ``cost_us`` 0.0). FakeTensor / ``meta`` inputs: an empty INT32 tensor of that shape on
    the inputs' device, no data read.
    """
    args, shape_only = _check(idx_q, idx_k, nb, validate, seq_len=seq_len,
                              head_reduce=head_reduce)  # fmt: skip
    check_choice(block_max, "block_max", BLOCK_MAX)
    if shape_only:
        check_choice(backend, "backend", _backend.BACKENDS)
        rows = 1 if args.head_reduce == "max" else NIDX
        return idx_q.new_empty((rows, min(TOPK, args.nb)), dtype=require_torch().int32)
    target = _backend.resolve(backend, soc, idx_q)
    q, k = _backend.to_tensors(idx_q, idx_k)
    us = None
    if args.nb <= TOPK:  # nothing to rank (the seeds' short-context guard)
        head_max = np.zeros((NIDX, args.nb), dtype=np.float32)
    elif block_max == "device":
        hm, us = _run_block_max(q, k, args, target)
        head_max = host_array(hm, "block_max")
    else:
        s, us = _run_scores(q, k, args.nb, target)
        head_max = block_head_max(host_array(s, "scores"), args.nb, args.valid)
    ids = select_from_head_max(head_max, args.nb, head_reduce=args.head_reduce)
    return _backend.finish(require_torch().from_numpy(ids), us, target)


__all__ = [
    "BLOCK_MAX",
    "HEAD_REDUCES",
    "JIT",
    "KTILE",
    "SEED_JIT",
    "block_max_launch",
    "build_block_max_kernel",
    "build_kernel",
    "key_tile",
    "msa_indexer",
    "msa_indexer_scores",
    "score_launch",
    "select_blocks",
    "select_from_head_max",
]
