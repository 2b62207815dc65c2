"""MiniMax-M3 MSA main branch (prefill) on Ascend — PyPTO kernel + torch wrapper.

Same name and arguments as the reference op (``reference/msa_main.py``; ``block_mask`` from
:func:`tilesim.shared.msa_main.build_msa_block_mask`), the same argument rules
(:func:`tilesim.shared.msa_main.check_msa_main_args`) and the same input policy: NumPy arrays or
torch tensors in, output of the kind of ``query``; the back end comes from
:mod:`tilesim.device.backend`. Wrapper, all torch ops on the inputs' device (no host copy;
``validate="full"`` adds the mask's finiteness check): the kernel mask rows ``< n`` of
:func:`tilesim.shared.msa_main.kernel_mask` padded with -1e9 rows to ``n_pad =
ceil(n/128)*128`` (its torch twin :func:`~tilesim.shared.msa_main.kernel_mask_torch`); q, k, v
cast to FP16/BF16 (RNE) unless ``dtype="fp32"``, q zero-padded to ``n_pad`` rows; the K and V
rows of keys no query row sees (padding slots, positions past ``n``:
:func:`~tilesim.shared.msa_main.read_keys`, here
:func:`~tilesim.shared.msa_main.mask_flags_torch`) set to zero by a select, so NaN or garbage
there never reaches the output; afterwards the rows that see no key set to +0 (a select).
Kernel loop nest::

    for hg in pypto.loop(HQ):                          one query head (h_kv = hg // (HQ/HKV))
        for rb in pypto.loop(n_pad // 128):            runtime trip count: n is not compiled in
            for c in NTILE-wide key chunks (static; the last one may be partial):
                S   = fp32(Q[rb, hg] @ K_c^T) * scale + mask[rb, chunk]   FP32
                m_c = rowmax(S); P = exp(S - m_c); l_c = rowsum(P)          FP32
                PV  = fp32(cast(P) @ V_c)             cast: none / FP16 / BF16
                chunk 0 stores (m_c, l_c, PV); later chunks merge online (FP32)
            out[rb, hg] = O / l                       FP32

Same rounding points as the reference. Where the seeds' kernel is wrong at the edges this one is
right: rows that see no selected key give zeros (the seeds' arithmetic gives the mean of V),
and a last partial chunk is processed when ``topk*bk`` is not a multiple of NTILE (the seeds
drop it). One compile per model configuration and tiling (``compile_stats()`` name
``"msa_main_branch"``; key: HQ, HKV, dh, topk*bk, dtype, NTILE, VEC_ROWS, jit options, SoC).
The seeds' kernel (hicann/pypto-gym,
src/pypto_gym/ops/pypto_tensor/minimax/msa_main_branch_impl.py) makes ``n`` a
``pypto.DYNAMIC`` axis too, but walks it as one ``[max_n, .]`` view with ``valid_shape`` n;
in PyPTO 0.2.0's cost model that costs the full ``max_n`` rows whatever ``n`` is, so this
kernel loops over 128-row blocks instead (docs/ops/msa_main.md#kernel).

Tiling: ``MsaTiling.from_env()`` (``MSA_NTILE``, ``MSA_DTYPE``, ``MSA_MAX_N``) and the per-SoC
vector tile rows :data:`VEC_ROWS` (``MSA_VEC_ROWS``). Importing needs neither torch nor pypto.
"""

from functools import partial
from typing import NamedTuple

import numpy as np
from tilesim.device import backend as _backend
from tilesim.device._lazy import require_torch
from tilesim.device._msa_main_kernel import JIT, ROW_TILE, SEED_JIT, build_kernel
from tilesim.shared.msa_main import MASK_NEG as _MASK_NEG
from tilesim.shared.msa_main import (
    RECORD,
    Args,
    check_meta,
    host_plan_torch,
    kernel_mask,
)
from tilesim.shared.soc import DEFAULT_SOC, MSA_DEVICE_TILES, get_soc, msa_device_tile
from tilesim.shared.tiling import MsaTiling
from tilesim.shared.validate import check_choice

MASK_NEG = float(_MASK_NEG)  # -1e9, exact in FP32 (a Python float for the kernel body)


