"""Split-KV for the MSA block-sparse decode: which key chunks form which split, and the rule
that picks the split count.

A (batch row, KV head) of the decode reads ``topk*128`` selected keys in NTILE-wide chunks
(``chunk_bounds``: ``ceil(topk*128 / ntile)`` chunks, the last one maybe partial). With
``MsaTiling.kv_splits = k`` the chunks are grouped into ranges of ``ceil(chunks / k)``
consecutive chunks (:func:`split_ranges`); each range is an independent online softmax with
its own FP32 ``(O, l, m)`` state, and the ranges' states are then folded into range 0's state
in range order ``1, 2, ..`` with the same online-merge formulas, before ``bf16(O / l)``.
The layout depends on ``topk`` and ``ntile`` only (never on ``seq_len`` or the ids): a range
whose keys are all masked is folded like any other (its merge weight is exactly 0).

``kv_splits = 1`` is the unsplit chunk loop. So is every ``k`` that gives one chunk per range:
folding single-chunk states in order is the chunk loop's own merge sequence (same bits).

The golden (``tilesim.reference.msa_decode``) and the kernel (``tilesim.device.msa_decode``)
take the split from the tiling they are given; :func:`default_kv_splits` is the rule (a pure
function of the call shape and the SoC's cube core count) and :func:`split_tiling` applies it
to a tiling. The kernel wrapper applies it when called with ``tiling=None``; the golden never
changes a tiling by itself.
"""

from __future__ import annotations

from tilesim.shared.soc import get_soc
from tilesim.shared.tiling import MsaTiling
from tilesim.shared.validate import check_instance, check_pos_int

__all__ = [
    "SPLIT_MIN_CHUNKS",
    "default_kv_splits",
    "effective_kv_splits",
    "merge_chain",
    "n_chunks",
    "split_ranges",
    "split_tiling",
]


#: a split is considered only when a (batch row, KV head) has at least this many chunks.
#: Measured in PyPTO 0.2.0's cost model (gather "device", B 1): 4 chunks (M3's topk 16) with 2
#: splits cost +9.7 us on the 910B and +10.4 us on the 950 (39.8 -> 50.2, 38.9 -> 48.6); 8
#: chunks (topk 32, 910B) 59.5 us with and without. The model fused a pair's whole merge chain
#: (every chunk's merge and the split combine) into one vector task that waits for the pair's
#: last P.V, so a split cannot shorten it. The kernel now builds that task on purpose (one
#: merge task per pair, docs/device.md): 4 chunks cost the same with 1 and 2 splits (910B
#: 29.8 us, 950 30.5 us). 16 chunks and more are not measured.
SPLIT_MIN_CHUNKS = 16


def n_chunks(topk: int, ntile: int, block_size: int = 128) -> int:
    """Key chunks of one (batch row, KV head): ``ceil(topk*block_size / ntile)`` (tail kept)."""
    keys = check_pos_int(topk, "topk") * check_pos_int(block_size, "block_size")
    return -(-keys // check_pos_int(ntile, "ntile"))


def split_ranges(chunks: int, kv_splits: int) -> list[tuple[int, int]]:
    """``[(first, stop), ...]`` chunk-index ranges of the splits (non-empty ones only):
    ``ceil(chunks / kv_splits)`` consecutive chunks per range, the last one maybe shorter."""
    chunks = check_pos_int(chunks, "chunks")
    per = -(-chunks // check_pos_int(kv_splits, "kv_splits"))
    return [(c, min(chunks, c + per)) for c in range(0, chunks, per)]


def effective_kv_splits(chunks: int, kv_splits: int) -> int:
    """How many ranges :func:`split_ranges` gives (<= ``kv_splits``): 4 chunks and
    ``kv_splits = 3`` give 2 chunks per range, so 2 ranges."""
    return len(split_ranges(chunks, kv_splits))


def merge_chain(chunks: int, kv_splits: int) -> int:
    """Dependent online merges on a pair's longest chain: ``per - 1`` inside a range, then
    ``ranges - 1`` folds of the other ranges into range 0 (range 0's state is the combine's
    start, no copy)."""
    ranges = split_ranges(chunks, kv_splits)
    per = ranges[0][1] - ranges[0][0]
    return (per - 1) + (len(ranges) - 1)


def default_kv_splits(*, batch: int, hkv: int, topk: int, ntile: int, soc: str,
                      block_size: int = 128) -> int:  # fmt: skip
    """The split count for a decode call: a pure function of the shape and the SoC.

    ``items = batch * hkv`` independent (batch row, KV head) work items. When they fill the
    cube cores (``items >= aic_cores``) or a pair has fewer than :data:`SPLIT_MIN_CHUNKS`
    chunks, 1. Otherwise the smallest ``k <= min(chunks, aic_cores // items)`` (each range can
    have a core) with the shortest merge chain :func:`merge_chain` (about ``sqrt(chunks)``
    ranges), returned as the number of ranges it gives. M3 decode (topk 16, NTILE 512: 4
    chunks) -> 1 on every SoC and batch; topk 64 (16 chunks), HKV 4, B 1 -> 4 (chain 6
    instead of 15) on the 910B (24 cube cores) and the 950 (28).
    """
    items = check_pos_int(batch, "batch") * check_pos_int(hkv, "hkv")
    cores = get_soc(soc).aic_cores
    chunks = n_chunks(topk, ntile, block_size)
    if items >= cores or chunks < SPLIT_MIN_CHUNKS:
        return 1
    want = min(chunks, cores // items)
    best = min(range(1, want + 1), key=lambda k: (merge_chain(chunks, k), k))
    return effective_kv_splits(chunks, best)


def split_tiling(tiling: MsaTiling, *, batch: int, hkv: int, topk: int, soc: str) -> MsaTiling:
    """``tiling`` with ``kv_splits`` set by :func:`default_kv_splits` (give the result to both
    the golden and the kernel)."""
    check_instance(tiling, "tiling", MsaTiling)
    k = default_kv_splits(batch=batch, hkv=hkv, topk=topk, ntile=tiling.ntile, soc=soc,
                          block_size=tiling.block_size)  # fmt: skip
    return tiling.replace(kv_splits=k)
