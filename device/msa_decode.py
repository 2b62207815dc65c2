"""MiniMax-M3 MSA block-sparse decode on Ascend — PyPTO kernel + wrapper.

Same name and arguments as the golden ``msa_sparse_decode`` (``reference/msa_decode.py``),
plus ``gather`` / ``backend`` / ``soc``; NumPy arrays or torch tensors in, the same kind out
(:mod:`tilesim.device.backend`). The arguments are checked and the keep-mask is built by
:mod:`tilesim.shared.msa_select`, the functions the reference uses (host NumPy).

Kernel loop nest (static loops, one compile per shape), per batch row ``b`` and KV head ``h``
(``outer = b*HKV + h``), the ``G = HQ/HKV`` (16) query heads of the group on the cube M axis::

    for c in NTILE-wide chunks of the topk*128 selected keys (the last one may be partial):
        K_c, V_c = the chunk's keys/values            gather="device": gather_in_ub + block
                                                      table; gather="host": compact copy
        S   = fp32(Q[G,128] @ K_c^T)                  cube, FP32 out
        S   = S * SCALE                               FP32, SCALE = fp32(1/sqrt(128))
        S   = S*m + (m*(-1) + 1)*(-3e38)              FP32, m = host keep-mask (1/0,
                                                      shared.msa_select.decode_keep_mask)
        m_c = rowmax(S); P = exp(S - m_c); l_c = rowsum(P)     FP32, P unrounded
        O_c = fp32(bf16(P) @ V_c)                     cube, FP32 accumulation
        chunk 0 stores (m_c, l_c, O_c); later chunks merge online (FP32)
    out = bf16(O / l), or +0 where the batch row has no kept key

The rounding points are the reference's one for one. Two ways to bring the selected blocks in:

* ``gather="device"`` (default): the kernel reads the paged cache itself. ``k_blocks`` is viewed
  as rows ``[(b*HKV + h)*nb*128 + blk*128 + t]``; per chunk ``gather_in_ub`` takes the chunk's
  logical key positions (``slot*128 + t``) and the batch row's block table (``block_ids[b]``)
  and fetches the rows into UB (:func:`_gather_chunk`). No K/V copy on the host.
* ``gather="paged"``: the same cache view, but each slot's whole 128-key page is read with a
  view whose row offset comes from the block table (``block_ids[b, slot]``, read by the control
  flow) and assembled into the chunk's K/V tiles -- no gather instruction, pages are contiguous.
* ``gather="host"``: the seeds' scheme — the wrapper copies the selected blocks into compact
  ``[B*HKV*topk*128, 128]`` K/V buffers (a host gather of ``2*B*HKV*topk*32 KB``) and the kernel
  views them.

All three give identical bits (tested); the cost-model comparison is in ``docs/device.md``.

Where the seeds' kernel is wrong at the edges, this one is right (and the tests check it): a
last partial chunk is processed when ``topk*128`` is not a multiple of NTILE (the seeds floor
the chunk count and drop those keys; with ``topk < 4`` they write nothing); ``seq_len`` may be
one int per batch row; a batch row whose every key is masked returns zeros (the seeds' kernel
returns the mean of the gathered V there).

Tiling: ``MsaTiling.from_env()`` (``MSA_NTILE``, default 512, same on both SoCs because it
changes the numbers) and the per-SoC gather tile :data:`GATHER_ROWS` (``MSA_GATHER_ROWS``).
Importing this module needs neither torch nor pypto.
"""

import functools

import numpy as np
from tilesim.device._lazy import require_pypto, require_torch
from tilesim.device._msa_tiles import l0_tile, merge_chunk
from tilesim.device.backend import Target, finish, launch, resolve, to_tensors
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.msa_select import DecodeInputs, check_decode_inputs, decode_keep_mask
from tilesim.shared.soc import DEFAULT_SOC, MSA_DEVICE_TILES, msa_device_tile
from tilesim.shared.tiling import MsaTiling
from tilesim.shared.validate import check_choice, check_instance

OP_NAME = "msa_sparse_decode"
GATHERS = ("device", "paged", "host")
_CFG = MINIMAX_M3.msa
BY = _CFG.block_size  # 128 keys per block
LARGE_NEG = _CFG.decode_mask_neg  # -3e38


#: per-SoC defaults and the env override live in :mod:`tilesim.shared.soc`
GATHER_ROWS = MSA_DEVICE_TILES["MSA_GATHER_ROWS"][0]


def gather_rows(soc=DEFAULT_SOC, env=None) -> int:
    """GATHER_ROWS of ``soc`` (``MSA_GATHER_ROWS`` overrides; see
    :func:`tilesim.shared.soc.msa_device_tile`)."""
    return msa_device_tile("MSA_GATHER_ROWS", soc, env)


