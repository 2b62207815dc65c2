"""DeepSeek-V3.2 sparse MLA attention with FP8 / INT8 anti-quantization — PyPTO kernels.

Device twins of :func:`tilesim.reference.sparse_attention_antiquant` and
:func:`tilesim.reference.sparse_attention_antiquant_kv_split`: same names, same arguments, same
output (BF16 ``[T*nq, 512]``), same rounding points. The tensor programs are in
:mod:`tilesim.device._dsa_kernels`; this module checks the arguments, picks the kernel for the
cache form, dtype and softmax mode, and runs it:

* ``backend="npu"`` (or ``"auto"`` with NPU torch tensors): on an Ascend NPU (torch_npu, CANN);
* ``backend="sim"``: on the CPU through PyPTO's host interpreter and cost model
  (:mod:`tilesim.device.sim`) for ``soc`` (one SoC per process); returns ``(out, cost_us)``.

=================  ==========  ===================  ============================================
cache              dtype       SoC                  kernel
=================  ==========  ===================  ============================================
packed ``[r,656]``  INT8        910B, 950            one whole-row gather per KV tile
packed ``[r,656]``  FP8 E4M3    950                  two gathers (nope as FP8, rope+scales bytes)
kv_split           FP8 E4M3    950                  three gathers (kn_quant, kr, kn_scales)
kv_split           INT8        910B, 950            three gathers
=================  ==========  ===================  ============================================

``tile_config`` (:class:`tilesim.shared.tiling.SaTileShapeConfig`) selects the mode: the
``decode`` preset (online softmax over 512-key tiles, the seeds' ``_high`` kernel) or the
``prefill`` preset (per-tile normalised softmax over 2048-key tiles, the seeds' ``_d``/``_p``).

Edges handled beyond the seeds' kernels, as the reference documents them: a query token with
``cur_seq = 0`` gets zeros (the seeds write nothing); a last tile with fewer than ``s_kv_tile``
keys uses valid shapes; ``cur_seq > s_kv_tile`` works in both modes (per-tile mode merges the
normalised tiles where the seeds keep the last); ``-1`` entries among the first ``cur_seq``
indices are skipped as the reference skips them (a "masked" build: the wrapper points them at
an allocated position of the batch and appends a 0/1 skip mask to the index tensor; the kernel
pushes those scores to -3e38 so their P is exactly 0, and an all-skipped tile is a no-op of
the merge; a token with no live entry gets zeros). Not supported: ``n_kv != 1`` and
``nq / n_kv`` not a multiple of ``g_tile`` (``ValueError`` before launch).
"""

from __future__ import annotations

import math

import numpy as np
from tilesim.device._lazy import require_torch
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.mla_cache import LAYOUTS, NOPE, NSCALES, PYPTO_ROW_BYTES, ROPE
from tilesim.shared.soc import DEFAULT_SOC
from tilesim.shared.tiling import SaTileShapeConfig

__all__ = [
    "sparse_attention_antiquant",
    "sparse_attention_antiquant_kv_split",
    "sparse_attention_traffic",
]

_QUANT = {np.dtype(np.int8): "int8", FP8_E4M3: "fp8"}
BACKENDS = ("auto", "npu", "sim")


# ----------------------------------------------------------------------------- argument checks


def _is_tensor(x) -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _np_dtype(x) -> np.dtype:
    """NumPy dtype of an array or of a torch tensor (BF16/FP8 mapped to ml_dtypes)."""
    if _is_tensor(x):
        torch = require_torch()
        m = {
            torch.bfloat16: BF16,
            torch.float8_e4m3fn: FP8_E4M3,
            torch.int8: np.dtype(np.int8),
            torch.uint8: np.dtype(np.uint8),
            torch.int32: np.dtype(np.int32),
            torch.int64: np.dtype(np.int64),
            torch.float32: np.dtype(np.float32),
        }
        if x.dtype not in m:
            return np.dtype(object)
        return m[x.dtype]
    return np.asarray(x).dtype


def _shape(x) -> tuple:
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def _host_ints(x, name: str, ndim: int) -> np.ndarray:
    """Integer input -> host int64 NumPy copy (for validation only)."""
    if x is None:
        raise TypeError(f"{name}: expected an integer array, got None")
    a = x.detach().cpu().numpy() if _is_tensor(x) else np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array (int32), got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(a.shape)}")
    return a.astype(np.int64)


