"""The speed path of :func:`tilesim.reference.msa_main_branch` (private; chosen by
``tilesim.reference.msa_main._FAST`` or ``_fast=``).

The golden (:mod:`tilesim.reference.msa_main`) runs one item per KV head over all query rows,
serially, every key. Here the items are (KV head, :data:`ROW_BLOCK` query rows) run on the
reference worker pool (:func:`tilesim.reference.util.blas_pool.map_in_order`; rows never interact,
so the bits do not depend on it), and the K steps no row of a row block sees are skipped when
that provably changes no bit (:func:`may_skip_dead_keys`, :func:`live_key_steps`). Same output
bits; same trace records (tests/reference/test_msa_main.py proves both).
"""

from __future__ import annotations

from functools import partial

import numpy as np
from tilesim.reference.util.blas_pool import blas_threads, map_in_order
from tilesim.reference.util.msa_common import K_STEP
from tilesim.shared.msa_main import MASK_NEG

#: query rows per item (no numeric effect: rows never interact); one query block of the
#: seeds' cases, so dead-key skipping works at block granularity
ROW_BLOCK = 128
#: largest ``|q|*|k|*scale`` for which a -1e9 mask entry provably gives ``exp(S - m) == 0``
DEAD_KEY_SCORE_BOUND = 1e8


def may_skip_dead_keys(plan) -> bool:
    """True when dropping the K steps that every row of a row block has masked changes no bit.

    A masked score is ``raw*scale + (-1e9)``; a visible one is ``raw*scale + 0``. When the mask
    holds only 0 and -1e9 and ``|raw*scale| <= DEAD_KEY_SCORE_BOUND`` (Cauchy-Schwarz on the row
    norms), a masked key of a row that also sees a key in the chunk gets ``P = exp(S - m) = 0``
    exactly, so its column adds exact zeros to ``l`` and to every K step of ``P.V`` (V must be
    finite: ``0 * inf`` is NaN). A chunk in which a row sees nothing is erased by the online merge
    (its weight ``exp(-1e9 - m')`` is 0), whatever keys it held. Either way the output bits do not
    depend on whether those keys were computed.
    """
    mask, q64, k64, v64 = plan.mask2d, plan.q64, plan.k64, plan.v64
    if not ((mask == 0) | (mask == MASK_NEG)).all():
        return False
    if not (np.isfinite(q64).all() and np.isfinite(k64).all() and np.isfinite(v64).all()):
        return False
    q_norm = float(np.sqrt(np.einsum("hrd,hrd->hr", q64, q64).max()))  # q64: [HKV, rows, dh]
    k_norm = float(np.sqrt(np.einsum("hdk,hdk->hk", k64, k64).max()))  # k64: [HKV, dh, kv]
    return q_norm * k_norm * float(plan.scale) * (1 + 1e-6) <= DEAD_KEY_SCORE_BOUND


def live_key_steps(visible: np.ndarray, c0: int, w: int) -> np.ndarray | None:
    """Key columns (chunk-relative) of the K steps some row of ``visible`` ``[rows, kv]`` sees.

    Whole :data:`K_STEP` groups counted from the chunk start are kept or dropped, so the P.V
    K-step boundaries of the kept keys are the kernel's. ``None``: every group is live.
    """
    seen = visible[:, c0 : c0 + w].any(axis=0)
    starts = range(0, w, K_STEP)
    live = [k0 for k0 in starts if seen[k0 : k0 + K_STEP].any()]
    if len(live) == len(starts):
        return None
    if not live:
        return np.empty(0, dtype=np.intp)
    return np.concatenate([np.arange(k0, min(w, k0 + K_STEP)) for k0 in live])


def run(call, plan, out: np.ndarray, rows_item, *, want_stats: bool):
    """Fill ``out [n, HKV, 16, dh]`` by ``rows_item`` (the golden's chunk loop of one item)
    over (KV head, row block) items on the pool; returns the per-chunk ``(m_c, l_c)``
    statistics when ``want_stats`` and no key was skipped, else ``None``."""
    a = call.args
    n, hkv, g = a.n, a.hkv, plan.group
    items = [(h, r0, min(n, r0 + ROW_BLOCK)) for h in range(hkv) for r0 in range(0, n, ROW_BLOCK)]
    skip_dead = not call.seeds_compat and may_skip_dead_keys(plan)
    stats = None
    if want_stats and not skip_dead:
        stats = tuple(np.empty((len(plan.bounds), n, hkv, g), dtype=np.float32) for _ in range(2))
    body = partial(rows_item, plan, out, stats, skip_dead)
    with blas_threads():  # numbers do not depend on it, speed on a busy machine does
        for _ in map_in_order(body, items):
            pass
    return stats