# ----------------------------------------------------------------------------- kernel
def _gather_chunk(pypto, cache, positions, table, rows: int):
    """``gather="device"``: fetch the chunk's ``positions`` (logical key ``slot*128 + t``) of
    one (batch row, KV head) from its paged ``cache`` ``[nb*128, D]`` through ``table``
    (``[1, topk]`` block ids) into UB, ``rows`` rows per tile.
    Row ``j`` of the result = ``cache[table[pos_j // 128]*128 + pos_j % 128]``."""
    pypto.set_vec_tile_shapes(rows, cache.shape[1])
    return pypto.experimental.gather_in_ub(cache, positions, table, BY, -2)


def _chunk_softmax(pypto, qg, kc, vc, keep, g: int, w: int, scale: float):
    """One chunk: scores, scale, keep-mask, chunk max / exp / row sum, bf16(P) @ V."""
    pypto.set_cube_tile_shapes([g, g], [128, 128], [l0_tile(w, 256), w])
    s = pypto.matmul(qg, kc, pypto.DT_FP32, b_trans=True)
    pypto.set_vec_tile_shapes(g, w)
    s = s * scale
    s = s * keep + (keep * -1.0 + 1.0) * LARGE_NEG
    m_c = pypto.amax(s, dim=-1, keepdim=True)
    p = pypto.exp(s - m_c)
    l_c = pypto.sum(p, dim=-1, keepdim=True)
    p16 = pypto.cast(p, pypto.DT_BF16)
    pypto.set_cube_tile_shapes([g, g], [l0_tile(w, 128), w], [128, 128])
    o_c = pypto.matmul(p16, vc, pypto.DT_FP32)
    return m_c, l_c, o_c


