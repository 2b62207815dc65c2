"""Independent oracles of the DeepSeek-V3.2 lightning indexer (``dsa_indexer``).

Written without ``tilesim.reference`` or ``tilesim.shared.dsa_indexer``: one query row and one
logical position at a time, the cache read through the block table by hand (the FP8 page bytes
decoded with ``struct``), integer dots in Python ints, every FP16 / FP32 step as a NumPy
scalar operation, and the kernel's head sum (an FP32 halving tree) as a recursive pairwise
sum of FP32 scalars (``_tree``; the "pypto" order keeps ``math.fsum``, rounded once).
:func:`oracle_topk` is the tie rule as a plain ``sorted`` on ``(-score, position)``.
"""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np

F16, F32 = np.float16, np.float32
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def oracle_topk(scores, visible: int, topk: int) -> list[int]:
    """The ``min(topk, visible)`` best positions of one row by ``sorted``, then -1s."""
    best = sorted(range(visible), key=lambda p: (-float(scores[p]), p))[: min(topk, visible)]
    return best + [-1] * (topk - len(best))


def _key_int8(k_cache, k_scale, bt_row, p: int, bs: int):
    blk = int(bt_row[p // bs])
    return [int(v) for v in k_cache[blk, p % bs]], F32(k_scale[blk, p % bs])


def _key_fp8(pages, bt_row, p: int, bs: int):
    page = pages[int(bt_row[p // bs])].tobytes()
    slot = p % bs
    codes = np.frombuffer(page[slot * 128 : (slot + 1) * 128], dtype=E4M3).astype(np.float64)
    (scale,) = struct.unpack("<f", page[bs * 128 + 4 * slot : bs * 128 + 4 * slot + 4])
    return codes.tolist(), F32(scale)


def _tree(terms: list) -> np.float32:
    """FP32 sum of ``terms`` (a power-of-two count): element ``i`` of the lower half plus
    element ``i`` of the upper half, recursively, each add one FP32 rounding."""
    if len(terms) == 1:
        return F32(terms[0])
    h = len(terms) // 2
    return _tree([F32(F32(a) + F32(b)) for a, b in zip(terms[:h], terms[h:], strict=True)])


def _score_gym(qi, qs, w, key, ks) -> np.float32:
    terms = []
    for h in range(64):
        d = sum(a * b for a, b in zip(qi[h], key, strict=True))
        v = F16(max(d, 0) / 2048.0)  # exact quotient, one FP16 rounding
        wh = F16(qs[h]) * F16(w[h])  # NumPy FP16 scalar product
        terms.append(F32(float(wh) * float(v)))  # exact: FP16 x FP16 fits FP32
    return _tree(terms) * ks


def _score_pypto(qi, qs, w, key, ks) -> np.float32:
    terms = []
    for h in range(64):
        d = sum(a * b for a, b in zip(qi[h], key, strict=True))
        t = F16(d / 2048.0)
        t = t * F16(qs[h])
        t = t * F16(ks)
        t = max(t, F16(0))
        t = t * F16(w[h])
        terms.append(float(t))
    return F32(math.fsum(terms))


def _score_fp8(qi, w, key, ks) -> np.float32:
    terms = []
    for h in range(64):
        logit = F32(math.fsum(a * b for a, b in zip(qi[h], key, strict=True)))
        terms.append(max(logit, F32(0)) * F32(w[h]))
    return _tree(terms) * ks


def oracle_indexer(inputs: dict, *, path="int8", int8_order="gym", topk=2048, block_size=128,
                   q_lens=None):  # fmt: skip
    """``(ids int32 [T, topk], scores float32 [T, S])`` of ``dsa_indexer(**inputs, ...)``."""
    bt, lens = inputs["block_table"], [int(v) for v in inputs["seq_lens"]]
    n_rows = inputs["q"].shape[0]
    ql = [n_rows // len(lens)] * len(lens) if q_lens is None else [int(v) for v in q_lens]
    width = bt.shape[1] * block_size
    scores = np.full((n_rows, width), -np.inf, dtype=F32)
    ids = np.full((n_rows, topk), -1, dtype=np.int32)
    if path == "fp8":
        q = inputs["q"].astype(np.float64)
        pages = np.asarray(inputs["k_cache"])
    else:
        q = inputs["q"].astype(np.int64)
    row = 0
    for b, n in enumerate(ql):
        for r in range(n):
            visible = lens[b] - (n - 1 - r)
            qi = q[row].tolist()
            w = inputs["weights"][row]
            for p in range(visible):
                if path == "fp8":
                    key, ks = _key_fp8(pages, bt[b], p, block_size)
                    scores[row, p] = _score_fp8(qi, w, key, ks)
                    continue
                key, ks = _key_int8(inputs["k_cache"], inputs["k_scale"], bt[b], p, block_size)
                fn = _score_gym if int8_order == "gym" else _score_pypto
                scores[row, p] = fn(qi, inputs["q_scale"][row], w, key, ks)
            ids[row] = oracle_topk(scores[row], visible, topk)
            row += 1
    return ids, scores
