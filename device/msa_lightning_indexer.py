"""MiniMax-M3 MSA lightning indexer on Ascend — PyPTO score kernel + torch selection tail.

Same names and arguments as :func:`tilesim.reference.msa_indexer_scores` and
:func:`tilesim.reference.msa_lightning_indexer`.

Kernel (static loop, one compile per ``nb``): the 4 index-query heads zero-padded to 16 cube
rows; for each key tile of ``KTILE`` keys (a whole number of 128-key blocks, the last tile may
be shorter) ``S = fp32(q_pad @ K_tile^T)`` (cube, FP32 out, one K step of 128), times 1.0 on the
vector unit, written into the FP32 ``[16, nb*128]`` score buffer. Every score is one 128-term
dot product, so the key tile width changes the data movement, not the numbers: the scores are
the reference's (correctly rounded FP32 dot products of BF16 inputs) whatever the tile.

Tail (torch, host): rows >= ``seq_len`` to -inf, block score = max over the block's keys and
then over the 4 heads, the top 15 non-local blocks by a STABLE sort of the negated scores
(score descending, equal scores -> lower block id first), then the local block ``nb-1``;
``nb <= 16`` gives ``arange(nb)``; ``head_reduce="none"`` one selection per index head. This is
the reference's deterministic rule, so identical FP32 scores give identical ids.

``block_max="device"`` (beyond the seeds, their listed next step): a second kernel
(:func:`build_block_max_kernel`) adds a 0/-inf key bias for ``seq_len`` and writes only the
per-block maxima ``[16, nb]`` (128x less output); the ranking then runs on ``[4, nb]``. Max is
exact, so the ids are the same as with the host block max.

Per-SoC key tile :data:`KTILE` (``MSA_INDEXER_KTILE``). Importing needs neither torch nor pypto.
"""

import functools
import numbers

from tilesim.device._lazy import require, require_pypto, require_torch
from tilesim.device._msa_tiles import l0_tile
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.soc import DEFAULT_SOC, MSA_DEVICE_TILES, msa_device_tile

BACKENDS = ("auto", "npu", "sim")
HEAD_REDUCES = ("max", "none")
_CFG = MINIMAX_M3.msa
BY = _CFG.block_size  # 128
NIDX = _CFG.num_index_heads  # 4
NPAD = _CFG.index_heads_padded  # 16
DIM = _CFG.index_dim  # 128
TOPK = _CFG.topk_blocks  # 16


#: per-SoC defaults and the env override live in :mod:`tilesim.shared.soc`
KTILE = MSA_DEVICE_TILES["MSA_INDEXER_KTILE"][0]


def key_tile(soc=DEFAULT_SOC, env=None) -> int:
    """KTILE of ``soc`` (``MSA_INDEXER_KTILE`` overrides; see
    :func:`tilesim.shared.soc.msa_device_tile`)."""
    return msa_device_tile("MSA_INDEXER_KTILE", soc, env)


@functools.lru_cache(maxsize=64)
def build_kernel(nb: int, ktile: int):
    """The ``@pypto.frontend.jit`` score kernel for ``nb`` key blocks (cached)."""
    pypto = require_pypto()
    nkeys = nb * BY
    tiles = [(k0, min(ktile, nkeys - k0)) for k0 in range(0, nkeys, ktile)]

    @pypto.frontend.jit
    def msa_indexer_scores_kernel(
        q_pad: pypto.Tensor([], pypto.DT_BF16),  # [16, 128], rows 4..15 zero
        idx_k: pypto.Tensor([], pypto.DT_BF16),  # [nb*128, 128]
        scores: pypto.Tensor([], pypto.DT_FP32),  # [16, nb*128]
    ):
        for t in range(len(tiles)):  # key tiles (static)
            k0 = tiles[t][0]
            w = tiles[t][1]
            kt = pypto.view(idx_k, [w, DIM], [k0, 0])
            pypto.set_cube_tile_shapes([NPAD, NPAD], [DIM, DIM], [l0_tile(w, 256), w])
            s = pypto.matmul(q_pad, kt, pypto.DT_FP32, b_trans=True)
            pypto.set_vec_tile_shapes(NPAD, w)
            scores[:, k0 : k0 + w] = s * 1.0

    return msa_indexer_scores_kernel