@functools.lru_cache(maxsize=32)
def build_kernel(batch, hq, hkv, nb, topk, dim, ntile, gather, rows):
    """The ``@pypto.frontend.jit`` kernel for one shape/tiling (cached)."""
    pypto = require_pypto()
    g = hq // hkv
    sel = topk * BY
    bounds = [(c0, min(ntile, sel - c0)) for c0 in range(0, sel, ntile)]  # tail chunk kept
    scale = dim**-0.5

    @pypto.frontend.jit
    def msa_sparse_decode_kernel(
        q: pypto.Tensor([], pypto.DT_BF16),  # [B*HQ, D]
        k: pypto.Tensor([], pypto.DT_BF16),  # device: [B*HKV*nb*128, D]; host: [B*HKV*sel, D]
        v: pypto.Tensor([], pypto.DT_BF16),
        block_table: pypto.Tensor([], pypto.DT_INT32),  # [B, topk]
        positions: pypto.Tensor([], pypto.DT_INT32),  # [1, sel] = 0 .. sel-1
        keep: pypto.Tensor([], pypto.DT_FP32),  # [B, sel]
        out: pypto.Tensor([], pypto.DT_BF16),  # [B*HQ, D]
    ):
        for outer in range(batch * hkv):  # (batch row, KV head)
            b = outer // hkv
            q0 = outer * g
            pypto.set_vec_tile_shapes(g, dim)
            qg = pypto.view(q, [g, dim], [q0, 0])
            m = pypto.tensor([g, 1], pypto.DT_FP32, "m")
            l = pypto.tensor([g, 1], pypto.DT_FP32, "l")
            o = pypto.tensor([g, dim], pypto.DT_FP32, "o")
            if gather == "device":
                table = pypto.view(block_table, [1, topk], [b, 0])
                k_cache = pypto.view(k, [nb * BY, dim], [outer * nb * BY, 0])
                v_cache = pypto.view(v, [nb * BY, dim], [outer * nb * BY, 0])
            for c in range(len(bounds)):  # online softmax over the chunks
                c0 = bounds[c][0]
                w = bounds[c][1]
                if gather == "device":
                    pos = pypto.view(positions, [1, w], [0, c0])
                    kc = _gather_chunk(pypto, k_cache, pos, table, rows)
                    vc = _gather_chunk(pypto, v_cache, pos, table, rows)
                elif gather == "paged":
                    kc = pypto.tensor([w, dim], pypto.DT_BF16, "kc")
                    vc = pypto.tensor([w, dim], pypto.DT_BF16, "vc")
                    pypto.set_vec_tile_shapes(BY, dim)
                    for j in range(w // BY):  # one whole 128-key page per slot
                        row = (block_table[b, c0 // BY + j] + outer * nb) * BY
                        pypto.assemble(pypto.view(k, [BY, dim], [row, 0]), [j * BY, 0], kc)
                        pypto.assemble(pypto.view(v, [BY, dim], [row, 0]), [j * BY, 0], vc)
                else:
                    kc = pypto.view(k, [w, dim], [outer * sel + c0, 0])
                    vc = pypto.view(v, [w, dim], [outer * sel + c0, 0])
                kp = pypto.view(keep, [1, w], [b, c0])
                m_c, l_c, o_c = _chunk_softmax(pypto, qg, kc, vc, kp, g, w, scale)
                pypto.set_vec_tile_shapes(g, dim)
                merge_chunk(pypto, m, l, o, m_c, l_c, o_c, first=c == 0)
            # a kept key scores far above -3e38, so m > -3e38 <=> the row kept a key
            res = pypto.where(pypto.gt(m, LARGE_NEG), o / l, 0.0)
            out[q0 : q0 + g, :] = pypto.cast(res, pypto.DT_BF16)

    return msa_sparse_decode_kernel


# ----------------------------------------------------------------------------- host side
#: the keep-mask of :mod:`tilesim.shared.msa_select` under its former name here
keep_mask = decode_keep_mask


def _cache_rows(k_blocks, v_blocks, table, gather: str, dim: int):
    """K / V as the kernel reads them: the paged cache as rows (``"device"``, ``"paged"``) or
    the seeds' compact copy of the selected blocks (``"host"``), ``[rows, D]``."""
    torch = require_torch()
    if gather in ("device", "paged"):  # the paged cache as rows; the kernel gathers
        return k_blocks.contiguous().reshape(-1, dim), v_blocks.contiguous().reshape(-1, dim)
    dev = k_blocks.device
    bi = torch.arange(k_blocks.shape[0], device=dev)[:, None, None]
    hi = torch.arange(k_blocks.shape[1], device=dev)[None, :, None]
    sel = table.to(torch.int64)[:, None, :]
    return k_blocks[bi, hi, sel].reshape(-1, dim), v_blocks[bi, hi, sel].reshape(-1, dim)


def _run(q, k_blocks, v_blocks, d: DecodeInputs, ntile: int, gather: str, target: Target):
    """Launch the kernel on tensors; BF16 ``[B, HQ, D]`` and the cost-model µs."""
    torch = require_torch()
    dev = q.device
    keep = torch.from_numpy(decode_keep_mask(d.ids, d.seq, BY)).to(dev)
    table = torch.from_numpy(d.ids.astype(np.int32)).to(dev)
    positions = torch.arange(d.topk * BY, dtype=torch.int32, device=dev).reshape(1, -1)
    k2, v2 = _cache_rows(k_blocks, v_blocks, table, gather, d.dim)
    rows = gather_rows(target.soc)
    kernel = build_kernel(d.batch, d.hq, d.hkv, d.nb, d.topk, d.dim, ntile, gather, rows)
    q2 = q.contiguous().reshape(-1, d.dim)
    out = torch.zeros(d.batch * d.hq, d.dim, dtype=torch.bfloat16, device=dev)
    us = launch(kernel, [q2, k2, v2, table, positions, keep], [out], target)
    return out.reshape(d.batch, d.hq, d.dim), us


def msa_sparse_decode(
    q,
    k_blocks,
    v_blocks,
    block_ids,
    seq_len,
    *,
    tiling: MsaTiling | None = None,
    gather: str = "device",
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
):
    """Block-sparse decode attention over the selected key blocks (PyPTO kernel).

    Args:
        q: ``[B, HQ, 128]`` BF16 (HQ = 64 in M3); k_blocks, v_blocks: ``[B, HKV, nb, 128, 128]``
            BF16 paged cache; block_ids: ``[B, topk]`` integer ids, unique per row, in
            ``[0, nb)``; seq_len: KV length incl. the current token, one int or an integer
            array / tensor of ``B`` values. NumPy arrays or torch tensors; checked by
            :func:`tilesim.shared.msa_select.check_decode_inputs` as in the reference.
        tiling: :class:`MsaTiling` (``ntile``); ``None`` = ``MsaTiling.from_env()``.
        gather: ``"device"`` (gather_in_ub + block table in the kernel), ``"paged"`` (page
            views at block-table offsets) or ``"host"`` (the seeds' compact K/V copies); same
            numbers, different data movement.
        backend, soc: :func:`tilesim.device.backend.resolve` (``"auto"``: NPU tensors ->
            ``"npu"``, else an error naming both; ``"sim"``: PyPTO's CPU simulator for ``soc``).

    Returns:
        BF16 ``[B, HQ, 128]`` of the kind of ``q``; ``backend="sim"`` returns
        ``(out, cost_us)``. Inputs are never modified. Budget against the reference:
        ``docs/device.md`` (## MSA kernels).
    """
    check_choice(gather, "gather", GATHERS)
    tiling = MsaTiling.from_env() if tiling is None else tiling
    check_instance(tiling, "tiling", MsaTiling)
    d = check_decode_inputs(q, k_blocks, v_blocks, block_ids, seq_len, block_size=BY)
    target = resolve(backend, soc, q)
    qt, kt, vt = to_tensors(q, k_blocks, v_blocks)
    out, us = _run(qt, kt, vt, d, tiling.ntile, gather, target)
    return finish(out, us, target)


__all__ = ["GATHER_ROWS", "build_kernel", "gather_rows", "keep_mask", "msa_sparse_decode"]
