"""The matmul-only probe of the MSA block-sparse decode kernel (``device/_msa_decode_kernel.py``;
test support, not installed).

What the cost model charges for the decode's two matmuls alone, so that a report can state the
kernel's time as a multiple of it (the DeepSeek kernel's counterpart is
``tests/probes/dsa_probe.py``). Imported as ``probes.msa_decode_probe`` (``tests/`` is on the
``sys.path`` of pytest and of the simulator's spawned child); importing it needs neither
torch nor pypto (the kernel is built by :func:`build_probe` after the simulator is configured).

The probe walks the decode's loop nest -- a ``pypto.loop_unroll`` over the batch rows with
the decode's unroll factors (:data:`BATCH_UNROLL`, ``ub`` rows per body), the ``HKV`` KV heads
static inside it (pair ``outer = b*HKV + h``, its ``G = HQ/HKV`` query heads on the cube M axis),
the static loop over the ``NTILE``-wide key chunks of the ``topk*128`` selected keys (the last
one partial) -- and per chunk issues exactly the decode's matmuls, with the decode's cube
tiles (:func:`c1_cube_tiles`, :func:`c2_cube_tiles`), JIT options and L1 reuse per body
(:data:`L1_REUSE_BY_ROWS`)::

    C1  S_c = fp32(Q[G, 128] @ K_c^T)     one matmul per page piece (page_pieces), K_c's
                                          pieces [n, 128] BF16 rows of a dense input
    C2  O_c = fp32(P_c[G, w] @ V_c)       P_c = [G, w] BF16 rows of an input

Kept: the loop nest and its trip counts (batch rows dynamic and unrolled as in the decode, KV
heads and chunks static), the operand shapes and dtypes, the cube tiles, the chunk order.
Dropped: the K/V gather (``K``/``V`` are dense ``[B*HKV*topk*128, 128]`` rows, the layout of
the decode's ``gather="host"`` compact copies), the scale, both keep-mask selects, the softmax
(``P`` is an input, so C2 does not wait for C1), the online merge, the split-KV combine and the
final ``O / l`` (each product is written to its own output rows, so no chunk waits for
another). Split-KV (``MsaTiling.kv_splits``) only regroups the decode's merges: its matmuls,
their order and tiles are those of the unsplit loop, so the probe has no split parameter (the
tests trace the decode with splits and compare).
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
from dataclasses import dataclass

from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto, require_torch
from tilesim.device._msa_tiles import (
    L1_REUSE_BY_ROWS,
    SEED_RUNTIME,
    c1_cube_tiles,
    c2_cube_tiles,
    page_pieces,
)
from tilesim.device._pypto_common import jit_options, operation_options
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.soc import DEFAULT_SOC
from tilesim.shared.tiling import MsaTiling

OP_NAME = "msa_decode_probe"
BY = MINIMAX_M3.msa.block_size  # 128 keys per block, as in the decode
#: the decode's JIT options (``msa_decode.JIT``: the seeds' runtime options, their pass
#: options and combine_axis left out; a test asserts the two agree)
JIT = SEED_RUNTIME
#: the decode's batch-loop unroll factors (``msa_decode.BATCH_UNROLL``; a test asserts they agree)
BATCH_UNROLL = (4, 2, 1)


def chunk_bounds(topk: int, ntile: int) -> tuple:
    """``((c0, w), ...)``: the decode's key chunks of the ``topk*128`` selected keys, ``ntile``
    wide, the last one partial (``_msa_decode_kernel.build_kernel``'s ``bounds``)."""
    sel = topk * BY
    return tuple((c0, min(ntile, sel - c0)) for c0 in range(0, sel, ntile))


@dataclass(frozen=True)
class ProbeStatic:
    """What a probe kernel is specialised on (closed over by its body)."""

    hkv: int
    g: int  #: query heads per KV head (cube M)
    dim: int
    topk: int
    bounds: tuple  #: :func:`chunk_bounds`
    unroll: tuple  #: batch rows per body of the batch loop (``pypto.loop_unroll`` factors)


def _probe_pair(pypto, q, k, v, p, s_out, o_out, outer, st: ProbeStatic):
    """One (batch row, KV head) pair ``outer``: its chunks' C1 and C2, each product to its
    own output rows (``s_out[outer*G + i, c0 + j]``, ``o_out[(outer*chunks + c)*G + i]``)."""
    g, dim, sel, n_c = st.g, st.dim, st.topk * BY, len(st.bounds)
    q0 = outer * g
    pypto.set_vec_tile_shapes(g, dim)
    qg = pypto.view(q, [g, dim], [q0, 0])
    for c, (c0, w) in enumerate(st.bounds):  # static chunk loop, as the decode's
        for slot, t0, n in page_pieces(c0, w, BY):  # C1, one matmul per page piece
            kp = pypto.view(k, [n, dim], [outer * sel + slot * BY + t0, 0])
            pypto.set_cube_tile_shapes(*c1_cube_tiles(g, n))
            s = pypto.matmul(qg, kp, pypto.DT_FP32, b_trans=True)
            pypto.set_vec_tile_shapes(g, 128)
            pypto.assemble(s, [q0, slot * BY + t0], s_out)
        vc = pypto.view(v, [w, dim], [outer * sel + c0, 0])
        pc = pypto.view(p, [g, w], [q0, c0])
        pypto.set_cube_tile_shapes(*c2_cube_tiles(g, w))
        o_c = pypto.matmul(pc, vc, pypto.DT_FP32)
        pypto.set_vec_tile_shapes(g, dim)
        pypto.assemble(o_c, [(outer * n_c + c) * g, 0], o_out)


def probe_nest(pypto, q, k, v, p, s_out, o_out, st: ProbeStatic):
    """Inside a kernel body: the decode's loop nest -- a ``pypto.loop_unroll`` over the batch
    rows with the decode's unroll factors, ``ub`` rows per body, their KV heads static -- with
    only C1 and C2 per chunk (:func:`_probe_pair`)."""
    batch = q.shape[0] // (st.hkv * st.g)
    loop = pypto.loop_unroll(0, batch, 1, name="LOOP_B", idx_name="b0",
                             unroll_list=list(st.unroll))  # fmt: skip
    l1_reuse = dict(L1_REUSE_BY_ROWS)
    for b0, ub in loop:
        pypto.set_pass_options(cube_l1_reuse_setting={-1: l1_reuse[ub]})  # as the decode's
        for u in range(ub):
            for h in range(st.hkv):
                _probe_pair(pypto, q, k, v, p, s_out, o_out, (b0 + u) * st.hkv + h, st)


@_backend.compile_once(OP_NAME)
def build_probe(hq, hkv, topk, dim, ntile, unroll=BATCH_UNROLL, jit=JIT):
    """The ``@pypto.frontend.jit`` probe for one model configuration and tiling, built once
    (batch is a runtime value, as in the decode)."""
    pypto = require_pypto()
    st = ProbeStatic(hkv, hq // hkv, dim, topk, chunk_bounds(topk, ntile), tuple(unroll))
    combine = bool(operation_options(jit).get("combine_axis", False))

    @pypto.frontend.jit(**jit_options(jit))
    def msa_decode_probe_kernel(
        q: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # [B*HQ, D]
        k: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # [B*HKV*sel, D]
        v: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # [B*HKV*sel, D]
        p: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # [B*HQ, sel]
        s_out: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_FP32),  # [B*HQ, sel]
        o_out: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_FP32),  # [B*HKV*chunks*G, D]
    ):
        pypto.experimental.set_operation_options(combine_axis=combine)
        probe_nest(pypto, q, k, v, p, s_out, o_out, st)

    return msa_decode_probe_kernel


