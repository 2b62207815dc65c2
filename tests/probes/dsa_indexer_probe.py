"""The matmul-only probe of the DeepSeek-V3.2 lightning-indexer kernel
(``device/_dsa_indexer_kernel.py``; test support, not installed).

What the cost model charges for the indexer's matmuls alone, so that a report can state the
kernel's time as a multiple of it ("probe µs" / "kernel / probe"). The kernel has one matmul
stage, C1: per group of query rows (2 rows, M = 128; an odd ``s1``'s last row alone, M = 64)
and cache block ``q_group [M, 128] @ K_block^T`` (INT8 with the FP16 ReLU epilogue on the
910B, FP8 E4M3 -> FP32 on the 950), issued by the kernel's own
:func:`tilesim.device._dsa_indexer_kernel.c1_dots` with its cube tiles and the options of
:func:`tilesim.device._dsa_indexer_kernel.build_jit` for the same build parameters and the
build the kernel's call runs (:func:`tilesim.shared.dsa_indexer.kernel_build`: the L1 reuse
packs 8, 16 or 32 blocks into one cube task, at most 16 when a whole span has fewer than 128);
the weighted head sum is vector work there (a fixed FP32 tree), so the probe has no second
matmul. The probe walks the kernel's loops --
batches, row groups, the group's blocks in chunks of the kernel's unroll factors (a whole
selection span first; dynamic trip counts from ``seq_lens``) -- and per block issues exactly
that matmul on a block of a dense key tensor read through the block table, its product
written to its own output columns. Dropped: the scales, the vector stage, the masks and the
whole selection. Importing it imports pypto: import it in the simulator's child process
(:func:`tilesim.device.sim.isolated`; ``tests/`` is on its ``sys.path``).
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
import functools

import pypto
from tilesim.device import backend as _backend
from tilesim.device._dsa_indexer_kernel import (
    DIM,
    HEADS,
    READY_ON_HOST,
    IndexerParams,
    build_jit,
    c1_dots,
)
from tilesim.device._lazy import require_torch
from tilesim.device._pypto_common import jit_options
from tilesim.shared.soc import DEFAULT_SOC
from tilesim.shared.validate import check_choice, check_pos_int


class ProbeParams:
    """Static parameters (``repr`` keys pypto's compiled-kernel cache): the kernel build's
    path, block size, unroll factors and jit options (:func:`probe_params`)."""

    def __init__(self, *, path: str, block_size: int, unroll: tuple, jit: tuple):
        self.path, self.bs, self.unroll, self.jit = path, block_size, tuple(unroll), tuple(jit)

    def __repr__(self) -> str:
        return (f"ProbeParams(path={self.path}, bs={self.bs}, unroll={self.unroll}, "
                f"jit={self.jit})")  # fmt: skip


def probe_params(kernel: IndexerParams, build: str = "many_groups") -> ProbeParams:
    """The probe of the kernel ``kernel`` in build ``build``: its chunks and its jit options
    (:func:`tilesim.device._dsa_indexer_kernel.build_jit`, whose L1 reuse depends on the build
    and the span), so probe and kernel pack their C1 matmuls into the same cube tasks at every
    shape."""
    return ProbeParams(path=kernel.path, block_size=kernel.bs, unroll=kernel.unroll,
                       jit=build_jit(kernel, build))  # fmt: skip


def _probe_group(pypto, q, keys, block_table, out, b, row0, vis0, rows: int, p):
    """One row group's C1 matmuls over its blocks, in the kernel's chunks."""
    bs, m = p.bs, rows * HEADS
    nblk = (vis0 + rows - 1 + bs - 1) // bs
    qg = pypto.view(q, [m, DIM], [row0 * HEADS, 0])
    pypto.set_vec_tile_shapes(16, 512)
    for c0, u in pypto.loop_unroll(0, nblk, 1, name=f"LIP_CHUNK{rows}", idx_name=f"c{rows}",
                                   unroll_list=list(p.unroll)):  # fmt: skip
        d = pypto.tensor([m, u * bs], out.dtype, "lip_dots")
        for j in range(u):
            kb = pypto.view(keys, [bs, DIM], [block_table[b, c0 + j] * bs, 0])
            pypto.assemble(c1_dots(pypto, qg, kb, m, p), [0, j * bs], d)
        pypto.set_vec_tile_shapes(16, 512)
        pypto.assemble(d, [row0 * HEADS, c0 * bs], out)


def _probe_nest(pypto, q, keys, block_table, seq_lens, out, p):
    """Batches, row groups, blocks: one C1 matmul per (group, block), nothing else."""
    n_b = seq_lens.shape[0]
    s1 = q.shape[0] // HEADS // n_b
    pypto.set_vec_tile_shapes(16, 512)
    for b in pypto.loop(0, n_b, 1, name="LIP_B", idx_name="b"):
        seq = seq_lens[b]
        for g in pypto.loop(0, s1 // 2, 1, name="LIP_PAIR", idx_name="g"):
            vis0 = seq - (s1 - 1 - 2 * g)
            vis0.as_variable()
            _probe_group(pypto, q, keys, block_table, out, b, b * s1 + 2 * g, vis0, 2, p)
        for _g in pypto.loop(0, s1 % 2, 1, name="LIP_SINGLE", idx_name="g1"):
            _probe_group(pypto, q, keys, block_table, out, b, b * s1 + s1 - 1, seq, 1, p)


def probe_int8(
    q: pypto.Tensor([pypto.DYNAMIC, DIM], pypto.DT_INT8),  # [T*64, 128]
    keys: pypto.Tensor([pypto.STATIC, DIM], pypto.DT_INT8),  # [num_blocks*bs, 128]
    block_table: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
    seq_lens: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
    out: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_FP16),  # [T*64, width]
    params,
):
    _probe_nest(pypto, q, keys, block_table, seq_lens, out, params)


def probe_fp8(
    q: pypto.Tensor([pypto.DYNAMIC, DIM], pypto.DT_FP8E4M3),
    keys: pypto.Tensor([pypto.STATIC, DIM], pypto.DT_FP8E4M3),
    block_table: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
    seq_lens: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
    out: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_FP32),
    params,
):
    _probe_nest(pypto, q, keys, block_table, seq_lens, out, params)


def build_probe(params: ProbeParams):
    """The jit probe for ``params`` (the kernel build's options), built once per params."""
    src = probe_int8 if params.path == "int8" else probe_fp8

    def make():
        return pypto.frontend.jit(**jit_options(params.jit, ready_on_host=READY_ON_HOST))(src)

    return _backend.compiled("dsa_indexer_probe", (repr(params),), make)


def matmul_probe(seq_lens, *, s1: int, path: str = "int8", block_size: int = 128,
                 topk: int = 2048, backend: str = "sim", soc: str = DEFAULT_SOC,
                 seed: int = 0):  # fmt: skip
    """The probe for a decode call of ``len(seq_lens)`` batches x ``s1`` rows over
    ``seq_lens`` cached tokens each (contiguous blocks per batch; values random codes), in the
    chunks the kernel uses for ``topk`` at that table width.
    Returns ``(products, cost_us)`` on the simulator (INT8: the epilogue's FP16 values)."""
    import numpy as np
    from tilesim.device.dsa_indexer import padded_columns
    from tilesim.shared.dsa_indexer import kernel_build, row_groups

    torch = require_torch()
    check_choice(path, "path", ("int8", "fp8"))
    s1, bs = check_pos_int(s1, "s1"), check_pos_int(block_size, "block_size")
    lens = [check_pos_int(int(n), "seq_lens[i]") for n in seq_lens]
    target = _backend.resolve(backend, soc, np.zeros(1))
    nblk = [-(-n // bs) for n in lens]
    cols = max(nblk)
    bt = torch.full((len(lens), cols), -1, dtype=torch.int32)
    start = np.concatenate([[0], np.cumsum(nblk)])
    for b, n in enumerate(nblk):
        bt[b, :n] = torch.arange(int(start[b]), int(start[b]) + n, dtype=torch.int32)
    gen = torch.Generator().manual_seed(seed)
    t = len(lens) * s1

    def codes(*shape):
        x = torch.randint(-8, 8, shape, generator=gen, dtype=torch.int8)
        return x if path == "int8" else x.float().to(torch.float8_e4m3fn)

    args = [codes(t * HEADS, DIM), codes(int(start[-1]) * bs, DIM), bt,
            torch.tensor(lens, dtype=torch.int32)]  # fmt: skip
    out = torch.zeros((t * HEADS, cols * bs),
                      dtype=torch.float16 if path == "int8" else torch.float32)  # fmt: skip
    padded = padded_columns(cols, topk, bs)
    build = kernel_build(groups=row_groups(len(lens), s1), columns=padded, soc=target.soc)
    kernel_params = IndexerParams(
        path=path, block_size=bs, topk=topk, width=padded * bs, soc=target.soc
    )
    params = probe_params(kernel_params, build)  # the build the kernel's call would run
    kernel = functools.partial(build_probe(params), params=params)
    us = _backend.launch(kernel, args, [out], target)
    return _backend.finish(out, us, target)


__all__ = ["ProbeParams", "build_probe", "matmul_probe", "probe_params"]
