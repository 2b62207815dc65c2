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
of the 4 heads, then the rule of :mod:`tilesim.shared.msa_indexer` on the device -- 15 rounds
of "row max, then the lowest block id scoring it" over a row padded to a static width
(:data:`RANK_WIDTHS`), NaN blocks explicitly last -- and only the INT32 ids are written; they
stay on the device. ``rank="host"`` splits the work instead: the score kernel (``block_max=
"host"``) or the block-max kernel (``"device"``, :func:`build_block_max_kernel`, ``[16, nb]``
maxima) and the shared rule on a host copy. Max, compares and selects are exact, so every
mode gives the same ids from the same FP32 scores, whatever the key rows past ``seq_len``
hold (NaN, inf, garbage; ``tests/device/test_sim_nan_poison.py``).

Checks and host plan: the op's contract :mod:`tilesim.shared.msa_indexer` (``check_meta``,
then ``check_data_values``, the finiteness scan, with ``validate="full"`` only; ``host_plan_torch``
for the masks). The jit
builders are :mod:`tilesim.device._msa_indexer_kernel`. Per-SoC key tile :data:`KTILE`
(``MSA_INDEXER_KTILE``). Importing needs neither torch nor pypto.
"""

from tilesim.device import backend as _backend
from tilesim.device._lazy import require_torch
from tilesim.device._msa_indexer_kernel import (
    JIT,
    SEED_JIT,
    build_block_max_kernel,
    build_kernel,
    build_select_kernel,
)
from tilesim.shared.msa_indexer import (
    BY,
    DIM,
    HEAD_REDUCES,
    NIDX,
    NPAD,
    RECORD,
    TOPK,
    Args,
    block_head_max,
    check_meta,
    host_plan_torch,
    select_from_head_max,
)
from tilesim.shared.soc import DEFAULT_SOC, MSA_DEVICE_TILES, msa_device_tile
from tilesim.shared.validate import check_choice, host_array

BLOCK_MAX = ("host", "device")
RANKS = ("device", "host")
#: the device ranking's static row widths (compile buckets): the smallest one ``>= nb`` is
#: used; a row of ``nb`` block scores is a ``valid_shape`` view of that width (an op that
#: touches the padding at all sees tie id NOT_CANDIDATE and score -inf there: it never wins).
#: One bucket: the cost model prices the width at next to nothing (docs/perf/journal.md), a
#: ``[4, 1024]`` FP32 buffer is 16 KB of UB. ``nb`` beyond it (128K tokens) is ranked on the
#: host (``rank="host"``).
RANK_WIDTHS = (1024,)


#: per-SoC defaults and the env override live in :mod:`tilesim.shared.soc`
KTILE = MSA_DEVICE_TILES["MSA_INDEXER_KTILE"][0]


def key_tile(soc=DEFAULT_SOC, env=None) -> int:
    """KTILE of ``soc`` (``MSA_INDEXER_KTILE`` overrides; see
    :func:`tilesim.shared.soc.msa_device_tile`)."""
    return msa_device_tile("MSA_INDEXER_KTILE", soc, env)


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


def block_max_launch(q, k, args: Args, soc: str):
    """``(kernel, inputs, outputs)`` of the fused block-max kernel: the padded query, the
    keys, the bool key mask of ``seq_len`` (``[1, nb*128]``, True below it) and the FP32
    ``[16, nb]`` output."""
    torch = require_torch()
    keep, _ = host_plan_torch(args, q.device)  # keys at or beyond seq_len take no part
    block_max = torch.zeros(NPAD, args.nb, dtype=torch.float32, device=q.device)
    kernel = build_block_max_kernel(key_tile(soc))
    return kernel, [_padded_query(q), k.contiguous(), keep], [block_max]


def rank_width(nb: int) -> int | None:
    """The :data:`RANK_WIDTHS` bucket of ``nb`` blocks (``None``: beyond the last one)."""
    return next((w for w in RANK_WIDTHS if nb <= w), None)


def select_launch(q, k, args: Args, soc: str):
    """``(kernel, inputs, outputs)`` of the fused select kernel (``rank="device"``, ``nb > 16``
    and ``nb <= RANK_WIDTHS[-1]``): the block-max kernel's inputs, the tie ids ``order``
    ``[1, width]`` FP32 (``0 .. nb-2``, then ``NOT_CANDIDATE`` for the local block and the
    padding), the ``[4, nb]`` block-max scratch and the INT32 ids ``[rows, 16]`` with column
    15 preset to the local block ``nb - 1``. The masks are the contract's torch plan
    (:func:`tilesim.shared.msa_indexer.host_plan_torch`); all built on the inputs' device."""
    torch = require_torch()
    nb, dev = args.nb, q.device
    width = rank_width(nb)
    rows = 1 if args.head_reduce == "max" else NIDX
    keep, order = host_plan_torch(args, dev, width)
    block_max = torch.zeros(NIDX, nb, dtype=torch.float32, device=dev)
    ids = torch.full((rows, TOPK), nb - 1, dtype=torch.int32, device=dev)
    kernel = build_select_kernel(key_tile(soc), width, rows)
    return kernel, [_padded_query(q), k.contiguous(), keep, order], [block_max, ids]


