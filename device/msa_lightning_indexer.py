"""MiniMax-M3 MSA lightning indexer on Ascend — PyPTO score kernel + the shared host tail.

Same names and arguments as the goldens ``msa_indexer_scores`` and ``msa_indexer``
(``reference/msa_lightning_indexer.py``), plus ``block_max`` / ``backend`` / ``soc``; NumPy
arrays or torch tensors in, the same kind out (:mod:`tilesim.device.backend`).

Kernel (static loop, one compile per ``nb``): the 4 index-query heads zero-padded to 16 cube
rows; for each key tile of ``KTILE`` keys (a whole number of 128-key blocks, the last tile may
be shorter) ``S = fp32(q_pad @ K_tile^T)`` (cube, FP32 out, one K step of 128), times 1.0 on the
vector unit, written into the FP32 ``[16, nb*128]`` score buffer. Every score is one 128-term
dot product, so the key tile width changes the data movement, not the numbers.

Tail (host, NumPy): :mod:`tilesim.shared.msa_select` — the very rule of the reference (keys
at or beyond ``seq_len`` out of the block max, max over keys then heads, the top 15 non-local
blocks by a stable sort of the negated scores, then the local block ``nb-1``; ``nb <= 16``
gives ``arange(nb)``), applied to a host copy of the kernel's output. Identical FP32 scores
give identical ids. :func:`select_blocks` / :func:`select_from_head_max` are that module's
functions, re-exported under their former names here.

``block_max="device"`` (beyond the seeds, their listed next step): a second kernel
(:func:`build_block_max_kernel`) adds a 0/-inf key bias for ``seq_len`` and writes only the
per-block maxima ``[16, nb]`` (128x less output); the ranking then runs on ``[4, nb]``. Max is
exact, so the ids are the same as with the host block max.

Per-SoC key tile :data:`KTILE` (``MSA_INDEXER_KTILE``). Importing needs neither torch nor pypto.
"""

import functools

import numpy as np
from tilesim.device._lazy import require_pypto, require_torch
from tilesim.device._msa_tiles import l0_tile
from tilesim.device.backend import Target, finish, launch, resolve, to_tensors
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
from tilesim.shared.validate import check_choice, host_array

_CFG = MINIMAX_M3.msa
BY = _CFG.block_size  # 128
NIDX = _CFG.num_index_heads  # 4
NPAD = _CFG.index_heads_padded  # 16
DIM = _CFG.index_dim  # 128
TOPK = _CFG.topk_blocks  # 16
BLOCK_MAX = ("host", "device")


#: per-SoC defaults and the env override live in :mod:`tilesim.shared.soc`
KTILE = MSA_DEVICE_TILES["MSA_INDEXER_KTILE"][0]


def key_tile(soc=DEFAULT_SOC, env=None) -> int:
    """KTILE of ``soc`` (``MSA_INDEXER_KTILE`` overrides; see
    :func:`tilesim.shared.soc.msa_device_tile`)."""
    return msa_device_tile("MSA_INDEXER_KTILE", soc, env)


def _key_tiles(nb: int, ktile: int) -> list[tuple[int, int]]:
    """``[(k0, w), ...]``: key tiles of ``ktile`` keys over ``nb*128`` keys (last may be short)."""
    nkeys = nb * BY
    return [(k0, min(ktile, nkeys - k0)) for k0 in range(0, nkeys, ktile)]


def _tile_scores(pypto, q_pad, idx_k, k0: int, w: int):
    """Inside a kernel body: ``fp32(q_pad @ idx_k[k0:k0+w]^T)`` ``[16, w]`` (one K step)."""
    kt = pypto.view(idx_k, [w, DIM], [k0, 0])
    pypto.set_cube_tile_shapes([NPAD, NPAD], [DIM, DIM], [l0_tile(w, 256), w])
    s = pypto.matmul(q_pad, kt, pypto.DT_FP32, b_trans=True)
    pypto.set_vec_tile_shapes(NPAD, w)
    return s


@functools.lru_cache(maxsize=64)
def build_kernel(nb: int, ktile: int):
    """The ``@pypto.frontend.jit`` score kernel for ``nb`` key blocks (cached)."""
    pypto = require_pypto()
    tiles = _key_tiles(nb, ktile)

    @pypto.frontend.jit
    def msa_indexer_scores_kernel(
        q_pad: pypto.Tensor([], pypto.DT_BF16),  # [16, 128], rows 4..15 zero
        idx_k: pypto.Tensor([], pypto.DT_BF16),  # [nb*128, 128]
        scores: pypto.Tensor([], pypto.DT_FP32),  # [16, nb*128]
    ):
        for t in range(len(tiles)):  # key tiles (static)
            k0 = tiles[t][0]
            w = tiles[t][1]
            s = _tile_scores(pypto, q_pad, idx_k, k0, w)
            scores[:, k0 : k0 + w] = s * 1.0

    return msa_indexer_scores_kernel