@functools.lru_cache(maxsize=64)
def build_block_max_kernel(nb: int, ktile: int):
    """Score kernel with the block max fused in (the seeds' "next step"): per key tile
    ``S = fp32(q_pad @ K_tile^T) + bias`` (bias 0, or -inf for keys at or beyond ``seq_len``),
    then the max over each 128-key block, written to ``[16, nb]`` FP32. ``max`` is exact, so the
    result equals the block max of the full scores; the output shrinks 128-fold (cached)."""
    pypto = require_pypto()
    nkeys = nb * BY
    tiles = [(k0, min(ktile, nkeys - k0)) for k0 in range(0, nkeys, ktile)]

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
            kt = pypto.view(idx_k, [w, DIM], [k0, 0])
            pypto.set_cube_tile_shapes([NPAD, NPAD], [DIM, DIM], [l0_tile(w, 256), w])
            s = pypto.matmul(q_pad, kt, pypto.DT_FP32, b_trans=True)
            pypto.set_vec_tile_shapes(NPAD, w)
            s = s + pypto.view(key_bias, [1, w], [0, k0])
            for j in range(w // BY):  # the blocks of this tile
                pypto.set_vec_tile_shapes(NPAD, BY)
                blk = pypto.view(s, [NPAD, BY], [0, j * BY])
                pypto.assemble(pypto.amax(blk, dim=-1, keepdim=True), [0, k0 // BY + j], block_max)

    return msa_indexer_block_max_kernel


def _check(idx_q, idx_k, nb):
    torch = require_torch()
    for name, t in (("idx_q", idx_q), ("idx_k", idx_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name}: expected dtype torch.bfloat16, got {t.dtype}")
    if isinstance(nb, bool) or not isinstance(nb, numbers.Integral) or nb <= 0:
        raise ValueError(f"nb: expected a positive int, got {nb!r}")
    nb = int(nb)
    if tuple(idx_q.shape) != (NIDX, DIM):
        raise ValueError(f"idx_q: expected shape ({NIDX}, {DIM}), got {tuple(idx_q.shape)}")
    if tuple(idx_k.shape) != (nb * BY, DIM):
        raise ValueError(
            f"idx_k: expected shape ({nb * BY}, {DIM}) for nb={nb}, got {tuple(idx_k.shape)}"
        )
    for name, t in (("idx_q", idx_q), ("idx_k", idx_k)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name}: expected finite values (a NaN/inf makes the ranking void)")
    return nb


def _resolve_backend(backend, device, soc):
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if device.type != "npu":
            raise ValueError(
                f"backend: tensors are on {device}; pass NPU tensors (torch_npu) or "
                "backend='sim' to run PyPTO's CPU simulator"
            )
        backend = "npu"
    if backend == "npu":
        require("torch_npu")
        soc = "950" if require_pypto().platform.npuarch == "DAV_3510" else "910b"
    return backend, soc


def _run_scores(idx_q, idx_k, nb, backend, soc):
    """FP32 ``[4, nb*128]`` kernel scores and the cost-model µs (``None`` on the NPU)."""
    torch = require_torch()
    backend, soc = _resolve_backend(backend, idx_q.device, soc)
    q_pad = torch.zeros(NPAD, DIM, dtype=torch.bfloat16, device=idx_q.device)
    q_pad[:NIDX] = idx_q
    scores = torch.zeros(NPAD, nb * BY, dtype=torch.float32, device=idx_q.device)
    if backend == "sim":  # choose the SoC before pypto is imported (the 950 is an overlay)
        from tilesim.device import sim

        sim.configure(soc)
    kernel = build_kernel(nb, key_tile(soc))
    if backend == "sim":
        if idx_k.device.type != "cpu" or idx_q.device.type != "cpu":
            raise ValueError("backend='sim': expected CPU tensors")
        run = sim.run_kernel(kernel, [q_pad, idx_k.detach().contiguous().clone(), scores])
        return scores[:NIDX].contiguous(), run.us
    kernel(q_pad, idx_k.contiguous(), scores)
    return scores[:NIDX].contiguous(), None


def msa_indexer_scores(idx_q, idx_k, nb, *, backend="auto", soc=DEFAULT_SOC):
    """Lightning-indexer scores on the device: FP32 ``[4, nb*128]``.

    ``idx_q`` ``[4, 128]`` BF16, ``idx_k`` ``[nb*128, 128]`` BF16 torch tensors. ``backend``
    / ``soc`` as in :mod:`tilesim.device.msa_decode`; ``"sim"`` returns ``(scores, cost_us)``.
    Promise: bit-identical to the reference (each score is one correctly rounded 128-term
    FP32 dot product); checked by ``tests/device/test_sim_msa_indexer.py``.
    """
    nb = _check(idx_q, idx_k, nb)
    s, us = _run_scores(idx_q, idx_k, nb, backend, soc)
    return (s, us) if backend == "sim" else s


def _check_seq_len(seq_len, nb):
    if seq_len is None:
        return nb * BY
    if (
        isinstance(seq_len, bool)
        or not isinstance(seq_len, numbers.Integral)
        or not (nb - 1) * BY < seq_len <= nb * BY
    ):
        raise ValueError(
            f"seq_len: expected an int with {(nb - 1) * BY} < seq_len <= {nb * BY} "
            f"(nb = {nb} blocks of {BY}), got {seq_len!r}"
        )
    return int(seq_len)


def _top_blocks(score, nb: int, ksel: int):
    """Top ``ksel-1`` of blocks ``0..nb-2`` (stable sort of -score: descending, lower id
    first on ties), then the local block ``nb-1``; INT32."""
    torch = require_torch()
    order = torch.sort(-score[: nb - 1], stable=True).indices[: ksel - 1]
    return torch.cat([order, torch.tensor([nb - 1])]).to(torch.int32)


def select_from_head_max(head_max, nb: int, *, head_reduce="max"):
    """The ranking on FP32 per-head block maxima ``[4, nb]`` (torch) -> INT32 ``[1 or 4, k]``:
    block score = max over heads; top 15 of blocks ``0..nb-2`` (descending, lower id first on
    ties), then ``nb-1``; ``nb <= 16`` -> ``arange(nb)``."""
    torch = require_torch()
    if head_reduce not in HEAD_REDUCES:
        raise ValueError(f"head_reduce: expected one of {HEAD_REDUCES}, got {head_reduce!r}")
    ksel = min(TOPK, nb)
    if nb <= TOPK:
        sel = torch.arange(nb, dtype=torch.int32)
        return sel[None, :] if head_reduce == "max" else sel[None, :].repeat(NIDX, 1)
    head_max = head_max.detach().to("cpu", torch.float32)
    if head_reduce == "max":
        return _top_blocks(head_max.amax(dim=0), nb, ksel)[None, :]
    return torch.stack([_top_blocks(head_max[h], nb, ksel) for h in range(NIDX)])


def select_blocks(scores, nb: int, *, seq_len=None, head_reduce="max"):
    """The host tail on FP32 ``[4, nb*128]`` scores (torch) -> INT32 ids ``[1 or 4, k]``:
    keys at or beyond ``seq_len`` to -inf, max over each block's keys, then
    :func:`select_from_head_max`."""
    torch = require_torch()
    valid = _check_seq_len(seq_len, nb)
    s = scores.detach().to("cpu", torch.float32).clone()
    s[:, valid:] = -torch.inf  # keys at or beyond seq_len take no part in the max
    head_max = s.reshape(NIDX, nb, BY).amax(dim=2)  # [4, nb]
    return select_from_head_max(head_max, nb, head_reduce=head_reduce)


def _run_block_max(idx_q, idx_k, nb, seq_len, backend, soc):
    """FP32 ``[4, nb]`` per-head block maxima from the fused kernel, and the cost-model µs."""
    torch = require_torch()
    backend, soc = _resolve_backend(backend, idx_q.device, soc)
    dev = idx_q.device
    q_pad = torch.zeros(NPAD, DIM, dtype=torch.bfloat16, device=dev)
    q_pad[:NIDX] = idx_q
    bias = torch.zeros(1, nb * BY, dtype=torch.float32, device=dev)
    bias[0, _check_seq_len(seq_len, nb) :] = -torch.inf
    block_max = torch.zeros(NPAD, nb, dtype=torch.float32, device=dev)
    if backend == "sim":  # choose the SoC before pypto is imported (the 950 is an overlay)
        from tilesim.device import sim

        sim.configure(soc)
    kernel = build_block_max_kernel(nb, key_tile(soc))
    if backend == "sim":
        if idx_k.device.type != "cpu" or dev.type != "cpu":
            raise ValueError("backend='sim': expected CPU tensors")
        run = sim.run_kernel(kernel, [q_pad, idx_k.detach().contiguous().clone(), bias, block_max])
        return block_max[:NIDX].contiguous(), run.us
    kernel(q_pad, idx_k.contiguous(), bias, block_max)
    return block_max[:NIDX].contiguous(), None


BLOCK_MAX = ("host", "device")


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
    """Lightning-indexer block selection: device scores + the deterministic torch tail.

    ``block_max="host"`` (the seeds' split): the kernel writes the ``[16, nb*128]`` scores and
    torch takes the block max; ``"device"``: the fused kernel
    (:func:`build_block_max_kernel`) writes only the ``[16, nb]`` block maxima (the seq_len
    rule applied in the kernel as a -inf key bias). Same ids either way (max is exact).

    Returns INT32 ``[1, min(16, nb)]`` (``head_reduce="none"``: ``[4, min(16, nb)]``) on the
    CPU; ``backend="sim"`` returns ``(ids, cost_us)``. ``nb <= 16`` launches no kernel (the
    answer is ``arange(nb)``; ``cost_us`` 0.0).
    """
    nb = _check(idx_q, idx_k, nb)
    _check_seq_len(seq_len, nb)
    if head_reduce not in HEAD_REDUCES:
        raise ValueError(f"head_reduce: expected one of {HEAD_REDUCES}, got {head_reduce!r}")
    if block_max not in BLOCK_MAX:
        raise ValueError(f"block_max: expected one of {BLOCK_MAX}, got {block_max!r}")
    if nb <= TOPK:  # nothing to rank (the seeds' short-context guard)
        _resolve_backend(backend, idx_q.device, soc)
        torch = require_torch()
        ids = select_from_head_max(torch.zeros(NIDX, nb), nb, head_reduce=head_reduce)
        return (ids, 0.0) if backend == "sim" else ids
    if block_max == "device":
        hm, us = _run_block_max(idx_q, idx_k, nb, seq_len, backend, soc)
        ids = select_from_head_max(hm, nb, head_reduce=head_reduce)
    else:
        s, us = _run_scores(idx_q, idx_k, nb, backend, soc)
        ids = select_blocks(s, nb, seq_len=seq_len, head_reduce=head_reduce)
    return (ids, us) if backend == "sim" else ids


__all__ = [
    "BLOCK_MAX",
    "KTILE",
    "build_block_max_kernel",
    "build_kernel",
    "key_tile",
    "msa_indexer",
    "msa_indexer_scores",
    "select_blocks",
    "select_from_head_max",
]