def _run_scores(q, k, nb: int, target: _backend.Target):
    """FP32 ``[4, nb*128]`` kernel scores (tensor) and the cost-model µs (``None`` on the NPU)."""
    kernel, ins, outs = score_launch(q, k, nb, target.soc)
    us = _backend.launch(kernel, ins, outs, target)
    return outs[0][:NIDX].contiguous(), us


def _run_block_max(q, k, args: Args, target: _backend.Target):
    """FP32 ``[4, nb]`` per-head block maxima from the fused kernel, and the cost-model µs."""
    kernel, ins, outs = block_max_launch(q, k, args, target.soc)
    us = _backend.launch(kernel, ins, outs, target)
    return outs[0][:NIDX].contiguous(), us


def _run_select(q, k, args: Args, target: _backend.Target):
    """INT32 ``[rows, 16]`` ids ranked on the device (on the inputs' device), and the µs."""
    kernel, ins, outs = select_launch(q, k, args, target.soc)
    us = _backend.launch(kernel, ins, outs, target)
    return outs[1], us


def _check(idx_q, idx_k, nb, validate, **selection) -> tuple[Args, bool]:
    """The shared contract: :func:`tilesim.shared.msa_indexer.check_meta` (metadata only),
    then, for ``validate="full"`` only, :func:`~tilesim.shared.msa_indexer.check_data_values` (the
    finiteness scan of ``idx_q`` / ``idx_k``: a host copy) when the inputs hold data
    (:func:`tilesim.device.backend.value_checks`; this op has no integer input to read).
    ``selection``: ``seq_len`` / ``head_reduce`` of an ``msa_indexer`` call. Returns
    ``(args, shape_only)``."""
    _backend.validate_level(validate)
    args = check_meta(idx_q, idx_k, nb, **selection)
    shape_only = _backend.is_shape_only(idx_q, idx_k, names=("idx_q", "idx_k"))
    _backend.value_checks(RECORD, args, validate, shape_only=shape_only)
    return args, shape_only


