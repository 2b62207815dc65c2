"""DeepSeek-V3.2 sparse attention (op ``dsa``): the INT32 index tensor the kernel reads, packed
from the contract's host plan (:func:`kernel_indices`, NumPy), and its torch twin built on the
inputs' device without reading them (:func:`kernel_indices_torch`, the device wrapper's
``validate=False`` path). Tested equal to each other.
"""

from __future__ import annotations

import numpy as np
from tilesim.shared.dsa import Args, HostPlan, host_plan


def kernel_indices(a: Args, plan: HostPlan | None = None) -> tuple[np.ndarray, int | None]:
    """``(indices, mask_col0)``: the INT32 index tensor the kernel reads, from the host plan
    (:func:`~tilesim.shared.dsa.host_plan` of ``a``, the
    :func:`~tilesim.shared.dsa.check_values` arguments, unless ``plan`` is
    given). The columns are zero-padded to whole KV tiles so that the last tile's
    ``[1, s_kv_tile]`` view stays inside the tensor (only ``cur_seq`` columns are read; the
    entries past ``cur_seq`` are written 0, whatever the caller left there). When some used
    entry is ``-1`` (the masked build), it is replaced by a stand-in position of its batch
    (:func:`~tilesim.shared.layouts.dsa_rows.stand_in_positions`) and as many columns again follow,
    1 at every skipped entry, 0 elsewhere (one tensor, not two: PyPTO 0.2.0's cost-model
    machine crashes with ten kernel arguments); ``mask_col0`` is where they start, else
    ``None``."""
    plan = host_plan(a) if plan is None else plan
    st = a.tiling.s_kv_tile
    cols = -(-a.topk // st) * st
    skipped, filler = plan.skipped, plan.stand_in
    n = a.topk_indices.shape[0]
    used = np.arange(a.topk)[None, :] < plan.cur_seq[:, None]
    entries = np.where(used, a.topk_indices[:, : a.topk], 0)  # past cur_seq: never read, 0
    if filler is None:
        idx = np.zeros((n, cols), dtype=np.int32)
        idx[:, : a.topk] = entries
        return idx, None
    idx = np.zeros((n, 2 * cols), dtype=np.int32)
    idx[:, : a.topk] = entries
    rows, c = np.nonzero(skipped)
    idx[rows, c] = filler[rows // a.s1]
    idx[rows, cols + c] = 1
    return idx, cols


def kernel_indices_torch(ti, bt, acts, *, s1: int, topk: int, block_size: int, s_kv_tile: int,
                         cache_rows: int):  # fmt: skip
    """The torch twin of :func:`kernel_indices`: its masked form built where the tensors live
    (torch ops on the inputs' device, no host copy; the ``validate=False`` path), with no
    value check: INT32 ``[T, 2*cols]``, the entries (0 past ``cur_seq``, a used ``-1``
    replaced by its batch's stand-in position, the first one whose block is allocated and
    inside the cache: :func:`~tilesim.shared.layouts.dsa_rows.stand_in_positions`), then the 0/1
    skip columns from ``cols``. Always the masked layout: whether a ``-1`` is used is not known
    without reading the data. A batch with a used ``-1`` and no allocated block gets position
    0 (undefined, as every unchecked bad entry is). Tested equal to :func:`kernel_indices`."""
    import torch  # lazily: importing this module needs no torch

    dev = ti.device
    cols = -(-topk // s_kv_tile) * s_kv_tile
    s = torch.arange(s1, device=dev, dtype=torch.int64)
    cur = (acts.to(torch.int64)[:, None] - s1 + 1 + s[None, :]).clamp(0, topk).reshape(-1)
    used = torch.arange(topk, device=dev)[None, :] < cur[:, None]
    t = ti[:, :topk].to(torch.int64)
    skipped = used & (t == -1)
    table = bt.to(torch.int64)
    ok = (table >= 0) & ((table + 1) * block_size <= cache_rows)
    filler = (ok.to(torch.int32).argmax(dim=1) * block_size).repeat_interleave(s1)
    entries = torch.where(skipped, filler[:, None], torch.where(used, t, 0))
    idx = torch.zeros((t.shape[0], 2 * cols), dtype=torch.int32, device=dev)
    idx[:, :topk] = entries.to(torch.int32)
    idx[:, cols : cols + topk] = skipped.to(torch.int32)
    return idx, cols


__all__ = ["kernel_indices", "kernel_indices_torch"]
