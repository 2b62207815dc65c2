"""Independent oracles of the DeepSeek-V3.2 lightning indexer (``dsa_indexer``).

Written without ``tilesim.reference`` or ``tilesim.shared.dsa_indexer``: one query row at a
time, the row's visible keys gathered through the block table by hand (the FP8 page bytes cut
at ``slot * 128`` for the codes and ``block_size * 128 + 4 * slot`` for the FP32 scale), every
step an elementwise NumPy operation in the dtype the kernel rounds to (FP16 / FP32 ufuncs round
each element as the scalar operation would), and the kernel's head sum (an FP32 halving tree)
as an explicit halving loop over the head axis (``_tree``). The dots are exact: INT8 codes
in int64; E4M3 codes in float64, whose products (at most 448^2 < 2^18, multiples of 2^-18)
and their sums over 128 elements (below 2^25) stay within 53 bits, so any summation order
gives the exact dot. The "pypto" INT8 order's head sum is exact in float64 for the same
reason (64 FP16 terms) and rounded once to FP32. :func:`oracle_topk` is the tie rule as a
plain ``sorted`` on ``(-score, position)``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F16, F32 = np.float16, np.float32
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def oracle_topk(scores, visible: int, topk: int) -> list[int]:
    """The ``min(topk, visible)`` best positions of one row by ``sorted``, then -1s."""
    best = sorted(range(visible), key=lambda p: (-float(scores[p]), p))[: min(topk, visible)]
    return best + [-1] * (topk - len(best))


def _relu(x: np.ndarray) -> np.ndarray:
    """``max(x, 0)`` as Python's ``max(x, zero)`` picks: ``x`` unless zero is greater (keeps
    ``-0.0`` and NaN as they are)."""
    zero = x.dtype.type(0)
    return np.where(zero > x, zero, x)


def _keys_int8(k_cache, k_scale, bt_row, visible: int, bs: int):
    """``(int64 [P, 128] codes, float32 [P] scales)`` of positions ``0..visible-1``."""
    pos = np.arange(visible)
    blk = np.asarray(bt_row)[pos // bs].astype(np.int64)
    return k_cache[blk, pos % bs].astype(np.int64), k_scale[blk, pos % bs].astype(F32)


def _keys_fp8(pages, bt_row, visible: int, bs: int):
    """``(float64 [P, 128] codes, float32 [P] scales)`` read from the page bytes."""
    codes, scales = np.empty((visible, 128)), np.empty(visible, dtype=F32)
    for p in range(visible):
        page = pages[int(bt_row[p // bs])].tobytes()
        slot = p % bs
        codes[p] = np.frombuffer(page[slot * 128 : (slot + 1) * 128], dtype=E4M3)
        scales[p] = np.frombuffer(page[bs * 128 + 4 * slot : bs * 128 + 4 * slot + 4], "<f4")[0]
    return codes, scales


def _tree(terms: np.ndarray) -> np.ndarray:
    """FP32 sum over axis 0 (a power-of-two count): row ``i`` of the lower half plus row ``i``
    of the upper half, until one row is left, each add one FP32 rounding."""
    t = terms.astype(F32)
    while t.shape[0] > 1:
        h = t.shape[0] // 2
        t = t[:h] + t[h:]
    return t[0]


def _scores_gym(qi, qs, w, keys, ks) -> np.ndarray:
    d = qi @ keys.T  # [64, P] exact integer dots
    v = (np.maximum(d, 0) / 2048.0).astype(F16)  # exact quotient, one FP16 rounding
    wh = (qs.astype(F16) * w.astype(F16))[:, None]  # FP16 product per head
    terms = (wh.astype(np.float64) * v.astype(np.float64)).astype(F32)  # exact
    return _tree(terms) * ks


def _scores_pypto(qi, qs, w, keys, ks) -> np.ndarray:
    d = qi @ keys.T
    t = (d / 2048.0).astype(F16)
    t = t * qs.astype(F16)[:, None]
    t = t * ks.astype(F16)[None, :]
    t = _relu(t)
    t = t * w.astype(F16)[:, None]
    return t.astype(np.float64).sum(axis=0).astype(F32)  # exact sum, rounded once


def _scores_fp8(qi, w, keys, ks) -> np.ndarray:
    logit = (qi @ keys.T).astype(F32)  # exact dots, one FP32 rounding
    return _tree(_relu(logit) * w.astype(F32)[:, None]) * ks


def oracle_indexer(inputs: dict, *, path="int8", int8_order="gym", topk=2048, block_size=128,
                   q_lens=None):  # fmt: skip
    """``(ids int32 [T, topk], scores float32 [T, S])`` of ``dsa_indexer(**inputs, ...)``."""
    bt, lens = inputs["block_table"], [int(v) for v in inputs["seq_lens"]]
    n_rows = inputs["q"].shape[0]
    ql = [n_rows // len(lens)] * len(lens) if q_lens is None else [int(v) for v in q_lens]
    width = bt.shape[1] * block_size
    scores = np.full((n_rows, width), -np.inf, dtype=F32)
    ids = np.full((n_rows, topk), -1, dtype=np.int32)
    q = inputs["q"].astype(np.float64 if path == "fp8" else np.int64)
    row = 0
    for b, n in enumerate(ql):
        for r in range(n):
            visible = lens[b] - (n - 1 - r)
            w = np.asarray(inputs["weights"][row])
            if visible > 0 and path == "fp8":
                keys, ks = _keys_fp8(np.asarray(inputs["k_cache"]), bt[b], visible, block_size)
                scores[row, :visible] = _scores_fp8(q[row], w, keys, ks)
            elif visible > 0:
                keys, ks = _keys_int8(inputs["k_cache"], inputs["k_scale"], bt[b], visible,
                                      block_size)  # fmt: skip
                fn = _scores_gym if int8_order == "gym" else _scores_pypto
                scores[row, :visible] = fn(q[row], np.asarray(inputs["q_scale"][row]), w, keys, ks)
            ids[row] = oracle_topk(scores[row], max(visible, 0), topk)
            row += 1
    return ids, scores
