"""Rules of the MiniMax-M3 MSA main branch, used by the reference
(:mod:`tilesim.reference.msa_main`, NumPy on host data) and the device wrapper
(:mod:`tilesim.device.msa_main`, the torch twins on the inputs' device).

* :func:`build_msa_block_mask` — the host's FP32 additive block mask
  ``[ceil(n/bk), topk, bk, bk]`` built from the selected block ids.
* :func:`kernel_mask` — the wrapper's ``[max_n, topk*bk]`` FP32 kernel mask made from it;
  :func:`kernel_mask_torch` is its torch twin (same entries, on the mask's device, optionally
  -1e9 from row ``n`` on).
* :func:`read_keys` — the keys some query row sees; the K and V rows of the others (padding
  slots, token positions past ``n``) are zeroed before the kernel, whatever they held (NaN).
  :func:`mask_flags_torch` gives it, and the rows that see some key, from the block mask on
  its device (no ``[n, topk*bk]`` array is built).
* The contract of ``msa_main_branch``: :class:`Args`; :func:`check_meta` — the argument rules
  the reference and the wrapper share that need no value (dtypes, the shape relations between
  query, key/value blocks and block mask, ``dtype``, ``max_n``, ``tiling``); never reads data;
  :func:`check_values` — the finiteness of the block mask (:func:`check_mask_finite`; on an
  accelerator a device reduction, one flag read back); :func:`host_plan` — the kernel mask
  rows ``< n``, the read keys and the rows that see a key in NumPy, :func:`host_plan_torch`
  its torch twin; :func:`cost` — the one FLOP / byte counter.

The torch twins are tested bit-identical to the NumPy rules
(``tests/shared/test_msa_main_device.py``). torch is imported only when a twin is called.

The rules are described in ``docs/ops/msa_main.md``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16, FP32
from tilesim.shared.interop import is_torch_tensor, to_torch
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.registry.op_record import Call, OpRecord, Output
from tilesim.shared.tiling import MSA_DTYPES, MsaTiling
from tilesim.shared.validate import (
    check_choice,
    check_dtype,
    check_elements,
    check_finite,
    check_instance,
    check_int,
    check_ndim,
    check_pos_int,
    check_range,
    host_array,
    host_ints,
    same_kind,
    shape_of,
)

#: the mask value of a key a query row must not see (-1e9, exact in FP32)
MASK_NEG = np.float32(MINIMAX_M3.msa.prefill_mask_neg)
#: the largest prefill row count (``n``, ``max_n``) accepted: far above any model's context, so
#: that a typo fails with a bound check instead of a multi-GiB allocation
MAX_PREFILL_ROWS = 1 << 20
#: dtypes accepted for query, key_blocks and value_blocks (widened exactly before the cast)
MAIN_INPUT_DTYPES = (FP32, np.dtype(np.float16), BF16)


def build_msa_block_mask(n, topk_indices, *, bk=128, topk=16):
    """The host's additive block mask of the main branch.

    Args:
        n: query (= key) length of the sequence, ``1 <= n <= MAX_PREFILL_ROWS``.
        topk_indices: 1-D integer ids of the ``ksel <= topk`` selected blocks in slot order,
            unique, each in ``[0, ceil(n/bk))`` (NumPy array or torch tensor).
        bk: block size; topk: slots (slots ``>= ksel`` are zero padding).

    Returns:
        FP32 ``[ceil(n/bk), topk, bk, bk]``: entry ``[qb, i, r, c]`` is 0 when slot ``i`` is
        real, query row ``qb*bk + r < n`` and block ``topk_indices[i]`` is before ``qb``, or
        equals ``qb`` with ``c <= r``; -1e9 otherwise. Same kind as ``topk_indices``.
        Sizes are bound-checked (``ValueError`` naming them) before the mask is allocated.
    """
    n = check_pos_int(n, "n")
    if n > MAX_PREFILL_ROWS:  # before the [ceil(n/bk), topk, bk, bk] allocation
        raise ValueError(
            f"n: expected an int in [1, {MAX_PREFILL_ROWS}] (MAX_PREFILL_ROWS of "
            f"tilesim.shared.msa_main, the largest prefill row count accepted, as for max_n), "
            f"got {n}"
        )
    bk = check_pos_int(bk, "bk")
    topk = check_pos_int(topk, "topk")
    nbq = math.ceil(n / bk)
    check_elements((nbq, topk, bk, bk), "n, topk, bk", "the block mask")
    ids = host_ints(topk_indices, "topk_indices", ndim=1, layout="[ksel] of selected block ids")
    ksel = ids.shape[0]
    if not 1 <= ksel <= topk:
        raise ValueError(f"topk_indices: expected 1..topk={topk} ids, got {ksel}")
    check_range(ids, "topk_indices", 0, nbq - 1)
    if np.unique(ids).size != ksel:
        raise ValueError(f"topk_indices: expected unique ids, got {ids.tolist()}")

    last_valid = n - (nbq - 1) * bk  # rows of the last query block
    mask = np.full((nbq, topk, bk, bk), MASK_NEG, dtype=FP32)
    r = np.arange(bk)[:, None]
    c = np.arange(bk)[None, :]
    for qb in range(nbq):
        qb_valid = last_valid if qb == nbq - 1 else bk
        for i in range(ksel):
            kv = int(ids[i])
            if kv > qb:
                continue  # future block: stays masked
            allowed = (c <= r) if kv == qb else np.ones((bk, bk), dtype=bool)  # diagonal: causal
            mask[qb, i][allowed & (r < qb_valid)] = 0.0
    return same_kind(mask, topk_indices)


def kernel_mask(block_mask, max_n: int) -> np.ndarray:
    """The wrapper's FP32 kernel mask ``[max_n, topk*bk]`` (a new host NumPy array).

    ``block_mask [nbq, topk, bk, bk]`` (array or tensor) is transposed to
    ``[nbq, bk, topk, bk]`` and reshaped, so entry ``[qb*bk + r, i*bk + c]`` is
    ``block_mask[qb, i, r, c]``; rows ``nbq*bk .. max_n-1`` are -1e9.
    """
    bm = host_array(block_mask, "block_mask")
    nbq, topk, bk, _ = bm.shape
    m2 = bm.transpose(0, 2, 1, 3).reshape(nbq * bk, topk * bk)
    pad = np.full((max_n - nbq * bk, topk * bk), MASK_NEG, dtype=FP32)
    return np.concatenate([m2, pad], axis=0)


def read_keys(mask_rows: np.ndarray) -> np.ndarray:
    """bool ``[topk*bk]``: the keys that some query row sees (an entry > -1e9 in its column)
    of the kernel mask rows ``mask_rows [n, topk*bk]`` (the rows ``< n``).

    The other keys are read by nobody: a padding slot, a token position past ``n`` in the last
    block. Reference and wrapper zero their K and V rows (a select, so NaN or garbage there
    cannot reach a score or P.V); their scores are then ``0*scale + mask = mask`` exactly.
    """
    return (np.asarray(mask_rows) > MASK_NEG).any(axis=0)


def _as_tensor(block_mask):
    """``block_mask`` as a torch tensor (a NumPy array is wrapped without a copy)."""
    return block_mask.detach() if is_torch_tensor(block_mask) else to_torch(block_mask)


def kernel_mask_torch(block_mask, rows: int, *, n: int | None = None):
    """The torch twin of :func:`kernel_mask`: a new FP32 tensor ``[rows, topk*bk]`` on
    ``block_mask``'s device, built by torch ops there (no host copy, one pass over the mask).

    Entry ``[qb*bk + r, i*bk + c]`` is ``block_mask[qb, i, r, c]`` for the rows below
    ``min(n, nbq*bk, rows)``, -1e9 for every other row. With ``n=None`` and ``rows >=
    nbq*bk`` it equals ``kernel_mask(block_mask, rows)`` bit for bit; with ``n`` it is the
    device wrapper's mask (``kernel_mask`` rows ``< n``, padded with -1e9 rows to ``rows``).
    """
    import torch

    bm = _as_tensor(block_mask)
    nbq, topk, bk, _ = bm.shape
    keep = min(nbq * bk, rows, nbq * bk if n is None else max(int(n), 0))
    whole, part = divmod(keep, bk)
    out = torch.empty((rows, topk * bk), dtype=torch.float32, device=bm.device)
    out[: whole * bk].view(whole, bk, topk, bk).copy_(bm[:whole].permute(0, 2, 1, 3))
    if part:
        out[whole * bk : keep].view(part, topk, bk).copy_(bm[whole, :, :part].permute(1, 0, 2))
    out[keep:] = float(MASK_NEG)
    return out


def mask_flags_torch(block_mask, n: int):
    """``(read, seen)`` of the kernel mask rows ``< n``, from ``block_mask [nbq, topk, bk,
    bk]`` on its device by torch ops (no host copy, no ``[n, topk*bk]`` array): ``read``
    bool ``[topk*bk]`` = :func:`read_keys` of those rows (a key some row sees), ``seen`` bool
    ``[n]`` = the rows that see some key (an entry > -1e9 in their row)."""
    bm = _as_tensor(block_mask)
    nbq, topk, bk, _ = bm.shape
    vis = bm > float(MASK_NEG)  # [nbq, topk, bk, bk]
    whole, part = divmod(min(int(n), nbq * bk), bk)
    read = vis[:whole].any(dim=2).any(dim=0)  # [topk, bk]: over the whole query blocks
    if part:  # the rows < n of the last one
        read = read | vis[whole, :, :part].any(dim=1)
    seen = vis.any(dim=3).any(dim=1).reshape(nbq * bk)[:n]
    return read.reshape(topk * bk), seen


def check_mask_finite(block_mask) -> None:
    """The value check of :func:`check_values`: ``ValueError`` naming the first
    NaN / inf entry of ``block_mask``. A tensor off the CPU is reduced on its device first
    (``torch.isfinite(...).all()``: one flag read back); only a failing one is copied to the
    host, for the message. Host arrays and CPU tensors are checked in place (no copy); a
    ``meta`` tensor holds no data (``ValueError``)."""
    if is_torch_tensor(block_mask) and block_mask.device.type not in ("cpu", "meta"):
        import torch

        if bool(torch.isfinite(block_mask.detach()).all()):
            return
    check_finite(host_array(block_mask, "block_mask"), "block_mask")


class Args(NamedTuple):
    """The checked arguments of a main-branch call (shapes from the inputs' metadata)."""

    n: int  #: query rows
    hq: int  #: query heads
    hkv: int  #: KV heads
    dh: int  #: head dim
    nbq: int  #: query blocks, ``ceil(n/bk)``
    topk: int  #: slots
    bk: int  #: block size
    kv_len: int  #: ``topk*bk`` keys
    dtype: str  #: ``"fp32"`` / ``"fp16"`` / ``"bf16"``
    max_n: int  #: rows of the kernel mask
    tiling: MsaTiling
    #: the FP32 block mask as given (NumPy array or tensor; its values are read only by
    #: :func:`check_values`, :func:`host_plan` and :func:`cost`)
    block_mask: object


def _check_shapes(query, key_blocks, value_blocks, block_mask) -> tuple[int, ...]:
    """``(n, hq, hkv, dh, nbq, topk, bk, kv_len)`` after the shape relations are checked."""
    n, hq, dh = check_ndim(query, "query", 3, "[n, HQ, dh]")
    if min(n, hq, dh) < 1:
        raise ValueError(f"query: expected a non-empty [n, HQ, dh] array, got shape {(n, hq, dh)}")
    kshape = check_ndim(key_blocks, "key_blocks", 3, "[topk*bk, HKV, dh]")
    nbq, topk, bk, bk2 = check_ndim(block_mask, "block_mask", 4, "[ceil(n/bk), topk, bk, bk]")
    if bk2 != bk or bk < 1 or topk < 1 or nbq != math.ceil(n / bk):
        raise ValueError(
            f"block_mask: expected shape ({math.ceil(n / max(bk, 1))}, topk, bk, bk) for "
            f"n={n}, got {(nbq, topk, bk, bk2)}"
        )
    kv_len, hkv, kdh = kshape
    if kv_len != topk * bk or kdh != dh or hkv < 1:
        raise ValueError(
            f"key_blocks: expected shape ({topk * bk}, HKV, {dh}) (topk*bk rows, query's dh), "
            f"got {kshape}"
        )
    if hq % hkv:
        raise ValueError(f"query: expected HQ a multiple of HKV={hkv}, got HQ={hq}")
    vshape = shape_of(value_blocks, "value_blocks")
    if vshape != kshape:
        raise ValueError(f"value_blocks: expected the shape of key_blocks {kshape}, got {vshape}")
    return n, hq, hkv, dh, nbq, topk, bk, kv_len


def main_inputs(
    query,
    key_blocks,
    value_blocks,
    block_mask,
    *,
    dtype: str | None = None,
    max_n: int | None = None,
    tiling: MsaTiling | None = None,
):
    """The arguments of ``msa_main_branch`` that the golden and the kernel wrapper share,
    written once (the golden and the wrapper write them out, tests/test_op_records.py holds them
    equal): ``query [n, HQ, dh]``, ``key_blocks`` / ``value_blocks [topk*bk, HKV, dh]``, the
    FP32 ``block_mask [ceil(n/bk), topk, bk, bk]``, then ``dtype``, ``max_n`` and ``tiling``
    (``None``: as in :func:`check_meta`, whose parameters these are)."""


def check_meta(
    query, key_blocks, value_blocks, block_mask, *, dtype=None, max_n=None, tiling=None
) -> Args:
    """The argument rules of the main branch that need no value, shared by the reference and
    the wrapper; reads no data (FakeTensor / ``meta`` inputs and ``validate=False`` use it).

    ``tiling=None`` is ``MsaTiling.from_env()`` (read now); ``dtype=None`` / ``max_n=None``
    take ``tiling.dtype`` / ``tiling.max_n``. ``max_n`` must be a multiple of bk and
    ``>= ceil(n/bk)*bk``. Raises ``TypeError`` / ``ValueError`` naming the argument.
    """
    tiling = MsaTiling.from_env() if tiling is None else tiling
    check_instance(tiling, "tiling", MsaTiling)
    dtype = check_choice(tiling.dtype if dtype is None else dtype, "dtype", MSA_DTYPES)
    for name, x in (("query", query), ("key_blocks", key_blocks), ("value_blocks", value_blocks)):
        check_dtype(x, name, MAIN_INPUT_DTYPES)
    check_dtype(block_mask, "block_mask", FP32)
    n, hq, hkv, dh, nbq, topk, bk, kv_len = _check_shapes(
        query, key_blocks, value_blocks, block_mask
    )
    max_n = check_int(tiling.max_n if max_n is None else max_n, "max_n", lo=1, hi=MAX_PREFILL_ROWS)
    if max_n % bk or max_n < nbq * bk:
        raise ValueError(
            f"max_n: expected a multiple of bk={bk} and >= ceil(n/bk)*bk = {nbq * bk}, got {max_n}"
        )
    return Args(n, hq, hkv, dh, nbq, topk, bk, kv_len, dtype, max_n, tiling, block_mask)


def check_data_values(args: Args) -> Args:
    """The value rule: the block mask must be finite (masked keys carry -1e9, not -inf);
    ``ValueError`` naming the first NaN / inf entry (:func:`check_mask_finite`). Returns
    ``args``."""
    check_mask_finite(args.block_mask)
    return args


def check_values(args: Args) -> Args:
    """Every value check of the op (the golden runs them all): :func:`check_data_values`; the
    op reads no integer input on the host."""
    return check_data_values(args)


class MainPlan(NamedTuple):
    """The host rules of one call (NumPy, :func:`host_plan`)."""

    mask2d: np.ndarray  #: FP32 ``[n, kv_len]``: the kernel mask rows ``< n``
    read: np.ndarray  #: bool ``[kv_len]``: :func:`read_keys` (a key some row sees)
    seen: np.ndarray  #: bool ``[n]``: the rows that see some key


def host_plan(args: Args) -> MainPlan:
    """The kernel mask rows ``< n`` (:func:`kernel_mask`; rows past ``nbq*bk`` are never read),
    the keys some row reads and the rows that see a key, from ``args.block_mask`` on the host.
    The torch twin on the mask's device: :func:`host_plan_torch`."""
    mask2d = kernel_mask(args.block_mask, args.nbq * args.bk)[: args.n]
    visible = mask2d > MASK_NEG
    return MainPlan(mask2d, visible.any(axis=0), visible.any(axis=1))


def host_plan_torch(args: Args, rows: int, block_mask=None):
    """The torch twin of :func:`host_plan` on the mask's device (no host copy): ``(mask [rows,
    kv_len] FP32, read [kv_len], seen [n])`` -- :func:`kernel_mask_torch` with ``n`` (rows
    ``>= n`` are -1e9) and :func:`mask_flags_torch`. ``block_mask``: the mask to use (e.g.
    moved to the query's device), default ``args.block_mask``."""
    bm = args.block_mask if block_mask is None else block_mask
    read, seen = mask_flags_torch(bm, args.n)
    return kernel_mask_torch(bm, rows, n=args.n), read, seen


_ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}


