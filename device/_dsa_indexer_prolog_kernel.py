"""The ``@pypto.frontend.jit`` kernel of the DeepSeek-V3.2 lightning-indexer prolog (op
``dsa_indexer_prolog``), INT8 path (pypto-gym ``lightning_indexer_prolog_quant``, the 910B
recipe): the index queries, their scales, the head weights, and each new token's key written
into the paged index cache. The public op and its host glue are
:mod:`tilesim.device.dsa_indexer_prolog`; the contract is :mod:`tilesim.shared.dsa_indexer_prolog`;
the arithmetic it must reproduce bit for bit is the golden's (``docs/ops/dsa_indexer_prolog.md``,
"Rounding points", INT8 path).

Loop nest (``T`` and every slot are runtime values; one compile per model config)::

    L0 token tiles of U tokens    pypto.loop_unroll over T, U in :data:`UNROLL`
       Q1  q = FP32(int32 q_norm @ w_qb)            cube, INT8 x INT8 -> INT32 (exact),
                                                     the rank in one L1 fill
       Q2  q = BF16(FP32(q * q_norm_scale) * w_qb_scale)
       Q3  RoPE of each head's first 64 values       FP32 x*cos + rotate_half(x)*sin, BF16
       Q4  q = BF16(q @ hadamard_q)                  cube, K = 128 in one tile
       Q5  quant per (token, head)                   f = FP32(FP32(1/amax) * 127),
                                                     codes rint(q*f), scale FP16(1/f)
       K1  k = x @ w_k                               cube, FP32, K = H in one tile
       K2  LayerNorm: the two row sums as FP32 matmuls against a ones column
           (each the exact sum rounded once, the golden's rowsum_fp32), BF16
       K3  RoPE, K4 Hadamard, K5 quant               as Q3-Q5 (one vector per token)
       KW  per token u: for 0/1 trips (slot >= 0): row ``slot`` of the codes and of the
           scales <- the token's key (assemble at a runtime row; slot -1: no trip)
       W1  w = FP16(FP32(BF16(x @ w_proj) * 2^-3) * FP32(128^-0.5))

The matmuls whose K is the hidden size (``x @ w_k``, ``x @ w_proj``) run in K tiles of
``k_tile`` rows (L1 holds at most :data:`MAX_K_TILE` rows of ``w_k``), each tile summed
exactly and the partials added in FP32: the golden's ``k_tile`` switch, with which the kernel
is judged. The cache tensors are the wrapper's copies of the caller's caches (the kernel's
outputs); only the rows ``slot_mapping`` names are written. Private; importing it needs
neither torch nor pypto.
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
import numpy as np
from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto
from tilesim.shared.dsa_indexer import INDEX_HEADS as HEADS  # 64 index heads
from tilesim.shared.dsa_indexer_prolog import QB_COLS, ROPE_DIM
from tilesim.shared.layouts.index_cache import INDEX_DIM as DIM  # 128

#: the largest K tile of the linears over H (a [1024, 128] BF16 tile of ``w_k`` and its
#: double buffer fill half of the 910B's 512 KiB L1)
MAX_K_TILE = 1024
#: the N tile of the linears over H: 8 cube tasks for ``x @ w_k``, 4 for ``x @ w_proj``, each
#: streaming ``H / k_tile`` K tiles (cost model: fewer, longer tasks left the q projection's
#: 32 tasks waiting for a cube core; ``docs/ops/dsa_indexer_prolog.md``, "Kernel")
HIDDEN_N_TILE = 16
#: the L1 K tile of ``q_norm @ w_qb``: the whole rank (1536) in one fill, three 512-row L0
#: steps from it (a [1536, 128] INT8 tile, 192 KiB, double-buffered within the 910B's 512
#: KiB L1): 3 GM copies per task instead of 9 (figures: ``docs/ops/dsa_indexer_prolog.md``,
#: "Kernel"). INT8 x INT8 -> INT32 sums are exact in any tiling
QB_K_L1 = 1536
#: the token tiles of the L0 loop (``pypto.loop_unroll`` factors, each dividing the one before):
#: decode batches up to 31 tokens build 8 and 1 (each factor is one more traced body: CI's
#: T = 8 compiles in a quarter of the time of the large build), 32 tokens and more also 32,
#: which reads the weights a quarter as often (the T = 128 figures: the op page, "Kernel")
UNROLL = (8, 1)
LARGE_UNROLL = (32, 8, 1)
LARGE_TOKENS = 32


def unroll_for(tokens: int) -> tuple:
    """The L0 loop's unroll factors for a call of ``tokens`` tokens (two builds at most per
    model configuration, as the DeepSeek attention's large-batch build)."""
    return LARGE_UNROLL if tokens >= LARGE_TOKENS else UNROLL


