"""MiniMax-M3 MSA main branch (prefill) on Ascend — PyPTO kernel + torch wrapper.

Same name and arguments as :func:`tilesim.reference.msa_main` (``block_mask`` from
:func:`tilesim.reference.build_msa_block_mask`). Wrapper: ``block_mask`` transposed/reshaped to
``[ceil(n/bk)*bk, topk*bk]`` and padded with -1e9 rows to ``[max_n, topk*bk]``; q, k, v cast to
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
import math

from tilesim.device._lazy import require, require_pypto, require_torch
from tilesim.device._msa_tiles import merge_chunk
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.soc import DEFAULT_SOC, MSA_DEVICE_TILES, msa_device_tile
from tilesim.shared.tiling import MSA_DTYPES, MsaTiling

BACKENDS = ("auto", "npu", "sim")
_CFG = MINIMAX_M3.msa
MASK_NEG = _CFG.prefill_mask_neg  # -1e9, exact in FP32


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


def _check(query, key_blocks, value_blocks, block_mask):
    torch = require_torch()
    floats = (torch.float32, torch.float16, torch.bfloat16)
    for name, t in (
        ("query", query),
        ("key_blocks", key_blocks),
        ("value_blocks", value_blocks),
        ("block_mask", block_mask),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        allowed = (torch.float32,) if name == "block_mask" else floats
        if t.dtype not in allowed:
            raise TypeError(
                f"{name}: expected dtype {' or '.join(map(str, allowed))}, got {t.dtype}"
            )
    if query.dim() != 3 or min(query.shape) < 1:
        raise ValueError(
            f"query: expected a non-empty [n, HQ, dh] tensor, got {tuple(query.shape)}"
        )
    n, hq, dh = query.shape
    if dh != 128:
        raise ValueError(f"query: expected head dim 128 (the kernel's tiles), got {dh}")
    if block_mask.dim() != 4:
        raise ValueError(
            f"block_mask: expected [ceil(n/bk), topk, bk, bk], got {tuple(block_mask.shape)}"
        )
    nbq, topk, bk, bk2 = block_mask.shape
    if bk2 != bk or bk < 1 or topk < 1 or nbq != math.ceil(n / bk):
        raise ValueError(
            f"block_mask: expected shape ({math.ceil(n / max(bk, 1))}, topk, bk, bk) for n={n}, "
            f"got {tuple(block_mask.shape)}"
        )
    if key_blocks.dim() != 3:
        raise ValueError(f"key_blocks: expected [topk*bk, HKV, dh], got {tuple(key_blocks.shape)}")
    kv_len, hkv, kdh = key_blocks.shape
    if kv_len != topk * bk or kdh != dh or hkv < 1:
        raise ValueError(
            f"key_blocks: expected shape ({topk * bk}, HKV, {dh}), got {tuple(key_blocks.shape)}"
        )
    if hq % hkv:
        raise ValueError(f"query: expected HQ a multiple of HKV={hkv}, got HQ={hq}")
    if tuple(value_blocks.shape) != tuple(key_blocks.shape):
        raise ValueError(
            f"value_blocks: expected shape {tuple(key_blocks.shape)}, got "
            f"{tuple(value_blocks.shape)}"
        )
    if not bool(torch.isfinite(block_mask).all()):
        raise ValueError("block_mask: expected finite values (masked keys carry -1e9, not -inf)")
    return n, hq, dh, nbq, topk, bk, kv_len, hkv


def kernel_mask(block_mask, max_n: int):
    """The wrapper's ``[max_n, topk*bk]`` FP32 mask: transpose(1, 2), reshape, -1e9 rows."""
    torch = require_torch()
    nbq, topk, bk, _ = block_mask.shape
    m2 = block_mask.transpose(1, 2).reshape(nbq * bk, topk * bk)
    pad = torch.full((max_n - nbq * bk, topk * bk), MASK_NEG, dtype=torch.float32, device=m2.device)
    return torch.cat([m2, pad]).contiguous()


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
            (FP32, FP16 or BF16 torch tensors); block_mask FP32 ``[ceil(n/bk), topk, bk, bk]``.
        dtype: ``"fp32"`` / ``"fp16"`` / ``"bf16"`` (the cast of q, k, v and of P before P.V);
            ``None`` = ``tiling.dtype`` (``MSA_DTYPE``).
        max_n: rows of the kernel mask, a multiple of bk and ``>= ceil(n/bk)*bk``; ``None`` =
            ``tiling.max_n`` (``MSA_MAX_N``).
        tiling: :class:`MsaTiling`; ``None`` = ``MsaTiling.from_env()``.
        backend, soc: as in :mod:`tilesim.device.msa_decode`.

    Returns:
        FP32 ``[n, HQ, 128]``; ``backend="sim"`` returns ``(out, cost_us)``. Inputs are never
        modified. Budget against the reference: ``docs/device.md`` (## MSA kernels).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    tiling = MsaTiling.from_env() if tiling is None else tiling
    if not isinstance(tiling, MsaTiling):
        raise TypeError(f"tiling: expected a MsaTiling or None, got {type(tiling).__name__}")
    dtype = tiling.dtype if dtype is None else dtype
    if dtype not in MSA_DTYPES:
        raise ValueError(f"dtype: expected one of {MSA_DTYPES}, got {dtype!r}")
    n, hq, dh, nbq, topk, bk, kv_len, hkv = _check(query, key_blocks, value_blocks, block_mask)
    max_n = tiling.max_n if max_n is None else max_n
    if isinstance(max_n, bool) or not isinstance(max_n, int) or max_n <= 0:
        raise ValueError(f"max_n: expected a positive int, got {max_n!r}")
    if max_n % bk or max_n < nbq * bk:
        raise ValueError(
            f"max_n: expected a multiple of bk={bk} and >= ceil(n/bk)*bk = {nbq * bk}, got {max_n}"
        )
    torch = require_torch()
    if backend == "auto":
        if query.device.type != "npu":
            raise ValueError(
                f"backend: tensors are on {query.device}; pass NPU tensors (torch_npu) or "
                "backend='sim' to run PyPTO's CPU simulator"
            )
        backend = "npu"
    if backend == "npu":
        require("torch_npu")
        soc = "950" if require_pypto().platform.npuarch == "DAV_3510" else "910b"
    tdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]

    def cast(t):  # FP32 first (exact widening), then one RNE rounding to the kernel dtype
        return t.detach().to(torch.float32).to(tdt).contiguous()

    q2 = cast(query).reshape(n, hq * dh)
    k2 = cast(key_blocks).reshape(kv_len, hkv * dh)
    v2 = cast(value_blocks).reshape(kv_len, hkv * dh)
    mask = kernel_mask(block_mask.detach(), max_n)
    out = torch.zeros(n, hq * dh, dtype=torch.float32, device=query.device)
    if backend == "sim":  # choose the SoC before pypto is imported (the 950 is an overlay)
        from tilesim.device import sim

        sim.configure(soc)
    kernel = build_kernel(n, hq, hkv, dh, kv_len, max_n, dtype, tiling.ntile, vec_rows(soc))
    if backend == "sim":
        args = [q2, k2, v2, mask]
        if any(t.device.type != "cpu" for t in args):
            raise ValueError("backend='sim': expected CPU tensors")
        # the casts/reshape above may be views of the caller's tensors: the simulator writes
        # every argument back, so hand it private copies
        args = [t.clone() for t in args]
        run = sim.run_kernel(kernel, [*args, out])
        return out.reshape(n, hq, dh), run.us
    kernel(q2, k2, v2, mask, out)
    return out.reshape(n, hq, dh)


__all__ = ["VEC_ROWS", "build_kernel", "kernel_mask", "msa_main_branch", "vec_rows"]