def cost(args: Args) -> dict:
    """``{"flop": int, "bytes": int, "live_flop": int}`` of one call (``live_flop`` only when
    ``args.block_mask`` is not ``None``).

    ``flop``: the kernel's matmul FLOPs (2 per multiply-add), ``S = Q K^T`` and ``P V`` for
    ``n`` rows of ``hq`` heads over ``kv_len`` keys, masked keys included. ``live_flop``: the
    part any golden has to do (reads ``block_mask``): the ``(query block, slot)`` pairs with a
    visible entry (> -1e9), each with the block's real rows (< ``n``) and ``bk`` keys.
    ``bytes``: the kernel's HBM traffic, inputs read once and the output written once: q
    ``n*hq*dh``, k and v ``kv_len*hkv*dh`` each, in the kernel's operand dtype (4 bytes for
    ``"fp32"``, 2 otherwise), the FP32 kernel mask rows ``n*kv_len*4`` and the FP32 output
    ``n*hq*dh*4``.
    """
    n, hq, dh, kv_len = args.n, args.hq, args.dh, args.kv_len
    size = _ITEMSIZE[args.dtype]
    nbytes = size * (n * hq * dh + 2 * kv_len * args.hkv * dh) + 4 * n * kv_len + 4 * n * hq * dh
    flop = 2 * n * hq * kv_len * 2 * dh
    out = {"flop": flop, "bytes": nbytes}
    if args.block_mask is not None:
        out["live_flop"] = _live_flop(args)
    return out