#: per-SoC defaults and the env override live in :mod:`tilesim.shared.soc`
VEC_ROWS = MSA_DEVICE_TILES["MSA_VEC_ROWS"][0]


#: ``vec_rows(soc="910b", env=None)``: VEC_ROWS of ``soc`` (``MSA_VEC_ROWS`` overrides)
vec_rows = partial(msa_device_tile, "MSA_VEC_ROWS")


class _Call(NamedTuple):
    """The checked arguments of one wrapper call."""

    args: Args
    shape_only: bool  #: FakeTensor / ``meta`` inputs: metadata only, no data read


def _check(query, key_blocks, value_blocks, block_mask, dtype, max_n, tiling, backend, validate):
    """Every argument check (the reference's rules: ``check_meta``, plus the kernel's head dim
    and the back end's name), before any work. The one value check, ``check_data_values`` (the
    finiteness scan of ``block_mask``), runs only with ``validate="full"`` and on inputs
    holding data (:func:`tilesim.device.backend.value_checks`); otherwise no data is read."""
    check_choice(backend, "backend", _backend.BACKENDS)
    _backend.validate_level(validate)
    shape_only = _backend.is_shape_only(query, key_blocks, value_blocks, block_mask,
                                        names=("query", "key_blocks", "value_blocks",
                                               "block_mask"))  # fmt: skip
    a = check_meta(query, key_blocks, value_blocks, block_mask, dtype=dtype, max_n=max_n,
                   tiling=tiling)  # fmt: skip
    _backend.value_checks(RECORD, a, validate, shape_only=shape_only)
    if a.dh != 128:
        raise ValueError(f"query: expected head dim 128 (the kernel's tiles), got {a.dh}")
    return _Call(a, shape_only)


