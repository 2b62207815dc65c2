"""The matmul-only probe of the DeepSeek sparse-attention kernel (test support, not installed).

:func:`matmul_probe` runs the kernel's C1 and C2 (:mod:`tilesim.device._dsa_kernel`'s tiles and
jit options) on tiles of the same shapes, and nothing else, so a cost-model report can state a
kernel's time as a multiple of what the cost model charges for its matmuls alone (the "probe
µs" / "kernel / probe" columns). Importing it imports pypto: import it in the simulator's child
process (:func:`tilesim.device.sim.isolated`; ``tests/`` is on its ``sys.path``).
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
import functools

import pypto
from tilesim.device import backend as _backend
from tilesim.device._dsa_kernel import HEAD, NOPE, READY_ON_HOST, SEED_JIT, cube_tiles
from tilesim.device._lazy import require_torch
from tilesim.device._pypto_common import jit_options
from tilesim.device.backend import compiled
from tilesim.shared.dsa import resolve_tiling
from tilesim.shared.layouts.dsa_split_rule import kv_tiles
from tilesim.shared.soc import DEFAULT_SOC
from tilesim.shared.validate import check_pos_int


def probe_matmuls(
    query: pypto.Tensor([pypto.DYNAMIC, HEAD], pypto.DT_BF16),
    keys: pypto.Tensor([pypto.DYNAMIC, HEAD], pypto.DT_BF16),
    probs: pypto.Tensor([pypto.STATIC, pypto.STATIC], pypto.DT_BF16),
    scores_out: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_FP32),
    o_out: pypto.Tensor([pypto.DYNAMIC, NOPE], pypto.DT_FP32),
    params,
):
    """The matmul-only probe: per (token, group tile, KV tile) the kernel's C1
    (``Q [g_tile, 576] @ K_t^T``, cube tiles ``c1``) and C2 (``P [g_tile, s_kv_tile] BF16 @
    V_t [s_kv_tile, 512]``, cube tiles ``c2``) on tiles of the same shapes, in the kernel's
    loops (tokens, group tiles, KV tiles), and nothing else: the keys are a dense
    ``[T * tiles * s_kv_tile, 576]`` BF16 tensor (no gather, no dequant), ``P`` one fixed BF16
    tile (no softmax), each product written to its own rows (no merge)."""
    p = params
    gt, st = p.g_tile, p.s_kv_tile
    n_tok = query.shape[0] // p.nq
    n_t = p.n_tiles
    for r in pypto.loop(0, n_tok, 1, name="LOOP_P0_tok", idx_name="r"):
        for g in pypto.loop(0, p.nq // gt, 1, name="LOOP_P1_g", idx_name="g"):
            row0 = r * p.nq + g * gt
            for t in pypto.loop(0, n_t, 1, name="LOOP_P2_t", idx_name="t"):
                pypto.set_vec_tile_shapes(min(gt, 64), HEAD)
                qi = pypto.view(query, [gt, HEAD], [row0, 0])
                key0 = (r * n_t + t) * st
                kj = pypto.view(keys, [st, HEAD], [key0, 0])
                pypto.set_semantic_label("Sa_C1")
                cube_tiles(p.c1)
                s = pypto.matmul(qi, kj, pypto.DT_FP32, a_trans=False, b_trans=True)
                orow = ((r * (p.nq // gt) + g) * n_t + t) * gt
                pypto.set_vec_tile_shapes(p.v1[0], p.v1[1])
                pypto.assemble(s, [orow, 0], scores_out)
                pypto.set_semantic_label("Sa_C2")
                cube_tiles(p.c2)
                pypto.set_matrix_size([gt, st, NOPE])
                vj = pypto.view(keys, [st, NOPE], [key0, 0])
                o_t = pypto.matmul(probs, vj, pypto.DT_FP32)
                pypto.set_vec_tile_shapes(p.v2[0], p.v2[1])
                pypto.assemble(o_t, [orow, 0], o_out)


class ProbeParams:
    """Static parameters of the probe (``repr`` keys pypto's compiled-kernel cache)."""

    def __init__(self, *, nq, tile, n_tiles):
        self.nq, self.n_tiles = nq, n_tiles
        self.g_tile, self.s_kv_tile = tile[0], tile[1]
        self.c1, self.v1, self.c2, self.v2 = tile[2], tile[3], tile[4], tile[5]

    def __repr__(self) -> str:
        tile = (self.g_tile, self.s_kv_tile, self.c1, self.v1, self.c2, self.v2)
        return f"ProbeParams(nq={self.nq}, tile={tile!r}, n_tiles={self.n_tiles})"


def build_probe(params: ProbeParams):
    """The jit probe kernel (decode-mode options), built once per ``params``
    (:func:`tilesim.device.backend.compiled`)."""

    def make():
        opts = jit_options(SEED_JIT["online"], ready_on_host=READY_ON_HOST)
        opts["runtime_options"].pop("ready_on_host_tensors")  # the probe has no such inputs
        return pypto.frontend.jit(**opts)(probe_matmuls)

    return compiled("dsa_matmul_probe", (repr(params),), make)


def matmul_probe(tokens: int, *, nq: int = 128, topk: int = 2048, tiling=None,
                 backend: str = "sim", soc: str = DEFAULT_SOC, seed: int = 0):  # fmt: skip
    """The matmul-only probe (:func:`probe_matmuls`) for ``tokens`` query tokens that each use
    ``topk`` keys. Returns ``(o, cost_us)`` on the simulator (``o`` the FP32 C2 products,
    ``[tokens * nq/g_tile * tiles * g_tile, 512]``). Inputs are random BF16 on the grid
    ``j/128`` (``seed``); the values do not matter to the cost."""
    import numpy as np

    torch = require_torch()
    tokens = check_pos_int(tokens, "tokens")
    nq, topk = check_pos_int(nq, "nq"), check_pos_int(topk, "topk")
    cfg = resolve_tiling(tiling)
    if nq % cfg.g_tile:
        raise ValueError(f"tiling.g_tile: expected a divisor of nq = {nq}, got {cfg.g_tile}")
    target = _backend.resolve(backend, soc, np.zeros(1))
    n_t = kv_tiles(topk, cfg.s_kv_tile)
    gen = torch.Generator().manual_seed(seed)

    def grid(*shape):
        return (torch.randint(-128, 128, shape, generator=gen) / 128).to(torch.bfloat16)

    n_out = tokens * (nq // cfg.g_tile) * n_t * cfg.g_tile
    args = [grid(tokens * nq, HEAD), grid(tokens * n_t * cfg.s_kv_tile, HEAD),
            grid(cfg.g_tile, cfg.s_kv_tile)]  # fmt: skip
    outs = [torch.zeros((n_out, cfg.s_kv_tile), dtype=torch.float32),
            torch.zeros((n_out, NOPE), dtype=torch.float32)]  # fmt: skip
    params = ProbeParams(nq=nq, tile=cfg.as_tuple(), n_tiles=n_t)
    kernel = functools.partial(build_probe(params), params=params)
    us = _backend.launch(kernel, args, outs, target)
    return _backend.finish(outs[1], us, target)


__all__ = ["ProbeParams", "build_probe", "matmul_probe", "probe_matmuls"]