def _pos_int(name: str, v) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v <= 0:
        raise ValueError(f"{name}: expected a positive integer, got {v!r}")
    return int(v)


def _check_2d(name: str, x, dtypes: tuple, cols: int, rows: int | None = None) -> None:
    if x is None:
        raise TypeError(f"{name}: expected an array, got None")
    dt = _np_dtype(x)
    if dt not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: expected dtype {want}, got {dt}")
    shp = _shape(x)
    if len(shp) != 2 or shp[1] != cols or (rows is not None and shp[0] != rows):
        want = f"[{'rows' if rows is None else rows}, {cols}]"
        raise ValueError(f"{name}: expected shape {want}, got {shp}")


class _Call:
    """Checked arguments of one call."""

    def __init__(
        self,
        query_nope,
        query_rope,
        topk_indices,
        block_table,
        kv_act_seqs,
        *,
        nq,
        n_kv,
        softmax_scale,
        topk,
        block_size,
        tile_config,
    ):
        self.nq = _pos_int("nq", nq)
        self.n_kv = _pos_int("n_kv", n_kv)
        self.topk = _pos_int("topk", topk)
        self.block_size = _pos_int("block_size", block_size)
        if (
            isinstance(softmax_scale, (bool, np.bool_))
            or not isinstance(softmax_scale, (int, float, np.floating, np.integer))
            or not math.isfinite(float(softmax_scale))
            or float(softmax_scale) <= 0
        ):
            raise ValueError(
                f"softmax_scale: expected a finite positive number, got {softmax_scale!r}"
            )
        # the kernel multiplies FP32 scores by this value, rounded once to FP32 (as the reference)
        self.softmax_scale = float(np.float32(softmax_scale))
        if self.n_kv != 1:
            raise ValueError(f"n_kv: expected 1 (DeepSeek-V3.2 MQA latent cache), got {n_kv}")
        if tile_config is None:
            tile_config = SaTileShapeConfig.from_env()
        if not isinstance(tile_config, SaTileShapeConfig):
            raise TypeError(
                "tile_config: expected a SaTileShapeConfig or None, "
                f"got {type(tile_config).__name__}"
            )
        self.cfg = tile_config
        group = self.nq // self.n_kv
        if group % tile_config.g_tile:
            raise ValueError(
                f"tile_config.g_tile: expected a divisor of nq/n_kv = {group} (the kernel has "
                f"no tail group tile), got {tile_config.g_tile}"
            )
        _check_2d("query_nope", query_nope, (BF16,), NOPE)
        t_rows = _shape(query_nope)[0]
        _check_2d("query_rope", query_rope, (BF16,), ROPE, t_rows)
        self.acts = _host_ints(kv_act_seqs, "kv_act_seqs", 1)
        n_b = self.acts.shape[0]
        if n_b == 0:
            raise ValueError("kv_act_seqs: expected at least one batch, got shape (0,)")
        if (self.acts < 0).any():
            i = int(np.argmax(self.acts < 0))
            raise ValueError(f"kv_act_seqs[{i}]: expected a length >= 0, got {self.acts[i]}")
        if t_rows == 0 or t_rows % (n_b * self.nq):
            raise ValueError(
                f"query_nope: expected rows = B*s1*nq > 0 with B = len(kv_act_seqs) = {n_b} "
                f"and nq = {self.nq}, got {t_rows} rows"
            )
        self.n_b = n_b
        self.s1 = t_rows // (n_b * self.nq)
        self.rows = t_rows
        self.indices = _host_ints(topk_indices, "topk_indices", 2)
        want = (n_b * self.s1, self.n_kv * self.topk)
        if self.indices.shape != want:
            raise ValueError(
                f"topk_indices: expected shape [T, n_kv*topk] = {want}, "
                f"got {tuple(self.indices.shape)}"
            )
        self.table = _host_ints(block_table, "block_table", 2)
        if self.table.shape[0] != n_b or self.table.shape[1] == 0:
            raise ValueError(
                f"block_table: expected shape [{n_b}, max_blocks >= 1], "
                f"got {tuple(self.table.shape)}"
            )
        self.soc = None

    def check_entries(self, cache_rows: int) -> None:
        """Every used top-k entry must name a key or be ``-1``: the reference's own checks
        (positions, blocks, cache rows). Sets :attr:`skipped`, the used ``-1`` entries, and
        :attr:`filler`, a position of each batch the kernel may gather in their place."""
        from tilesim.reference.dsa_gather import NO_ROW, plan_physical_rows

        phys, cur = plan_physical_rows(
            self.indices,
            self.table,
            self.acts,
            s1=self.s1,
            topk=self.topk,
            block_size=self.block_size,
            cache_rows=cache_rows,
        )
        used = np.arange(self.topk)[None, :] < cur[:, None]
        self.skipped = used & (phys == NO_ROW)
        self.filler = np.zeros(self.n_b, dtype=np.int64)
        for b in np.unique(np.nonzero(self.skipped)[0] // self.s1):
            # any position whose block is allocated and inside the cache: its row is read for
            # a skipped entry and masked out (P = 0), so which one does not matter
            ok = np.nonzero(
                (self.table[b] >= 0) & ((self.table[b] + 1) * self.block_size <= cache_rows)
            )[0]
            if ok.size == 0:
                r, c = (int(v[0]) for v in np.nonzero(self.skipped[b * self.s1 :]))
                raise ValueError(
                    f"topk_indices[{b * self.s1 + r}, {c}]: -1 entries of batch {b} need one "
                    f"allocated block in block_table[{b}] to stand in for them; it has none"
                )
            self.filler[b] = int(ok[0]) * self.block_size

    def kernel_indices(self, cols: int) -> tuple[np.ndarray, int | None]:
        """``(indices, mask_col0)``: the INT32 index tensor the kernel reads, ``cols`` columns
        (zero-padded to whole KV tiles). When some used entry is ``-1`` (the masked build), those
        entries are replaced by the batch's filler position and ``cols`` more columns follow,
        1 at every skipped entry, 0 elsewhere (one tensor, not two: PyPTO 0.2.0's cost-model
        machine crashes with ten kernel arguments); ``mask_col0 = cols``. Else ``None``."""
        n = self.indices.shape[0]
        if not self.skipped.any():
            idx = np.zeros((n, cols), dtype=np.int32)
            idx[:, : self.topk] = self.indices
            return idx, None
        idx = np.zeros((n, 2 * cols), dtype=np.int32)
        idx[:, : self.topk] = self.indices
        rows, c = np.nonzero(self.skipped)
        idx[rows, c] = self.filler[rows // self.s1]
        idx[rows, cols + c] = 1
        return idx, cols

    @property
    def mode(self) -> str:
        return "online" if self.cfg.softmax == "online" else "per_tile"


# ----------------------------------------------------------------------------- launch


def _check_out(out, rows: int) -> None:
    """``out`` must be a contiguous BF16 torch tensor ``[rows, 512]`` (or ``None``)."""
    if out is None:
        return
    want = (rows, NOPE)
    if not _is_tensor(out) or _np_dtype(out) != BF16 or tuple(out.shape) != want:
        raise ValueError(
            f"out: expected a BF16 torch tensor of shape {want}, got {type(out).__name__} "
            f"{getattr(out, 'dtype', '')} {_shape(out)}"
        )
    if not out.is_contiguous():
        raise ValueError("out: expected a contiguous tensor")


def _as_torch(x, torch):
    """Array or tensor -> contiguous torch tensor the kernel may own (a copy for host data)."""
    if _is_tensor(x):
        return x.contiguous() if x.device.type != "cpu" else x.detach().contiguous().clone()
    from tilesim.reference.interop import to_torch

    return to_torch(np.ascontiguousarray(x)).clone()


def _ints32(a: np.ndarray, device, torch):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device)


def _pick_backend(backend: str, like) -> bool:
    """True for the NPU, False for the simulator (``backend`` rules of the module docstring)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    on_npu = _is_tensor(like) and like.device.type == "npu"
    if backend == "auto":
        if not on_npu:
            where = f"tensors on {like.device}" if _is_tensor(like) else "NumPy arrays"
            raise ValueError(
                f"backend: got {where}; pass NPU tensors (torch_npu) or backend='sim' to run "
                "PyPTO's CPU simulator"
            )
        return True
    if backend == "npu" and not on_npu:
        raise ValueError("backend='npu': expected torch tensors on an NPU device")
    if backend == "sim" and _is_tensor(like) and like.device.type != "cpu":
        raise ValueError(f"backend='sim': expected CPU tensors or NumPy arrays, got {like.device}")
    return backend == "npu"


def _target(quant: str, on_npu: bool, soc: str, cache_name: str) -> str:
    """The SoC compiled for (``"910b"``/``"950"``); FP8 needs the 950."""
    if on_npu:
        from tilesim.device._lazy import require_pypto

        arch = require_pypto().platform.npuarch
        soc = "950" if arch == "DAV_3510" else "910b"
    else:
        from tilesim.device import sim

        soc = sim.configure(soc)
    if quant == "fp8" and soc != "950":
        raise ValueError(
            f"{cache_name}: FP8 E4M3 needs the Ascend 950 (the 910B has no FP8 type); this "
            f"process targets {soc!r} -- use an INT8 cache on 910B, or soc='950' in the simulator"
        )
    return soc


def _launch(call: _Call, form: str, quant: str, layout: str, tensors: list, out, on_npu, soc):
    """Run the kernel on ``tensors`` (queries and cache, kernel order) + the index tensors.

    The index columns are padded with zeros to whole KV tiles so that the last tile's
    ``[1, s_kv_tile]`` view stays inside the tensor (only ``cur_seq`` columns are read); used
    ``-1`` entries become a masked stand-in (:meth:`_Call.kernel_indices`).
    Returns ``(out, cost_us or None)``."""
    torch = require_torch()
    _target(quant, on_npu, soc, "nope_cache" if form == "packed" else "kn_quant")
    from tilesim.device import _dsa_kernels as kernels

    st = call.cfg.s_kv_tile
    cols = -(-call.topk // st) * st  # the last tile's [1, s_kv_tile] view stays inside the tensor
    idx, mask_col0 = call.kernel_indices(cols)
    params = kernels.NestParams(
        nq=call.nq,
        n_kv=call.n_kv,
        softmax_scale=call.softmax_scale,
        topk=call.topk,
        block_size=call.block_size,
        tile=call.cfg.as_tuple(),
        online=call.mode == "online",
        quant=quant,
        layout=layout,
        mask_col0=mask_col0,
    )
    dev = tensors[0].device
    args = [*tensors, *(_ints32(a, dev, torch) for a in (idx, call.table, call.acts))]
    out_t = out
    if out_t is None:
        out_t = torch.empty((call.rows, NOPE), dtype=torch.bfloat16, device=tensors[0].device)
    args.append(out_t)
    kernel = kernels.build(form, quant, call.mode)
    if on_npu:
        kernel(*args, params=params)
        return out_t, None
    from tilesim.device import sim

    # the simulator writes every argument back: the tensors here are private copies
    run = sim.run_kernel(kernel, args, params=params)
    return out_t, run.us


def _result(out_t, like, us, on_npu: bool):
    if _is_tensor(like):
        res = out_t
    else:
        from tilesim.reference.interop import to_numpy

        res = to_numpy(out_t).copy()
    return res if on_npu else (res, us)


def sparse_attention_antiquant(
    query_nope,
    query_rope,
    nope_cache,
    topk_indices,
    block_table,
    kv_act_seqs,
    *,
    nq: int = 128,
    n_kv: int = 1,
    softmax_scale: float,
    topk: int = 2048,
    block_size: int = 128,
    tile_config: SaTileShapeConfig | None = None,
    layout: str = "pypto",
    out=None,
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
):
    """Sparse MLA attention over a packed quantized latent cache on PyPTO -> BF16 ``[T*nq, 512]``.

    Args are those of :func:`tilesim.reference.sparse_attention_antiquant` (NumPy/ml_dtypes
    arrays or torch tensors): ``nope_cache`` INT8 (910B, 950) or FP8 E4M3 (950) ``[rows, 656]``
    in ``layout`` ``"pypto"`` or ``"flashmla"``; ``tile_config`` ``None`` reads
    ``SaTileShapeConfig.from_env()`` (decode preset). Device-only keywords:

    * ``out`` — a BF16 torch tensor ``[T*nq, 512]`` on the inputs' device, written in place
      (else one is allocated);
    * ``backend`` — ``"npu"`` (torch tensors on an Ascend NPU), ``"sim"`` (NumPy arrays or CPU
      tensors, PyPTO's host interpreter + cost model for ``soc``) or ``"auto"`` (``"npu"`` for
      NPU tensors, else a ``ValueError`` naming both), as for ``moe_grouped_gemm``;
    * ``soc`` — the simulator's target, ``"910b"`` or ``"950"`` (a process compiles for one).

    Returns the output like the reference (a NumPy BF16 array for NumPy inputs, a torch tensor
    for torch inputs); with ``backend="sim"`` the pair ``(out, cost_us)``, ``cost_us`` being the
    cost model's simulated AICore time in µs. Inputs are never modified.
    """
    call = _Call(
        query_nope,
        query_rope,
        topk_indices,
        block_table,
        kv_act_seqs,
        nq=nq,
        n_kv=n_kv,
        softmax_scale=softmax_scale,
        topk=topk,
        block_size=block_size,
        tile_config=tile_config,
    )
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    _check_2d("nope_cache", nope_cache, tuple(_QUANT), PYPTO_ROW_BYTES)
    quant = _QUANT[_np_dtype(nope_cache)]
    call.check_entries(_shape(nope_cache)[0])
    _check_out(out, call.rows)
    on_npu = _pick_backend(backend, query_nope)
    torch = require_torch()
    cache = _as_torch(nope_cache, torch)
    tensors = [_as_torch(query_nope, torch), _as_torch(query_rope, torch), cache.view(torch.int8)]
    if quant == "fp8":
        tensors.append(cache)  # the same bytes typed FP8 (see _dsa_kernels.load_packed_fp8)
    out_t, us = _launch(call, "packed", quant, layout, tensors, out, on_npu, soc)
    return _result(out_t, query_nope, us, on_npu)


def sparse_attention_antiquant_kv_split(
    query_nope,
    query_rope,
    kn_quant,
    kr,
    kn_scales,
    topk_indices,
    block_table,
    kv_act_seqs,
    *,
    nq: int = 128,
    n_kv: int = 1,
    softmax_scale: float,
    topk: int = 2048,
    block_size: int = 128,
    tile_config: SaTileShapeConfig | None = None,
    out=None,
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
):
    """:func:`sparse_attention_antiquant` over the kv_split cache: ``kn_quant [rows, 512]`` FP8
    E4M3 (950) or INT8, ``kr [rows, 64]`` BF16, ``kn_scales [rows, 4]`` FP32. Same arithmetic
    and output as the packed kernel on the same data."""
    call = _Call(
        query_nope,
        query_rope,
        topk_indices,
        block_table,
        kv_act_seqs,
        nq=nq,
        n_kv=n_kv,
        softmax_scale=softmax_scale,
        topk=topk,
        block_size=block_size,
        tile_config=tile_config,
    )
    _check_2d("kn_quant", kn_quant, tuple(_QUANT), NOPE)
    rows = _shape(kn_quant)[0]
    _check_2d("kr", kr, (BF16,), ROPE, rows)
    _check_2d("kn_scales", kn_scales, (np.dtype(np.float32),), NSCALES, rows)
    quant = _QUANT[_np_dtype(kn_quant)]
    call.check_entries(rows)
    _check_out(out, call.rows)
    on_npu = _pick_backend(backend, query_nope)
    torch = require_torch()
    tensors = [_as_torch(a, torch) for a in (query_nope, query_rope, kn_quant, kr, kn_scales)]
    out_t, us = _launch(call, "split", quant, "pypto", tensors, out, on_npu, soc)
    return _result(out_t, query_nope, us, on_npu)


def sparse_attention_traffic(
    topk_indices, kv_act_seqs, *, nq: int = 128, topk: int = 2048, g_tile: int = 128
) -> dict:
    """HBM bytes and cube FLOPs of one kernel call (the physical-limit columns of the reports).

    ``bytes`` = what the kernel moves through GM with no reuse: per query token and group tile,
    Q (``g_tile x 576`` BF16) in, the output rows (``g_tile x 512`` BF16) out, and per used
    top-k entry one gathered row (656 B) plus its INT32 index. ``flop`` = ``2 * g_tile *
    cur_seq * (576 + 512)`` per token and group tile (C1 + C2; BF16 operands on both SoCs).
    """
    ti = np.asarray(topk_indices)
    acts = np.asarray(kv_act_seqs, dtype=np.int64)
    s1 = ti.shape[0] // acts.shape[0]
    from tilesim.reference.dsa_gather import cur_seq_lengths

    cur = cur_seq_lengths(acts, s1, topk)
    g_loops = nq // g_tile
    per_tile_rows = g_tile * (NOPE + ROPE) * 2 + g_tile * NOPE * 2
    n_tokens = cur.shape[0]
    total_cur = int(cur.sum())
    return {
        "bytes": g_loops * (n_tokens * per_tile_rows + total_cur * (PYPTO_ROW_BYTES + 4)),
        "flop": g_loops * 2 * g_tile * total_cur * (NOPE + ROPE + NOPE),
        "keys": total_cur,
    }