#: 2^-3 = 64^-0.5 (exact) and FP32(128^-0.5): the weights' two factors, as FP32 values
HEAD_SCALE = 0.125
SOFTMAX_SCALE = float(np.float32(DIM**-0.5))
#: the INT8 code range
QMAX = 127.0
#: the jit options: PyPTO's own indexer examples' stitch 128 and scheduling mode 1
JIT = (
    ("runtime", "stitch_function_max_num", 128),
    ("runtime", "device_sched_mode", 1),
)
#: the slots: the cache write's trip counts read them on the host
READY_ON_HOST = ("slot_mapping",)


class PrologParams:
    """Static (trace-time) parameters of one build; ``repr`` keys pypto's compiled-kernel
    cache (equal parameters reuse a kernel)."""

    def __init__(self, *, eps, amax_floor, k_tile, unroll=UNROLL):
        self.eps, self.amax_floor = float(eps), float(amax_floor)
        self.k_tile, self.unroll = int(k_tile), tuple(unroll)

    @property
    def key(self) -> tuple:
        return (self.eps, self.amax_floor, self.k_tile, self.unroll)

    def __repr__(self) -> str:
        return "PrologParams(eps={}, amax_floor={}, k_tile={}, unroll={})".format(*self.key)


# ----------------------------------------------------------------------------- steps
def rope_rows(pypto, x, cos, sin):
    """RoPE ("halves") of BF16 ``x [..., 64]`` by FP32 tables broadcast over its middle axes:
    ``x * cos + rotate_half(x) * sin`` in FP32 (two products, one add), BF16 -- the golden's
    ``shared/rope.py`` order (``rotate_half(x) = [-x2, x1]``; the negation is exact)."""
    x32 = pypto.cast(x, pypto.DT_FP32)
    shp = list(x32.shape)
    half = shp[:-1] + [ROPE_DIM // 2]
    lo = [0] * len(shp)
    hi = lo[:-1] + [ROPE_DIM // 2]
    x1, x2 = pypto.view(x32, half, lo), pypto.view(x32, half, hi)
    rot = pypto.concat([pypto.mul(x2, -1.0), pypto.mul(x1, 1.0)], -1)
    return pypto.cast(pypto.add(pypto.mul(x32, cos), pypto.mul(rot, sin)), pypto.DT_BF16)


def quant_rows(pypto, v, floor: float):
    """Per row of BF16 ``v [n, 128]``: ``(codes int8 [n, 128], scale FP16 [n, 1])`` by the
    golden's reciprocal rule: ``amax = max(max|v|, floor)``, ``f = FP32(FP32(1 / amax) *
    127)``, codes ``rint(v * f)`` (half to even; INT32 -> FP16 -> INT8 exact for |code| <=
    127), scale ``FP16(FP32(1 / f))``."""
    v32 = pypto.cast(v, pypto.DT_FP32)
    amax = pypto.maximum(pypto.amax(pypto.abs(v32), -1, keepdim=True), floor)
    f = pypto.mul(pypto.reciprocal(amax), QMAX)
    c32 = pypto.cast(pypto.mul(v32, f), pypto.DT_INT32, pypto.CastMode.CAST_RINT)
    c16 = pypto.cast(c32, pypto.DT_FP16, pypto.CastMode.CAST_ROUND)
    codes = pypto.cast(c16, pypto.DT_INT8, pypto.CastMode.CAST_TRUNC,
                       satmode=pypto.SaturationMode.ON)  # fmt: skip
    return codes, pypto.cast(pypto.reciprocal(f), pypto.DT_FP16)


def rope_head(pypto, v, cos, sin, rows: int):
    """``[ROPE(v[..., :64]) | v[..., 64:]]`` (BF16) of BF16 ``v [..., rows, 128]`` whose tables
    ``cos``/``sin`` broadcast over ``rows``."""
    if len(v.shape) == 2:
        pypto.set_vec_tile_shapes(min(rows, 64), DIM)
    shp = list(v.shape)
    rope = pypto.view(v, shp[:-1] + [ROPE_DIM], [0] * len(shp))
    rest = pypto.view(v, shp[:-1] + [DIM - ROPE_DIM], [0] * (len(shp) - 1) + [ROPE_DIM])
    keep = pypto.cast(pypto.cast(rest, pypto.DT_FP32), pypto.DT_BF16)  # exact, keeps -0.0
    return pypto.concat([rope_rows(pypto, rope, cos, sin), keep], -1)


def rotate(pypto, v2, had, m: int):
    """``BF16(v2 @ had)``: the Hadamard matrix input on the cube, ``v2 [m, 128]``."""
    mt = min(m, 128)
    pypto.set_cube_tile_shapes([mt, mt], [DIM, DIM], [DIM, DIM])
    return pypto.matmul(v2, had, pypto.DT_BF16)


def queries(pypto, ins, t0, u: int, p):
    """Q1-Q5 of ``u`` tokens ``t0 ..``: ``(codes [u*64, 128], scales [u*64, 1])``."""
    qn = pypto.view(ins.q_norm, [u, ins.rank], [t0, 0])
    qs = pypto.view(ins.q_norm_scale, [u, 1], [t0, 0])
    kl1 = min(QB_K_L1, ins.rank)
    pypto.set_cube_tile_shapes([16, 16], [min(512, kl1), kl1], [128, 128])
    q32 = pypto.matmul(qn, ins.w_qb, pypto.DT_INT32)
    pypto.set_vec_tile_shapes(1, QB_COLS // 2)
    q = pypto.cast(pypto.mul(pypto.mul(pypto.cast(q32, pypto.DT_FP32), qs), ins.w_qb_scale),
                   pypto.DT_BF16)  # fmt: skip
    q3 = pypto.reshape(q, [u, HEADS, DIM])
    cos, sin = token_tables(pypto, ins, t0, u, 3)
    pypto.set_vec_tile_shapes(1, HEADS // 2, DIM)
    cat = rope_head(pypto, q3, cos, sin, HEADS)
    q2 = pypto.reshape(cat, [u * HEADS, DIM])
    rot = rotate(pypto, q2, ins.hadamard_q, u * HEADS)
    pypto.set_vec_tile_shapes(HEADS, DIM)
    return quant_rows(pypto, rot, p.amax_floor)


def token_tables(pypto, ins, t0, u: int, ndim: int):
    """FP32 ``cos``/``sin`` of tokens ``t0 ..`` as ``[u, 1, 64]`` (``ndim`` 3, broadcast over
    the heads) or ``[u, 64]``."""
    pypto.set_vec_tile_shapes(1, ROPE_DIM)
    out = []
    for tab in (ins.cos, ins.sin):
        c = pypto.cast(pypto.view(tab, [u, ROPE_DIM], [t0, 0]), pypto.DT_FP32)
        out.append(pypto.reshape(c, [u, 1, ROPE_DIM]) if ndim == 3 else c)
    return out


def row_sum(pypto, v32, ones, u: int):
    """FP32 ``[u, 1]`` row sums of FP32 ``v32 [u, 128]``: one matmul against a ones column
    (the exact sum rounded once: :func:`tilesim.reference.util.arith.rowsum_fp32`)."""
    pypto.set_cube_tile_shapes([16, 16], [DIM, DIM], [16, 16])
    s = pypto.matmul(v32, ones, pypto.DT_FP32)
    return pypto.view(s, [u, 1], [0, 0])


def layer_norm(pypto, ins, k32, u: int, eps: float):
    """BF16 ``[u, 128]`` LayerNorm of FP32 ``k32`` (the golden's ``LN``): ``mean = sum / 128``,
    ``d = k - mean``, ``var = sum(d * d) / 128``, ``d / sqrt(var + eps) * gamma + beta``."""
    ones = ins.ones
    pypto.set_vec_tile_shapes(u, DIM)
    mean = pypto.mul(row_sum(pypto, k32, ones, u), 1.0 / DIM)
    pypto.set_vec_tile_shapes(u, DIM)
    d = pypto.sub(k32, mean)
    dd = pypto.mul(d, d)
    var = pypto.mul(row_sum(pypto, dd, ones, u), 1.0 / DIM)
    pypto.set_vec_tile_shapes(u, DIM)
    y = pypto.div(d, pypto.sqrt(pypto.add(var, eps)))
    g = pypto.cast(ins.ln_gamma, pypto.DT_FP32)
    b = pypto.cast(ins.ln_beta, pypto.DT_FP32)
    return pypto.cast(pypto.add(pypto.mul(y, g), b), pypto.DT_BF16)


def hidden_tiles(pypto, k_tile: int):
    """The cube tiles of a linear over H (``x @ w_k``, ``x @ w_proj``): M 16, K ``k_tile`` in
    L0 and in L1, N :data:`HIDDEN_N_TILE`. The L1 K tile is the interpreter's exactly summed
    tile, so it stays ``k_tile`` (the golden's switch): two ``k_tile`` steps per L1 fill
    cost less but moved the bits of the weights and the keys
    (``docs/ops/dsa_indexer_prolog.md``, "Kernel")."""
    pypto.set_cube_tile_shapes([16, 16], [k_tile, k_tile], [HIDDEN_N_TILE, HIDDEN_N_TILE])


def keys(pypto, ins, t0, u: int, p):
    """K1-K5 of ``u`` tokens: ``(codes [u, 128], scales [u, 1])``."""
    x = pypto.view(ins.x, [u, ins.hidden], [t0, 0])
    hidden_tiles(pypto, p.k_tile)
    k32 = pypto.matmul(x, ins.w_k, pypto.DT_FP32)
    k = layer_norm(pypto, ins, k32, u, p.eps)
    cos, sin = token_tables(pypto, ins, t0, u, 2)
    pypto.set_vec_tile_shapes(u, DIM)
    cat = rope_head(pypto, k, cos, sin, u)
    rot = rotate(pypto, cat, ins.hadamard_k, u)
    pypto.set_vec_tile_shapes(u, DIM)
    return quant_rows(pypto, rot, p.amax_floor)


def head_weights(pypto, ins, t0, u: int, p):
    """W1: FP16 ``[u, 64]`` weights ``FP16(FP32(BF16(x @ w_proj) * 2^-3) * FP32(128^-0.5))``."""
    x = pypto.view(ins.x, [u, ins.hidden], [t0, 0])
    hidden_tiles(pypto, p.k_tile)
    w = pypto.matmul(x, ins.w_proj, pypto.DT_BF16)
    pypto.set_vec_tile_shapes(u, HEADS)
    w = pypto.mul(pypto.mul(pypto.cast(w, pypto.DT_FP32), HEAD_SCALE), SOFTMAX_SCALE)
    return pypto.cast(w, pypto.DT_FP16)


def write_keys(pypto, ins, codes, scales, t0, u: int, outs):
    """KW: token ``t0 + i``'s key into row ``slot_mapping[t0 + i]`` of the code and scale
    caches, one 0/1-trip loop per token (no trip for slot -1: nothing is written)."""
    for i in range(u):
        slot = ins.slot_mapping[t0 + i]
        trips = (slot + 1).min(1)
        for _w in pypto.loop(0, trips, 1, name=f"IP_WRITE{u}_{i}", idx_name=f"w{u}_{i}"):
            pypto.set_vec_tile_shapes(1, DIM)
            pypto.assemble(pypto.view(codes, [1, DIM], [i, 0]), [slot, 0], outs.k_cache)
            pypto.set_vec_tile_shapes(1, 16)  # a 32-byte tile shape; the tensor is [1, 1]
            pypto.assemble(pypto.view(scales, [1, 1], [i, 0]), [slot, 0], outs.k_scale)


def write_queries(pypto, outs, qc, qsc, t0, scale_cols: int):
    """The query codes ``[u*H, DIM]`` and scales ``[u*H, 1]`` into rows ``t0*H ..`` of
    ``outs.q`` and ``outs.q_scale`` (the scales' vector tile ``[H, scale_cols]``)."""
    pypto.set_vec_tile_shapes(HEADS, DIM)
    pypto.assemble(qc, [t0 * HEADS, 0], outs.q)
    pypto.set_vec_tile_shapes(HEADS, scale_cols)
    pypto.assemble(qsc, [t0 * HEADS, 0], outs.q_scale)


def prolog_nest(pypto, ins, outs, p):
    """The loop nest of the module docstring."""
    t = ins.x.shape[0]
    for t0, u in pypto.loop_unroll(0, t, 1, name="IP_TOK", idx_name="t0",
                                   unroll_list=list(p.unroll)):  # fmt: skip
        write_queries(pypto, outs, *queries(pypto, ins, t0, u, p), t0, 1)
        kc, ksc = keys(pypto, ins, t0, u, p)
        write_keys(pypto, ins, kc, ksc, t0, u, outs)
        pypto.set_vec_tile_shapes(u, HEADS)
        pypto.assemble(head_weights(pypto, ins, t0, u, p), [t0, 0], outs.weights)


# ----------------------------------------------------------------------------- the kernel
class _Args:
    """Named kernel tensors (and the static sizes the nest reads)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _source(pypto, ln_dtype, tab_dtype):
    """The undecorated INT8 kernel for the LayerNorm parameters' and the RoPE tables' dtypes."""

    def ip_int8(
        x: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # [T, H]
        q_norm: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT8),  # [T, R]
        q_norm_scale: pypto.Tensor([pypto.DYNAMIC, 1], pypto.DT_FP32),  # [T, 1]
        w_qb: pypto.Tensor([pypto.STATIC, QB_COLS], pypto.DT_INT8),  # [R, 8192]
        w_qb_scale: pypto.Tensor([1, QB_COLS], pypto.DT_FP32),  # [1, 8192]
        w_k: pypto.Tensor([pypto.STATIC, DIM], pypto.DT_BF16),  # [H, 128]
        w_proj: pypto.Tensor([pypto.STATIC, HEADS], pypto.DT_BF16),  # [H, 64]
        ln_gamma: pypto.Tensor([1, DIM], ln_dtype),  # [1, 128]
        ln_beta: pypto.Tensor([1, DIM], ln_dtype),  # [1, 128]
        cos: pypto.Tensor([pypto.DYNAMIC, ROPE_DIM], tab_dtype),  # [T, 64]
        sin: pypto.Tensor([pypto.DYNAMIC, ROPE_DIM], tab_dtype),  # [T, 64]
        hadamard_q: pypto.Tensor([DIM, DIM], pypto.DT_BF16),
        hadamard_k: pypto.Tensor([DIM, DIM], pypto.DT_BF16),
        ones: pypto.Tensor([DIM, 16], pypto.DT_FP32),  # the row sums' ones columns
        slot_mapping: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),  # [T]
        q: pypto.Tensor([pypto.DYNAMIC, DIM], pypto.DT_INT8),  # [T*64, 128]
        q_scale: pypto.Tensor([pypto.DYNAMIC, 1], pypto.DT_FP16),  # [T*64, 1]
        weights: pypto.Tensor([pypto.DYNAMIC, HEADS], pypto.DT_FP16),  # [T, 64]
        k_cache: pypto.Tensor([pypto.STATIC, DIM], pypto.DT_INT8),  # [num_blocks*bs, 128]
        k_scale: pypto.Tensor([pypto.STATIC, 1], pypto.DT_FP16),  # [num_blocks*bs, 1]
        params,
    ):
        _Args(dtypes=(ln_dtype, tab_dtype))  # the closure's dtypes (the annotations read them)
        ins = _Args(x=x, q_norm=q_norm, q_norm_scale=q_norm_scale, w_qb=w_qb,
                    w_qb_scale=w_qb_scale, w_k=w_k, w_proj=w_proj,
                    ln_gamma=ln_gamma, ln_beta=ln_beta, cos=cos, sin=sin,
                    hadamard_q=hadamard_q, hadamard_k=hadamard_k, ones=ones,
                    slot_mapping=slot_mapping, hidden=x.shape[1], rank=q_norm.shape[1])  # fmt: skip
        outs = _Args(q=q, q_scale=q_scale, weights=weights, k_cache=k_cache, k_scale=k_scale)
        prolog_nest(pypto, ins, outs, params)

    return ip_int8


_DTYPES = {"bfloat16": "DT_BF16", "float32": "DT_FP32"}


def build(params: PrologParams, dtypes: tuple, static_dims: tuple, jit: tuple = JIT):
    """The jit kernel on this process's target, built once per (params, the LayerNorm
    parameters' and RoPE tables' dtype names, static dims = ``(H, R, cache rows)``, options)
    (:func:`tilesim.device.backend.compiled`); ``T`` and the slots are runtime values."""
    pypto = require_pypto()
    ln_dt, tab_dt = (getattr(pypto, _DTYPES[d]) for d in dtypes)
    return _backend.compiled_jit(
        "dsa_indexer_prolog", (params.key, tuple(dtypes), tuple(static_dims)), jit,
        lambda: _source(pypto, ln_dt, tab_dt), ready_on_host=READY_ON_HOST)  # fmt: skip


__all__ = [
    "JIT",
    "LARGE_UNROLL",
    "MAX_K_TILE",
    "READY_ON_HOST",
    "UNROLL",
    "unroll_for",
    "PrologParams",
    "build",
]