@_backend.graph_safe
def msa_indexer_scores(idx_q, idx_k, nb, *, backend="auto", soc=DEFAULT_SOC, validate=True):
    """Lightning-indexer scores on the device: FP32 ``[4, nb*128]``.

    ``idx_q`` ``[4, 128]`` BF16, ``idx_k`` ``[nb*128, 128]`` BF16 (NumPy or torch; checked by
    :func:`tilesim.shared.msa_indexer.check_meta` / ``check_values``, as in the reference).
    ``backend`` / ``soc``: :func:`tilesim.device.backend.resolve`; ``"sim"`` returns
    ``(scores, cost_us)``.
    ``validate``: ``True`` (default) and ``False`` check metadata only and copy nothing to
    the host (a NaN / inf input then ranks by the NaN rule); ``"full"`` copies ``idx_q`` /
    ``idx_k`` to the host to check that they are finite. FakeTensor / ``meta`` inputs: an empty
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


class HostRankWarning(UserWarning):
    """``msa_indexer`` with ``rank=None`` beyond :data:`RANK_WIDTHS`: the call copies the
    block scores to the host (no device ranking compiles that wide)."""


def _warn_host_rank(args: Args, block_max: str) -> None:
    """The :class:`HostRankWarning` of a ``rank=None`` call that :func:`resolve_rank` sent to
    the host, naming what it copies per call: the ``[4, nb*128]`` FP32 scores (2 KB a block)
    or, with ``block_max="device"``, the ``[4, nb]`` block maxima (16 B a block)."""
    import warnings

    if block_max == "device":
        what, nbytes, hint = "block maxima", NIDX * args.nb * 4, ""
    else:
        what, nbytes = "scores", NIDX * args.nb * BY * 4
        hint = f"; block_max='device' copies the block maxima instead ({NIDX * args.nb * 4} bytes)"
    warnings.warn(
        f"msa_indexer: nb={args.nb} is beyond the device ranking's {RANK_WIDTHS[-1]} blocks, "
        f"so this call copies the FP32 {what} ({nbytes} bytes) to the host and ranks there"
        f"{hint}; pass rank='host' to choose this without the warning",
        HostRankWarning,
        stacklevel=3,
    )


def _host_ranked(q, k, args: Args, block_max: str, target: _backend.Target):
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
    the shared rule of :mod:`tilesim.shared.msa_indexer` (15 best non-local blocks, equal
    scores: lower block id first, NaN blocks last, then the local block ``nb - 1``) -- and
    writes only the ids, which stay on the inputs' device: no device-to-host copy unless
    ``validate``. ``rank="host"``: the kernel writes the ``[16, nb*128]`` scores
    (``block_max="host"``, the seeds' split) or the ``[16, nb]`` block maxima
    (``block_max="device"``, :func:`build_block_max_kernel`) and the host applies the shared
    rule (:func:`resolve_rank` says which combinations are accepted). ``rank=None`` ranks on
    the device up to ``nb = RANK_WIDTHS[-1]`` (1024 blocks, 128K keys) and on the host beyond
    it, with a :class:`HostRankWarning` naming the bytes copied. Same ids in every mode;
    key rows at or beyond ``seq_len`` may hold anything (NaN included).
    ``validate``: as for :func:`msa_indexer_scores`.

    Returns INT32 ``[1, min(16, nb)]`` (``head_reduce="none"``: ``[4, min(16, nb)]``): on the
    inputs' device for ``rank="device"``, a CPU tensor for ``"host"``, a NumPy array for NumPy
    input; ``backend="sim"`` returns ``(ids, cost_us)``. ``nb <= 16`` launches no kernel (the
    answer is ``arange(nb)``; ``cost_us`` 0.0). FakeTensor / ``meta`` inputs: an empty INT32
    tensor of that shape on the inputs' device, no data read.
    """
    args, shape_only = _check(idx_q, idx_k, nb, validate, seq_len=seq_len, head_reduce=head_reduce)
    # the wrapper, not the caller, sends the ranking to the host (nb beyond RANK_WIDTHS)
    chosen = rank is None and block_max != "host"
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
        if chosen:
            _warn_host_rank(args, block_max)
        ids, us = _host_ranked(q, k, args, block_max, target)
    return _backend.finish(ids, us, target)


__all__ = [
    "BLOCK_MAX",
    "HEAD_REDUCES",
    "HostRankWarning",
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
]