def _operands(a: Args, query, key_blocks, value_blocks, block_mask):
    """The kernel's tensors, built by torch ops on the inputs' device (no host copy): q
    ``[n_pad, HQ*dh]`` (zero rows past ``n``), k, v ``[kv_len, HKV*dh]`` cast to ``a.dtype``
    (FP32 first: exact widening, then one RNE rounding) with the rows of keys no query row
    sees zeroed (``read``: a select, so NaN or garbage in a padding slot or past ``n`` never
    reaches the kernel), and the FP32 kernel mask ``[n_pad, kv_len]``
    and the bool ``[n]`` flags of the query rows that see some key: the torch twin of the
    shared host plan (:func:`tilesim.shared.msa_main.host_plan_torch`: the rows ``< n`` of
    :func:`kernel_mask`, then -1e9)."""
    torch = require_torch()
    q, k, v, bm = _backend.to_tensors(query, key_blocks, value_blocks, block_mask)
    bm = bm.detach().to(q.device)
    tdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    n_pad = -(-a.n // ROW_TILE) * ROW_TILE
    mask, read, seen = host_plan_torch(a, n_pad, bm)
    read = read.reshape(-1, 1, 1)

    def cast(t, rows):
        t = t.detach().to(torch.float32).to(tdt)
        return torch.where(read, t, torch.zeros((), dtype=tdt, device=t.device)) if rows else t

    q2 = torch.zeros(n_pad, a.hq * a.dh, dtype=tdt, device=q.device)
    q2[: a.n] = cast(q, False).reshape(a.n, a.hq * a.dh)
    k2 = cast(k, True).contiguous().reshape(a.kv_len, a.hkv * a.dh)
    v2 = cast(v, True).contiguous().reshape(a.kv_len, a.hkv * a.dh)
    return (q2, k2, v2, mask), seen


def kernel_for(a: Args, soc: str, jit=None):
    """The compiled kernel of a call's model configuration and tiling (built once per key:
    :func:`build_kernel`; ``n`` is not part of it). ``jit``: an option spec, default
    ``JIT[soc]`` (:data:`JIT`)."""
    jit = JIT["950" if get_soc(soc).arch == "DAV_3510" else "910b"] if jit is None else jit
    return build_kernel(a.hq, a.hkv, a.dh, a.kv_len, a.dtype, a.tiling.ntile, vec_rows(soc), jit)


@_backend.graph_safe
def msa_main_branch(
    query,
    key_blocks,
    value_blocks,
    block_mask,
    *,
    dtype: str | None = None,
    max_n: int | None = None,
    tiling: MsaTiling | None = None,
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
    validate: bool = True,
):
    """MSA prefill attention with a precomputed block mask (PyPTO kernel).

    Args:
        query: ``[n, HQ, 128]`` (HQ = 64 in M3); key_blocks, value_blocks ``[topk*bk, HKV, 128]``
            (FP32, FP16 or BF16; NumPy arrays or torch tensors); block_mask FP32
            ``[ceil(n/bk), topk, bk, bk]``. Same rules as the reference. Key rows that no query
            row sees (padding slots, positions past ``n``) are never read: any value there,
            NaN included, gives the same output bits.
        dtype: ``"fp32"`` / ``"fp16"`` / ``"bf16"`` (the cast of q, k, v and of P before P.V);
            ``None`` = ``tiling.dtype`` (``MSA_DTYPE``).
        max_n: rows of the kernel mask, a multiple of bk and ``>= ceil(n/bk)*bk``; ``None`` =
            ``tiling.max_n`` (``MSA_MAX_N``). Part of the compile key (the static bound of
            ``n``); ``n`` itself is a runtime value (one compile for every ``n <= max_n``).
        tiling: :class:`MsaTiling`; ``None`` = ``MsaTiling.from_env()``.
        backend, soc: :func:`tilesim.device.backend.resolve`.
        validate: ``True`` (default) and ``False`` check metadata only and read no data (the
            op has no integer input): a NaN / inf mask entry is then undefined behaviour;
            ``"full"`` also checks that ``block_mask`` is finite (on an NPU a device reduction
            and one flag read back; the mask is copied to the host only to name a bad
            entry). The kernel mask, the read keys and
            the empty-row flags are torch ops on the inputs' device either way.

    Returns:
        FP32 ``[n, HQ, 128]``, of the kind of ``query`` (NumPy or torch); ``backend="sim"``
        returns ``(out, cost_us)``. FakeTensor / ``meta`` inputs (torch.compile tracing): an
        empty FP32 ``[n, HQ, 128]`` tensor, no data read. Inputs are never modified. Budget
        against the reference: ``docs/ops/msa_main.md#kernel``.
    """
    arrays = (query, key_blocks, value_blocks, block_mask)
    a, shape_only = _check(*arrays, dtype, max_n, tiling, backend, validate)
    if shape_only:
        return query.new_empty((a.n, a.hq, a.dh), dtype=require_torch().float32)
    target = _backend.resolve(backend, soc, query)
    torch = require_torch()
    operands, seen = _operands(a, *arrays)
    out = torch.zeros(operands[0].shape[0], a.hq * a.dh, dtype=torch.float32,
                      device=operands[0].device)  # fmt: skip
    us = _backend.launch(kernel_for(a, target.soc), list(operands), [out], target)
    out = out[: a.n]
    out.masked_fill_(~seen[:, None], 0.0)  # rows that see no key: +0 (kernel: mean of V)
    return _backend.finish(out.reshape(a.n, a.hq, a.dh), us, target)


def npu_launch_args(n: int, max_n: int, soc: str, *, jit=None):
    """``(kernel, args)`` of the wrapper's launch at the shape of an NPU test (M3: HQ 64, HKV 4,
    topk 16, fp32, NTILE from the environment) with zero data, for a compile-only check
    (:func:`tilesim.device.sim.run_compile`) on the CPU."""
    torch = require_torch()
    mask = np.zeros((-(-n // 128), 16, 128, 128), dtype=np.float32)
    q = torch.zeros(n, 64, 128)
    kb = torch.zeros(16 * 128, 4, 128)
    a = check_meta(q, kb, kb, mask, dtype="fp32", max_n=max_n)
    operands = _operands(a, q, kb, kb, mask)[0]
    out = torch.zeros(operands[0].shape[0], 64 * 128)
    return kernel_for(a, soc, jit), [*operands, out]


__all__ = [
    "JIT",
    "SEED_JIT",
    "VEC_ROWS",
    "build_kernel",
    "kernel_for",
    "kernel_mask",
    "msa_main_branch",
    "npu_launch_args",
    "vec_rows",
]
