"""The contract of the MiniMax-M3 MSA block-sparse decode (``msa_sparse_decode``), written
once for the golden and the device wrapper, and its split-KV rule.

NumPy on host data; :mod:`tilesim.reference.msa_decode` and :mod:`tilesim.device.msa_decode`
call these functions, so both apply literally the same rule (``docs/ops/msa_decode.md``):

* :class:`Args`, :func:`check_meta` (shapes, dtypes, an int ``seq_len``; no value read, so it
  works on torch ``meta`` / FakeTensors and for ``validate=False``), :func:`check_values`
  (block ids in range and unique per row, ``seq_len`` arrays in range: host copies);
* **Keep-mask** (:func:`decode_keep_mask`, torch twin :func:`keep_mask_torch`):
  ``cur = (seq_len-1)//by``; a slot holding block ``cur`` keeps its first
  ``seq_len - by*cur`` keys, a slot holding a later block is dropped, earlier blocks are kept
  whole (key ``t`` of block ``b`` is kept iff ``by*b + t < seq_len``). The current block is
  recognised by id, so slot order is free. Masking is NaN-robust: a dropped key's score is SET
  to the mask constant (a select) and its V row is zeroed before P.V (:func:`decode_read_mask`
  says which gathered V rows are read), so whatever a dropped slot holds never reaches the
  output. :func:`host_plan` gives both masks; :func:`page_table_torch` the device's page ids;
* :func:`cost`: the op's one FLOP / byte counter;
* **Split-KV**: which key chunks form which split, and the rule that picks the split count.

A (batch row, KV head) of the decode reads ``topk*128`` selected keys in NTILE-wide chunks
(``ceil(topk*128 / ntile)`` chunks, the last one maybe partial). With
``MsaTiling.kv_splits = k`` the chunks are grouped into ranges of ``ceil(chunks / k)``
consecutive chunks (:func:`tilesim.shared.layouts.splitkv.split_ranges`); each range is an
independent online softmax with its own FP32 ``(O, l, m)`` state, and the ranges' states are
then folded into range 0's state in range order ``1, 2, ..`` with the same online-merge
formulas, before ``bf16(O / l)``.
The layout depends on ``topk`` and ``ntile`` only (never on ``seq_len`` or the ids): a range
whose keys are all masked is folded like any other (its merge weight is exactly 0).
``kv_splits = 1`` is the unsplit chunk loop. So is every ``k`` that gives one chunk per range.

:func:`default_kv_splits` is the rule (a pure function of the call shape and the SoC's cube
core count), :func:`split_tiling` applies it to a tiling and :func:`resolve_tiling` is what
both the golden and the kernel do with their ``tiling`` argument: ``None`` means
``MsaTiling.from_env()`` with ``kv_splits`` by the rule for the call's ``soc``; an explicit
tiling is used as given. So the same call gives the same bits in both.

Functions taking an array return the kind (NumPy or torch) of their first array argument.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16
from tilesim.shared.layouts import splitkv
from tilesim.shared.msa_indexer import BY, TOPK  # the indexer's picks: TOPK blocks of BY keys
from tilesim.shared.registry.op_record import ROUNDS_LIKE_GOLDEN, Call, OpRecord, Output
from tilesim.shared.tiling import MsaTiling
from tilesim.shared.validate import (
    check_array,
    check_instance,
    check_int_array,
    check_ndim,
    check_pos_int,
    host_array,
    host_ints,
    is_array,
    same_kind,
    shape_of,
)


class Args(NamedTuple):
    """The checked decode arguments: sizes (:func:`check_meta`), then the host block ids and
    per-row lengths (``None`` until :func:`check_values` fills them), and the caller's
    ``block_ids`` / ``seq_len`` as given (not copied)."""

    batch: int
    hq: int
    hkv: int
    nb: int
    by: int
    dim: int
    topk: int
    ids: np.ndarray | None = None  #: int64 ``[B, topk]`` (:func:`check_values`)
    seq: np.ndarray | None = None  #: int64 ``[B]`` (:func:`check_values`)
    block_ids: object = None  #: the caller's ``[B, topk]`` integer array / tensor
    seq_len: object = None  #: the caller's int or integer ``[B]`` array / tensor

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.hq // self.hkv


def _meta_block_ids(block_ids, batch: int) -> int:
    """Integer ``[batch, topk >= 1]`` (metadata) -> ``topk``."""
    shape = check_int_array(block_ids, "block_ids", ndim=2, layout="[B, topk]")
    if shape[0] != batch or shape[1] < 1:
        raise ValueError(f"block_ids: expected shape ({batch}, topk>=1), got {shape}")
    return shape[1]


def _seq_range(a: np.ndarray, nb: int, by: int) -> None:
    """``ValueError`` naming the first batch row of int64 ``a`` outside ``[1, nb*by]``."""
    bad = (a < 1) | (a > nb * by)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"seq_len: expected 1 <= seq_len <= nb*{by} = {nb * by}, got {int(a[b])} "
            f"(batch row {b})"
        )


def _seq_type(seq_len, batch: int) -> None:
    if isinstance(seq_len, (bool, np.bool_)) or not (
        isinstance(seq_len, (int, np.integer)) or is_array(seq_len)
    ):
        raise TypeError(
            f"seq_len: expected an int or an integer array of {batch} values, "
            f"got {type(seq_len).__name__} {seq_len!r}"
        )


def _meta_seq_len(seq_len, batch: int, nb: int, by: int) -> None:
    """``seq_len``: one int (range checked: a static value) or an integer array / tensor of
    shape ``()`` or ``(batch,)`` (metadata only). Lists are refused like every array."""
    _seq_type(seq_len, batch)
    if not is_array(seq_len):
        _seq_range(np.full(batch, int(seq_len), dtype=np.int64), nb, by)
        return
    shape = check_int_array(seq_len, "seq_len")
    if shape not in ((), (batch,)):
        raise ValueError(f"seq_len: expected one int or shape ({batch},), got {shape}")


def check_block_ids(block_ids, batch: int, nb: int) -> np.ndarray:
    """Integer ``[batch, topk >= 1]`` ids in ``[0, nb)``, unique per row -> int64 host copy."""
    ids = host_ints(block_ids, "block_ids", ndim=2, layout="[B, topk]")
    if ids.shape[0] != batch or ids.shape[1] < 1:
        raise ValueError(f"block_ids: expected shape ({batch}, topk>=1), got {ids.shape}")
    if ids.min() < 0 or ids.max() >= nb:
        raise ValueError(
            f"block_ids: expected ids in [0, nb={nb}), got min {ids.min()} max {ids.max()}"
        )
    srt = np.sort(ids, axis=1)
    dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
    if dup.any():
        b = int(np.flatnonzero(dup)[0])
        raise ValueError(f"block_ids: expected unique ids per row, row {b} is {ids[b].tolist()}")
    return ids


def check_decode_seq_len(seq_len, batch: int, nb: int, by: int) -> np.ndarray:
    """One int (or a 0-d integer array) or an integer array / tensor ``[batch]``, each in
    ``[1, nb*by]`` -> int64 ``[batch]``. Lists are refused like every array argument."""
    _seq_type(seq_len, batch)
    if is_array(seq_len):
        a = host_ints(seq_len, "seq_len")
        if a.ndim == 0:  # a 0-d array / tensor is one int
            a = np.full(batch, int(a), dtype=np.int64)
        if a.shape != (batch,):
            raise ValueError(f"seq_len: expected one int or shape ({batch},), got {a.shape}")
    else:
        a = np.full(batch, int(seq_len), dtype=np.int64)
    _seq_range(a, nb, by)
    return a


def decode_inputs(q, k_blocks, v_blocks, block_ids, seq_len, *, tiling: MsaTiling | None = None):
    """The arguments of ``msa_sparse_decode`` that the golden and the kernel wrapper share,
    written once (the golden and the wrapper write them out, tests/test_op_records.py holds them
    equal): BF16 ``q [B, HQ, D]``, the paged BF16 ``k_blocks`` / ``v_blocks [B, HKV, nb, 128,
    D]``, int ``block_ids [B, topk]``, ``seq_len`` (an int or ``B`` ints), then ``tiling``
    (``None``: :func:`resolve_tiling`)."""


def check_meta(q, k_blocks, v_blocks, block_ids, seq_len, *, block_size: int | None = None) -> Args:
    """Metadata checks of ``msa_sparse_decode`` (reference and device; no value read): BF16
    ``q [B, HQ, D]`` and paged ``k_blocks`` / ``v_blocks [B, HKV, nb, BY, D]`` with
    ``HQ % HKV == 0`` (``block_size``: a required BY, the kernel's 128), integer ``block_ids
    [B, topk >= 1]``, ``seq_len`` one int in ``[1, nb*BY]`` or an integer array of shape ``()``
    / ``(B,)``. Returns :class:`Args` with ``ids`` / ``seq`` ``None``."""
    batch, hq, hkv, nb, by, dim = _meta_arrays(q, k_blocks, v_blocks, block_size)
    topk = _meta_block_ids(block_ids, batch)
    _meta_seq_len(seq_len, batch, nb, by)
    return Args(batch, hq, hkv, nb, by, dim, topk, None, None, block_ids, seq_len)


def _meta_arrays(q, k_blocks, v_blocks, block_size):
    """The q / K / V checks -> ``(batch, hq, hkv, nb, by, dim)``."""
    for name, x in (("q", q), ("k_blocks", k_blocks), ("v_blocks", v_blocks)):
        check_array(x, name, dtype=BF16)
    batch, hq, dim = check_ndim(q, "q", 3, "[B, HQ, D]")
    if min(batch, hq, dim) < 1:
        raise ValueError(f"q: expected a non-empty [B, HQ, D] array, got shape {(batch, hq, dim)}")
    kshape = check_ndim(k_blocks, "k_blocks", 5, "[B, HKV, nb, BY, D]")
    kb, hkv, nb, by, kdim = kshape
    want_by = by if block_size is None else block_size
    if kb != batch or kdim != dim or hkv < 1 or nb < 1 or by < 1 or by != want_by:
        by_text = "BY" if block_size is None else str(block_size)
        raise ValueError(
            f"k_blocks: expected shape ({batch}, HKV, nb, {by_text}, {dim}) matching q "
            f"{(batch, hq, dim)}, got {kshape}"
        )
    if hq % hkv:
        raise ValueError(f"q: expected HQ a multiple of HKV={hkv}, got HQ={hq}")
    if shape_of(v_blocks, "v_blocks") != kshape:
        raise ValueError(
            f"v_blocks: expected the shape of k_blocks {kshape}, "
            f"got {shape_of(v_blocks, 'v_blocks')}"
        )
    return batch, hq, hkv, nb, by, dim


def check_int_values(args: Args) -> Args:
    """Value checks (host copies of ``block_ids`` and a ``seq_len`` array):
    :func:`check_block_ids` and :func:`check_decode_seq_len`, same errors. Returns ``args``
    with the int64 host ``ids [B, topk]`` and ``seq [B]`` filled in."""
    ids = check_block_ids(args.block_ids, args.batch, args.nb)
    seq = check_decode_seq_len(args.seq_len, args.batch, args.nb, args.by)
    return args._replace(ids=ids, seq=seq)


def check_values(args: Args) -> Args:
    """Every value check of the op (the golden runs them all): :func:`check_int_values`; the op
    scans no bulk data."""
    return check_int_values(args)


class Plan(NamedTuple):
    """The host plan of a call (:func:`host_plan`)."""

    keep: np.ndarray  #: bool ``[B, topk*by]``: the key's score counts
    read: np.ndarray  #: bool ``[B, topk*by]``: the key's gathered V row is read (else zeroed)


def host_plan(args: Args, *, seeds_compat: bool = False) -> Plan:
    """The host rules of a value-checked call (:func:`check_values`): the keep-mask
    (:func:`decode_keep_mask`) and the V rows P.V reads (:func:`decode_read_mask`). The
    device builds the same mask on its own device with :func:`keep_mask_torch`."""
    keep = decode_keep_mask(args.ids, args.seq, args.by)
    return Plan(keep > 0, decode_read_mask(keep, seeds_compat=seeds_compat))


def cost(args: Args, *, keys: int | None = None) -> dict:
    """``{"flop", "bytes"}`` of a decode call.

    ``flop``: 2 per multiply-add of ``S = Q K^T`` and ``P V`` for ``batch`` rows of ``hq``
    query heads over ``keys`` gathered keys each (default ``topk*by``: the keys the chunk loop
    runs, masked keys included), head dim ``dim``. ``bytes``: HBM bytes read + written: the
    BF16 query ``[B, HQ, D]``, the BF16 K and V rows of the ``keys`` gathered keys of every
    (batch row, KV head) and the BF16 output ``[B, HQ, D]`` (ids, lengths, masks not counted).
    """
    keys = args.topk * args.by if keys is None else check_pos_int(keys, "keys")
    flop = 4 * args.batch * args.hq * keys * args.dim
    q_out = 2 * args.batch * args.hq * args.dim * 2
    kv = 2 * args.batch * args.hkv * keys * args.dim * 2
    return {"flop": flop, "bytes": q_out + kv}


def sized_args(batch: int, hq: int, dim: int, *, hkv: int = 1, topk: int = 1) -> Args:
    """:class:`Args` from sizes alone (no arrays; ``nb = topk``, ``by = 128``), for
    :func:`cost`; each size a positive int (``TypeError`` / ``ValueError`` naming it)."""
    sizes = {"batch": batch, "hq": hq, "dim": dim, "hkv": hkv, "topk": topk}
    batch, hq, dim, hkv, topk = (check_pos_int(v, name) for name, v in sizes.items())
    return Args(batch, hq, hkv, topk, BY, dim, topk)


def keep_mask_torch(ids, seq):
    """The torch twin of :func:`decode_keep_mask`, built where ``ids`` live (no host copy):
    FP32 ``[B, topk*128]``, key ``t`` of the block in a slot kept iff ``128*block + t <
    seq_len`` (the per-token form, tested equal). ``ids``: integer ``[B, topk]`` tensor,
    ``seq``: integer ``[B]`` tensor on the same device."""
    import torch  # lazily: importing this module needs no torch

    t = torch.arange(BY, device=ids.device, dtype=torch.int64)
    pos = ids.to(torch.int64)[:, :, None] * BY + t  # [B, topk, 128] absolute key positions
    keep = pos < seq.to(torch.int64).reshape(-1, 1, 1)
    return keep.reshape(ids.shape[0], -1).to(torch.float32)


def page_table_torch(ids, hkv: int, nb: int):
    """INT32 ``[B*HKV, topk]`` global page ids, computed where ``ids`` live: row ``b*HKV + h``
    holds ``(b*HKV + h)*nb + block_ids[b]`` -- the pages of (batch row, KV head) in the cache
    viewed as ``[B*HKV*nb*128, 128]`` rows."""
    import torch  # lazily

    batch = ids.shape[0]
    base = torch.arange(batch * hkv, device=ids.device, dtype=torch.int64).reshape(batch, hkv, 1)
    return (ids.to(torch.int64)[:, None, :] + base * nb).reshape(batch * hkv, -1).to(torch.int32)


def decode_keep_mask(block_ids, seq_len, by: int = BY):
    """FP32 ``[B, topk*by]`` keep-mask (1 keep, 0 drop) of integer ``block_ids [B, topk]`` and
    per-row ``seq_len [B]`` (see the module docstring); same kind as ``block_ids``."""
    ids = host_ints(block_ids, "block_ids", ndim=2, layout="[B, topk]")
    seq = host_ints(seq_len, "seq_len", ndim=1).reshape(-1)
    cur = (seq - 1) // by  # [B]
    cur_valid = seq - cur * by  # [B], 1..by
    t = np.arange(by)
    keep = np.where(
        (ids == cur[:, None])[:, :, None],
        t[None, None, :] < cur_valid[:, None, None],
        (ids < cur[:, None])[:, :, None],
    )  # [B, topk, by]
    return same_kind(keep.reshape(ids.shape[0], -1).astype(np.float32), block_ids)


def decode_read_mask(keep, *, seeds_compat: bool = False) -> np.ndarray:
    """bool ``[B, topk*by]``: the gathered V rows P.V reads, from the keep-mask ``keep``
    (:func:`decode_keep_mask`, FP32 1/0 or bool; host data). The other rows are zeroed before
    P.V. A kept key is read; a dropped key is not, except in a batch row with no kept key under
    ``seeds_compat=True``: there the seeds' kernel's arithmetic (P uniform, the mean of the
    gathered V) is reproduced, so every gathered row is read."""
    k = np.asarray(host_array(keep, "keep")) > 0
    if seeds_compat:
        k = k | ~k.any(axis=1, keepdims=True)
    return k


#: a split is considered only when a (batch row, KV head) has at least this many chunks. In
#: PyPTO 0.2.0's cost model (gather "device", B 1) 2 splits of 4 chunks (M3's topk 16) cost
#: more than 1 on both SoCs and 8 chunks (topk 32, 910B) cost the same: the model fuses a
#: pair's whole merge chain (every chunk's merge and the split combine) into one vector task
#: that waits for the pair's last P.V, so a split cannot shorten it. The kernel builds that
#: task on purpose (one merge task per pair, docs/ops/msa_decode.md#kernel). 16 chunks and more
#: are not measured. The figures: docs/perf/journal.md.
SPLIT_MIN_CHUNKS = 16


def n_chunks(topk: int, ntile: int, block_size: int = BY) -> int:
    """Key chunks of one (batch row, KV head): ``ceil(topk*block_size / ntile)`` (tail kept)."""
    keys = check_pos_int(topk, "topk") * check_pos_int(block_size, "block_size")
    return -(-keys // check_pos_int(ntile, "ntile"))


#: the decode's split policy: the kernel merges chunk after chunk in a range, then folds the
#: other ranges into range 0 (range 0's state is the combine's start, no copy):
#: :func:`tilesim.shared.layouts.splitkv.loop_merge_chain`; no cap; at least
#: :data:`SPLIT_MIN_CHUNKS`
SPLIT_RULE = splitkv.SplitRule(min_units=SPLIT_MIN_CHUNKS)


def _split_work(batch: int, hkv: int, topk: int, ntile: int, block_size: int) -> dict:
    """``items`` (the ``batch * hkv`` (batch row, KV head) pairs) and ``units`` (a pair's
    chunks, :func:`n_chunks`), checked."""
    items = check_pos_int(batch, "batch") * check_pos_int(hkv, "hkv")
    return {"items": items, "units": n_chunks(topk, ntile, block_size)}


def default_kv_splits(*, batch: int, hkv: int, topk: int, ntile: int, soc: str,
                      block_size: int = BY) -> int:  # fmt: skip
    """The split count for a decode call: a pure function of the shape and the SoC
    (:data:`SPLIT_RULE`).

    ``items = batch * hkv`` independent (batch row, KV head) work items. When they fill the
    cube cores (``items >= aic_cores``) or a pair has fewer than :data:`SPLIT_MIN_CHUNKS`
    chunks, 1. Otherwise the smallest ``k <= min(chunks, aic_cores // items)`` (each range can
    have a core) with the shortest merge chain (about ``sqrt(chunks)`` ranges), returned as
    the number of ranges it gives (:func:`tilesim.shared.layouts.splitkv.default_kv_splits`). M3
    decode (topk 16, NTILE 512: 4 chunks) -> 1 on every SoC and batch; topk 64 (16 chunks),
    HKV 4, B 1 -> 4 (chain 6 instead of 15) on the 910B (24 cube cores) and the 950 (28).
    """
    work = _split_work(batch, hkv, topk, ntile, block_size)
    return SPLIT_RULE.kv_splits(**work, soc=soc)


def split_tiling(tiling: MsaTiling, *, batch: int, hkv: int, topk: int, soc: str) -> MsaTiling:
    """``tiling`` with ``kv_splits`` set by :func:`default_kv_splits` (give the result to both
    the golden and the kernel)."""
    check_instance(tiling, "tiling", MsaTiling)
    work = _split_work(batch, hkv, topk, tiling.ntile, tiling.block_size)
    return SPLIT_RULE.split_tiling(tiling, **work, soc=soc)


def resolve_tiling(tiling, *, batch: int, hkv: int, topk: int, soc: str) -> MsaTiling:
    """The tiling the call runs with, in the golden and the kernel alike (what
    ``resolve_tiling`` means in every op: a given tiling is checked and used as it is, ``None``
    is the op's default for the call). An :class:`MsaTiling` as given (``TypeError``
    otherwise); ``None``: ``MsaTiling.from_env()`` (``MSA_NTILE``) with ``kv_splits`` by
    :func:`split_tiling` for this shape and ``soc``."""
    if tiling is None:
        return split_tiling(MsaTiling.from_env(), batch=batch, hkv=hkv, topk=topk, soc=soc)
    check_instance(tiling, "tiling", MsaTiling)
    return tiling


# ----------------------------------------------------------------------------- record
#: the op's record in the registry of ops (:mod:`tilesim.shared.registry.ops`)
RECORD = OpRecord(
    name="msa_decode",
    family="msa",
    calls=(
        Call("msa_sparse_decode", "msa_decode", (Output("out", "float", ("batch", "head")),),
             signature=(decode_inputs,), judge_kind="msa_decode", device=True,
             l2_units=1.4),
    ),
    cost=cost,
    int_checks=check_int_values,
    names={"msa_sparse_decode_flop": "msa_decode"},
    budgets=ROUNDS_LIKE_GOLDEN,
)  # fmt: skip


__all__ = [
    "RECORD",
    "BY",
    "Args",
    "Plan",
    "SPLIT_MIN_CHUNKS",
    "SPLIT_RULE",
    "TOPK",
    "check_block_ids",
    "check_decode_seq_len",
    "check_meta",
    "check_values",
    "check_int_values",
    "cost",
    "decode_inputs",
    "decode_keep_mask",
    "decode_read_mask",
    "default_kv_splits",
    "host_plan",
    "keep_mask_torch",
    "n_chunks",
    "page_table_torch",
    "resolve_tiling",
    "sized_args",
    "split_tiling",
]