@functools.lru_cache(maxsize=64)
def build_block_max_kernel(nb: int, ktile: int):
    """Score kernel with the block max fused in (the seeds' "next step"): per key tile
    ``S = fp32(q_pad @ K_tile^T) + bias`` (bias 0, or -inf for keys at or beyond ``seq_len``),
    then the max over each 128-key block, written to ``[16, nb]`` FP32. ``max`` is exact, so the
    result equals the block max of the full scores; the output shrinks 128-fold (cached)."""
    pypto = require_pypto()
    tiles = _key_tiles(nb, ktile)

    @pypto.frontend.jit
    def msa_indexer_block_max_kernel(
        q_pad: pypto.Tensor([], pypto.DT_BF16),  # [16, 128], rows 4..15 zero
        idx_k: pypto.Tensor([], pypto.DT_BF16),  # [nb*128, 128]
        key_bias: pypto.Tensor([], pypto.DT_FP32),  # [1, nb*128]: 0 or -inf
        block_max: pypto.Tensor([], pypto.DT_FP32),  # [16, nb]
    ):
        for t in range(len(tiles)):  # key tiles (static)
            k0 = tiles[t][0]
            w = tiles[t][1]
            s = _tile_scores(pypto, q_pad, idx_k, k0, w)
            s = s + pypto.view(key_bias, [1, w], [0, k0])
            for j in range(w // BY):  # the blocks of this tile
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


def _run_scores(q, k, nb: int, target: Target):
    """FP32 ``[4, nb*128]`` kernel scores (tensor) and the cost-model µs (``None`` on the NPU)."""
    torch = require_torch()
    scores = torch.zeros(NPAD, nb * BY, dtype=torch.float32, device=q.device)
    kernel = build_kernel(nb, key_tile(target.soc))
    us = launch(kernel, [_padded_query(q), k.contiguous()], [scores], target)
    return scores[:NIDX].contiguous(), us


def _run_block_max(q, k, args: IndexerArgs, target: Target):
    """FP32 ``[4, nb]`` per-head block maxima from the fused kernel, and the cost-model µs."""
    torch = require_torch()
    nb = args.nb
    bias = torch.zeros(1, nb * BY, dtype=torch.float32, device=q.device)
    bias[0, args.valid :] = -torch.inf  # keys at or beyond seq_len take no part in the max
    block_max = torch.zeros(NPAD, nb, dtype=torch.float32, device=q.device)
    kernel = build_block_max_kernel(nb, key_tile(target.soc))
    us = launch(kernel, [_padded_query(q), k.contiguous(), bias], [block_max], target)
    return block_max[:NIDX].contiguous(), us


def msa_indexer_scores(idx_q, idx_k, nb, *, backend="auto", soc=DEFAULT_SOC):
    """Lightning-indexer scores on the device: FP32 ``[4, nb*128]``.

    ``idx_q`` ``[4, 128]`` BF16, ``idx_k`` ``[nb*128, 128]`` BF16 (NumPy or torch; checked by
    :func:`tilesim.shared.msa_select.check_indexer`, as in the reference). ``backend`` /
    ``soc``: :func:`tilesim.device.backend.resolve`; ``"sim"`` returns ``(scores, cost_us)``.
    Promise: within the FP32 dot-product bound of the reference
    (``tests/device/test_sim_msa_lightning_indexer.py``).
    """
    args = check_indexer(idx_q, idx_k, nb)
    target = resolve(backend, soc, idx_q)
    q, k = to_tensors(idx_q, idx_k)
    s, us = _run_scores(q, k, args.nb, target)
    return finish(s, us, target)


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
):
    """Lightning-indexer block selection: device scores + the shared host tail.

    ``block_max="host"`` (the seeds' split): the kernel writes the ``[16, nb*128]`` scores and
    the host takes the block max; ``"device"``: the fused kernel
    (:func:`build_block_max_kernel`) writes only the ``[16, nb]`` block maxima (the seq_len
    rule applied in the kernel as a -inf key bias). Same ids either way (max is exact).

    Returns INT32 ``[1, min(16, nb)]`` (``head_reduce="none"``: ``[4, min(16, nb)]``), a CPU
    tensor for tensor input, a NumPy array for NumPy input; ``backend="sim"`` returns
    ``(ids, cost_us)``. ``nb <= 16`` launches no kernel (the answer is ``arange(nb)``;
    ``cost_us`` 0.0).
    """
    args = check_indexer(idx_q, idx_k, nb, seq_len=seq_len, head_reduce=head_reduce)
    check_choice(block_max, "block_max", BLOCK_MAX)
    target = resolve(backend, soc, idx_q)
    q, k = to_tensors(idx_q, idx_k)
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
    return finish(require_torch().from_numpy(ids), us, target)


__all__ = [
    "BLOCK_MAX",
    "HEAD_REDUCES",
    "KTILE",
    "build_block_max_kernel",
    "build_kernel",
    "key_tile",
    "msa_indexer",
    "msa_indexer_scores",
    "select_blocks",
    "select_from_head_max",
]
