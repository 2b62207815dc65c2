"""MiniMax-M3 MSA main branch (prefill) on Ascend — PyPTO kernel + torch wrapper.

Same name and arguments as the reference op (``reference/msa_main.py``; ``block_mask`` from
:func:`tilesim.shared.msa_mask.build_msa_block_mask`), the same argument rules
(:func:`tilesim.shared.msa_mask.check_msa_main_args`) and the same input policy: NumPy arrays or
torch tensors in, output of the kind of ``query``; the back end comes from
:mod:`tilesim.device.backend`. Wrapper: the kernel mask ``[max_n, topk*bk]`` of
:func:`tilesim.shared.msa_mask.kernel_mask` (the reference's, built on the host); q, k, v cast to
FP16/BF16 (RNE) unless ``dtype="fp32"``. Kernel loop nest (the seeds' current revision)::

    seen = rowmax(mask[:n]) > -1e9                     per query row: sees some selected key
    for hg in pypto.loop(HQ):                          one query head, all n rows on cube M
        h_kv = hg // (HQ/HKV)
        for c in NTILE-wide key chunks (static; the last one may be partial):
            S   = fp32(Q_h @ K_c^T) * scale + mask[:, chunk]       FP32
            m_c = rowmax(S); P = exp(S - m_c); l_c = rowsum(P)      FP32
            PV  = fp32(cast(P) @ V_c)                 cast: none / FP16 / BF16
            chunk 0 stores (m_c, l_c, PV); later chunks merge online (FP32)
        out[:, hg] = O / l where seen, +0 elsewhere     FP32

Same rounding points as the reference. Where the seeds' kernel is wrong at the edges this one is
right: rows that see no selected key give zeros (the seeds' arithmetic gives the mean of V),
and a last partial chunk is processed when ``topk*bk`` is not a multiple of NTILE (the seeds
drop it). The kernel compiles per ``(n, HQ, HKV, topk*bk, max_n, dtype)``; the seeds compile
``n`` as a dynamic dimension -- on the CPU every call recompiles anyway.

Tiling: ``MsaTiling.from_env()`` (``MSA_NTILE``, ``MSA_DTYPE``, ``MSA_MAX_N``) and the per-SoC
vector tile rows :data:`VEC_ROWS` (``MSA_VEC_ROWS``). Importing needs neither torch nor pypto.
"""

import functools
from typing import NamedTuple

from tilesim.device._lazy import require_pypto, require_torch
from tilesim.device._msa_tiles import merge_chunk
from tilesim.device.backend import Target, finish, launch, resolve, to_tensors
from tilesim.shared.msa_mask import MASK_NEG as _MASK_NEG
from tilesim.shared.msa_mask import MainBranchArgs, check_msa_main_args, kernel_mask
from tilesim.shared.soc import DEFAULT_SOC, MSA_DEVICE_TILES, msa_device_tile
from tilesim.shared.tiling import MsaTiling

MASK_NEG = float(_MASK_NEG)  # -1e9, exact in FP32 (a Python float for the kernel body)


#: per-SoC defaults and the env override live in :mod:`tilesim.shared.soc`
VEC_ROWS = MSA_DEVICE_TILES["MSA_VEC_ROWS"][0]


def vec_rows(soc=DEFAULT_SOC, env=None) -> int:
    """VEC_ROWS of ``soc`` (``MSA_VEC_ROWS`` overrides; see
    :func:`tilesim.shared.soc.msa_device_tile`)."""
    return msa_device_tile("MSA_VEC_ROWS", soc, env)