def _live_flop(args: Args) -> int:
    mask = host_array(args.block_mask, "block_mask")
    rows = np.minimum(args.bk, args.n - np.arange(args.nbq) * args.bk)  # real rows per block
    live = (mask > MASK_NEG).any(axis=(2, 3))  # [nbq, topk]
    return int(2 * args.hq * 2 * args.dh * args.bk * (rows[:, None] * live).sum())


# ----------------------------------------------------------------------------- record
#: the op's record in the registry of ops (:mod:`tilesim.shared.registry.ops`)
RECORD = OpRecord(
    name="msa_main",
    family="msa",
    calls=(
        Call("msa_main_branch", "msa_main", (Output("out", "float", ("query", "head")),),
             signature=(main_inputs,), judge_kind="msa_main", device=True,
             l2_units=1.3),
    ),
    cost=cost,
    scan_checks=check_data_values,
    names={"build_msa_block_mask": "msa_main"},
    #: per compute dtype: the kernel's max |a - g| over max |g| of its golden
    budgets={"fp32": 2.0**-16, "fp16": 2.0**-12, "bf16": 2.0**-8},
)  # fmt: skip


__all__ = [
    "RECORD",
    "MAIN_INPUT_DTYPES",
    "MASK_NEG",
    "Args",
    "MainPlan",
    "build_msa_block_mask",
    "check_mask_finite",
    "check_meta",
    "check_values",
    "check_data_values",
    "cost",
    "host_plan",
    "host_plan_torch",
    "kernel_mask",
    "kernel_mask_torch",
    "main_inputs",
    "mask_flags_torch",
    "read_keys",
]