def _check_probe_inputs(q, k, v, p) -> tuple:
    """``(B, HQ, HKV, topk, D)`` of the probe's inputs; ``ValueError`` / ``TypeError`` naming
    the argument otherwise."""
    torch = require_torch()
    for name, t in (("q", q), ("k", k), ("v", v), ("p", p)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
            raise TypeError(f"{name}: expected a BF16 torch tensor, got {type(t).__name__}")
    if q.dim() != 3 or k.dim() != 4 or v.shape != k.shape or p.dim() != 3:
        raise ValueError(
            f"q/k/v/p: expected [B, HQ, D] / [B, HKV, sel, D] (twice) / [B, HQ, sel], got "
            f"{tuple(q.shape)} / {tuple(k.shape)} / {tuple(v.shape)} / {tuple(p.shape)}"
        )
    batch, hq, dim = q.shape
    _, hkv, sel, _ = k.shape
    if k.shape[0] != batch or k.shape[3] != dim or hq % hkv or sel % BY or sel == 0:
        raise ValueError(f"k: expected [{batch}, a divisor of {hq}, a multiple of {BY}, {dim}], "
                         f"got {tuple(k.shape)}")  # fmt: skip
    if tuple(p.shape) != (batch, hq, sel):
        raise ValueError(f"p: expected {(batch, hq, sel)}, got {tuple(p.shape)}")
    return batch, hq, hkv, sel // BY, dim


def msa_decode_probe(q, k, v, p, *, tiling=None, backend="sim", soc=DEFAULT_SOC):
    """Run the probe: the decode's C1 and C2 on these inputs, nothing else.

    Args:
        q: ``[B, HQ, D]`` BF16 queries; k, v: ``[B, HKV, topk*128, D]`` BF16, the selected keys
            of each (batch row, KV head) in slot order (what the decode's ``gather="host"``
            copies out of the paged cache); p: ``[B, HQ, topk*128]`` BF16 stand-in
            probabilities (any values: the probe's C2 reads them instead of a softmax).
        tiling: :class:`MsaTiling` (``ntile``); ``None`` = ``MsaTiling.from_env()``, as the decode.
        backend, soc: as the decode wrapper (``"sim"`` = PyPTO's CPU simulator for ``soc``).

    Returns:
        ``((s, o), cost_us)`` on the simulator, ``(s, o)`` on an NPU: ``s`` FP32
        ``[B, HQ, topk*128]`` = every chunk's ``Q @ K_c^T``; ``o`` FP32 ``[B, HKV, chunks, G, D]``
        = each chunk's ``P_c @ V_c`` (``G = HQ/HKV``).
    """
    torch = require_torch()
    batch, hq, hkv, topk, dim = _check_probe_inputs(q, k, v, p)
    tiling = MsaTiling.from_env() if tiling is None else tiling
    if not isinstance(tiling, MsaTiling):
        raise TypeError(f"tiling: expected an MsaTiling, got {type(tiling).__name__}")
    target = _backend.resolve(backend, soc, q)
    n_c = len(chunk_bounds(topk, tiling.ntile))
    sel, g = topk * BY, hq // hkv
    ins = [q.reshape(-1, dim), k.reshape(-1, dim), v.reshape(-1, dim), p.reshape(-1, sel)]
    s = torch.zeros(batch * hq, sel, dtype=torch.float32, device=q.device)
    o = torch.zeros(batch * hkv * n_c * g, dim, dtype=torch.float32, device=q.device)
    kernel = build_probe(hq, hkv, topk, dim, tiling.ntile)
    us = _backend.launch(kernel, [t.contiguous() for t in ins], [s, o], target)
    res = (s.reshape(batch, hq, sel), o.reshape(batch, hkv, n_c, g, dim))
    return (res, 0.0 if us is None else us) if target.sim else res


__all__ = [
    "BATCH_UNROLL",
    "JIT",
    "L1_REUSE_BY_ROWS",
    "ProbeStatic",
    "build_probe",
    "c1_cube_tiles",
    "c2_cube_tiles",
    "chunk_bounds",
    "msa_decode_probe",
    "probe_nest",
]