@functools.lru_cache(maxsize=32)
def build_kernel(n, hq, hkv, dh, kv_len, max_n, dtype, ntile, rows):
    """The ``@pypto.frontend.jit`` kernel for one shape/dtype/tiling (cached)."""
    pypto = require_pypto()
    dt = {"fp32": pypto.DT_FP32, "fp16": pypto.DT_FP16, "bf16": pypto.DT_BF16}[dtype]
    group = hq // hkv
    bounds = [(c0, min(ntile, kv_len - c0)) for c0 in range(0, kv_len, ntile)]
    scale = dh**-0.5
    r = min(rows, n)

    @pypto.frontend.jit
    def msa_main_branch_kernel(
        q: pypto.Tensor([], dt),  # [n, HQ*dh]
        k: pypto.Tensor([], dt),  # [kv_len, HKV*dh]
        v: pypto.Tensor([], dt),  # [kv_len, HKV*dh]
        mask: pypto.Tensor([], pypto.DT_FP32),  # [max_n, kv_len]
        out: pypto.Tensor([], pypto.DT_FP32),  # [n, HQ*dh]
    ):
        pypto.set_vec_tile_shapes(r, min(ntile, kv_len))
        row_max = pypto.amax(pypto.view(mask, [n, kv_len], [0, 0]), dim=-1, keepdim=True)
        seen = pypto.gt(row_max, MASK_NEG)  # [n, 1]: the row sees some selected key
        for hg in pypto.loop(hq, name="LOOP_HG", idx_name="hg"):
            h_kv = hg // group
            qh = pypto.view(q, [n, dh], [0, hg * dh])
            m = pypto.tensor([n, 1], pypto.DT_FP32, "m")
            l = pypto.tensor([n, 1], pypto.DT_FP32, "l")
            o = pypto.tensor([n, dh], pypto.DT_FP32, "o")
            for c in range(len(bounds)):  # NTILE chunks: online softmax
                c0 = bounds[c][0]
                w = bounds[c][1]
                kc = pypto.view(k, [w, dh], [c0, h_kv * dh])
                vc = pypto.view(v, [w, dh], [c0, h_kv * dh])
                pypto.set_cube_tile_shapes([128, 128], [128, 128], [128, 128])
                s = pypto.matmul(qh, kc, pypto.DT_FP32, b_trans=True)
                pypto.set_vec_tile_shapes(r, w)
                s = s * scale
                s = s + pypto.view(mask, [n, w], [0, c0])
                m_c = pypto.amax(s, dim=-1, keepdim=True)
                p = pypto.exp(s - m_c)
                l_c = pypto.sum(p, dim=-1, keepdim=True)
                if dtype != "fp32":
                    p = pypto.cast(p, dt)
                pypto.set_cube_tile_shapes([128, 128], [128, 128], [128, 128])
                pv = pypto.matmul(p, vc, pypto.DT_FP32)
                pypto.set_vec_tile_shapes(r, dh)
                merge_chunk(pypto, m, l, o, m_c, l_c, pv, first=c == 0)
            pypto.assemble(pypto.where(seen, o / l, 0.0), [0, hg * dh], out)

    return msa_main_branch_kernel


class _Call(NamedTuple):
    """The checked arguments of one wrapper call."""

    args: MainBranchArgs
    target: Target


def _check(query, key_blocks, value_blocks, block_mask, dtype, max_n, tiling, backend, soc):
    """Every argument check (the reference's rules, :func:`check_msa_main_args`, plus the
    kernel's head dim and the back end), before any work."""
    a = check_msa_main_args(
        query, key_blocks, value_blocks, block_mask, dtype=dtype, max_n=max_n, tiling=tiling
    )
    if a.dh != 128:
        raise ValueError(f"query: expected head dim 128 (the kernel's tiles), got {a.dh}")
    return _Call(a, resolve(backend, soc, query))


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
):
    """MSA prefill attention with a precomputed block mask (PyPTO kernel).

    Args:
        query: ``[n, HQ, 128]`` (HQ = 64 in M3); key_blocks, value_blocks ``[topk*bk, HKV, 128]``
            (FP32, FP16 or BF16; NumPy arrays or torch tensors); block_mask FP32
            ``[ceil(n/bk), topk, bk, bk]``. Same rules as the reference.
        dtype: ``"fp32"`` / ``"fp16"`` / ``"bf16"`` (the cast of q, k, v and of P before P.V);
            ``None`` = ``tiling.dtype`` (``MSA_DTYPE``).
        max_n: rows of the kernel mask, a multiple of bk and ``>= ceil(n/bk)*bk``; ``None`` =
            ``tiling.max_n`` (``MSA_MAX_N``).
        tiling: :class:`MsaTiling`; ``None`` = ``MsaTiling.from_env()``.
        backend, soc: :func:`tilesim.device.backend.resolve`.

    Returns:
        FP32 ``[n, HQ, 128]``, of the kind of ``query`` (NumPy or torch); ``backend="sim"``
        returns ``(out, cost_us)``. Inputs are never modified. Budget against the reference:
        ``docs/device.md`` (## MSA kernels).
    """
    call = _check(query, key_blocks, value_blocks, block_mask, dtype, max_n, tiling, backend, soc)
    a, target = call
    torch = require_torch()
    q, k, v = to_tensors(query, key_blocks, value_blocks)
    tdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]

    def cast(t):  # FP32 first (exact widening), then one RNE rounding to the kernel dtype
        return t.detach().to(torch.float32).to(tdt).contiguous()

    q2 = cast(q).reshape(a.n, a.hq * a.dh)
    k2 = cast(k).reshape(a.kv_len, a.hkv * a.dh)
    v2 = cast(v).reshape(a.kv_len, a.hkv * a.dh)
    (mask,) = to_tensors(kernel_mask(a.block_mask, a.max_n))
    mask = mask.to(q.device)
    out = torch.zeros(a.n, a.hq * a.dh, dtype=torch.float32, device=q.device)
    kernel = build_kernel(
        a.n, a.hq, a.hkv, a.dh, a.kv_len, a.max_n, a.dtype, a.tiling.ntile, vec_rows(target.soc)
    )
    us = launch(kernel, [q2, k2, v2, mask], [out], target)
    return finish(out.reshape(a.n, a.hq, a.dh), us, target)


__all__ = ["VEC_ROWS", "build_kernel", "kernel_mask", "msa_main_branch", "vec_rows"]
