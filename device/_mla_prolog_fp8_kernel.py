"""The ``@pypto.frontend.jit`` kernel of the DeepSeek-V3.2 MLA prolog (op ``mla_prolog``), FP8
path on the 950 (DeepSeek-V3.2-Exp ``inference/model.py`` arithmetic: FP8 E4M3 linears with
128 x 128 block scales, UE8M0 activation and latent quant, ``kv_split`` cache). The INT8
kernel, whose helpers (row sums, chunking, cube tiles, the cache write) this one reuses, is
:mod:`tilesim.device._mla_prolog_kernel`; the host glue :mod:`tilesim.device.mla_prolog`; the
rounding points ``docs/ops/mla_prolog.md`` ("Rounding points", FP8 path; "Kernel").

Loop nest (``T`` and every slot are runtime values; one compile per model config)::

    L0 token chunks of U rows   pypto.loop over T / U (U = chunk_rows(T); T padded to U)
       A1  act quant of x: per 128 values amax (floor 1e-4), UE8M0 scale, E4M3 codes
       S   per linear, once: S = FP32(sa * sb) [U, K/128, N/128, 1] from the activation
           scales and the weight's [K/128, ceil(N/128)] block scales as DeepSeek ships them
       C1  per 128-deep K block kb (56 of them): P = codes_kb @ w_kb (FP8 x FP8 -> FP32, the
           block's exact sum rounded once), acc = acc + FP32(P * S_kb), P viewed [U, 1,
           N/128, 128] against S's [U, 1, N/128, 1] slice: the golden's
           fp8_promotion="two_roundings"; once for w_dq, once for w_dkv_kr (as two column
           groups: 4 whole blocks, then the last 64 columns)
       V1  RMSNorm "deepseek" of q_a -> q_norm (BF16, written); act quant (12 blocks)
       C2  q_norm codes @ w_uq_qr, 12 K blocks as C1; BF16
       C3  absorption: per head q_nope [U, 128] @ w_uk[h] (transposed batch matmul), BF16
       V2  RoPE "interleaved" of the query's rope part and of kv_a[:, 512:] (pair transposes)
       V3  RMSNorm of kv_a[:, :512]; act quant per 128 -> E4M3 codes, 4 UE8M0 scales
       W   the INT8 kernel's cache write: per token t of the chunk a loop of
           (slot_mapping[t] >= 0) trips (0 or 1) writes its codes / rope / scales into row
           slot_mapping[t] of the three kv_split caches (slot -1: nothing written)

UE8M0 without bit operations (PyPTO 0.2.0's ``view(dtype=INT32)`` of FP32 does not compile
and the cost model has no ``exp2``): ``e = ceil(log2(y))``, ``s = FP32(BF16(exp(e * ln 2)))``
(BF16 rounding snaps the few-ULP error of ``exp`` to the power of two), then one doubling if
``s < y`` and one halving if ``s / 2 >= y``: the least power of two ``>= y``, exact, whatever
the last bits of ``log2`` and ``exp``. Block promotion: the golden's own operations, ``S =
FP32(sa * sb)`` then ``FP32(P * S)`` and the add; the block scales are read as the caller
holds them (no per-column copy exists on the host or the device). Private; importing it
needs neither torch nor pypto.
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
import math

from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto
from tilesim.device._mla_prolog_kernel import (
    JIT,
    JIT_LARGE_CHUNK,
    NBUFFER_MAX_CHUNK,
    READY_ON_HOST,
    SUM_COLS,
    _Inputs,
    chunk_loop,
    cube_tiles,
    query_heads,
    row_sum,
    row_tile,
    write_rows,
)
from tilesim.shared.casts import FP8_E4M3_MAX
from tilesim.shared.layouts.mla_cache import NOPE, NSCALES, ROPE
from tilesim.shared.mla_prolog import BLOCK, HEADS, HIDDEN, KV_A, Q_HEAD, Q_LORA, QK_NOPE

#: DeepSeek's ``act_quant`` floor of a block's amax
AMAX_FLOOR = 1e-4
#: cube tiles ``([m0, m1], [k0, k1], [n0, n1])`` of one K block of C1 (``x`` against
#: ``w_dq`` / ``w_dkv_kr``) and C2 (``q_norm`` against ``w_uq_qr``): K is the 128-deep block.
#: They and :data:`PROMOTE_COLS` change the cost model's tasks, never a bit (C1 N 512 with
#: promotion tiles of 2048 columns measured best, docs/ops/mla_prolog.md#kernel); a C2 N
#: tile of 1024 does not compile (L0B)
C1_TILES = ([16, 16], [BLOCK, BLOCK], [512, 512])
C2_TILES = ([16, 16], [BLOCK, BLOCK], [512, 512])
#: columns of the vector tiles of the block promotion (FP32 ``[rows, 2048]``: 64 KB at 8 rows)
PROMOTE_COLS = 2048
#: (K blocks, N blocks) of the vector tiles of :func:`block_scales`' ``[rows, K/128, N/128,
#: 1]`` outer product (the unit axis is padded to 8 values in the unified buffer: 24 KB at 8
#: rows; 8 x 64 overflows it). The promotion chains copy ``S`` in these tiles, so more K blocks
#: a tile means fewer copies a block; (8, 12) measured best at T = 8 on the 950. Chunks above
#: ``NBUFFER_MAX_CHUNK`` rows take :data:`SCALE_TILE_LARGE_CHUNK`, best at T = 128 (the sweeps:
#: docs/ops/mla_prolog.md#kernel)
SCALE_TILE = (8, 12)
SCALE_TILE_LARGE_CHUNK = (4, 32)
#: rows of :func:`act_quant`'s ``[rows * blocks, 128]`` vector tiles (FP32: 32 KB): 64 rows
#: halve the divide-and-cast tasks of ``x`` against 32 and measured best against 32 and 128
#: (docs/ops/mla_prolog.md#kernel)
QUANT_ROWS = 64
K_BLOCKS_X = HIDDEN // BLOCK  # 56
K_BLOCKS_Q = Q_LORA // BLOCK  # 12


class MlaFp8Params:
    """Static (trace-time) parameters of one FP8 build; ``repr`` keys pypto's compiled-kernel
    cache. ``rms_eps``: FP32 value of the ``"deepseek"`` RMSNorm; ``chunk``: tokens per trip
    of the token loop (:func:`tilesim.device._mla_prolog_kernel.chunk_rows`)."""

    def __init__(self, *, rms_eps, chunk=8):
        self.rms_eps, self.chunk = float(rms_eps), int(chunk)

    @property
    def key(self) -> tuple:
        return ("fp8", "kv_split", "deepseek", "two_roundings", self.rms_eps, self.chunk)

    def __repr__(self) -> str:
        return "MlaFp8Params(path={}, cache={}, rms_form={}, promotion={}, rms_eps={}, " \
               "chunk={})".format(*self.key)  # fmt: skip


# ----------------------------------------------------------------------------- quant
def ue8m0(pypto, y, rows: int):
    """FP32 ``[rows, 1]``: the least power of two ``>= y`` of positive normal FP32 ``y [rows,
    1]`` (module docstring; the golden's ``2^ceil(log2(y))``)."""
    pypto.set_vec_tile_shapes(min(rows, 64), 1)
    e = pypto.ceil(pypto.log2(y))
    s = pypto.exp(pypto.mul(e, math.log(2.0)))
    s = pypto.cast(pypto.cast(s, pypto.DT_BF16), pypto.DT_FP32)
    s = pypto.where(pypto.lt(s, y), pypto.mul(s, 2.0), s)
    half = pypto.mul(s, 0.5)
    return pypto.where(pypto.ge(half, y), half, s)


def act_quant(pypto, v, rows: int, width: int):
    """DeepSeek's ``act_quant(v, 128, "ue8m0")`` of BF16 ``v [rows, width]``: per 128 values
    ``amax = max(max|v|, 1e-4)``, ``s = ue8m0(FP32(amax * FP32(1/448)))``, codes ``e4m3(v /
    s)`` (``|v / s| <= 448``: no clamp needed) -> ``(codes FP8 [rows, width], s FP32 [rows,
    width / 128])``."""
    nb = width // BLOCK
    g_rows = rows * nb
    rt = min(g_rows, QUANT_ROWS)
    pypto.set_vec_tile_shapes(row_tile(rows), min(width, 512))
    g = pypto.reshape(pypto.cast(v, pypto.DT_FP32), [g_rows, BLOCK])
    pypto.set_vec_tile_shapes(rt, BLOCK)
    amax = pypto.amax(pypto.abs(g), -1, keepdim=True)
    pypto.set_vec_tile_shapes(min(g_rows, 64), 1)
    y = pypto.mul(pypto.maximum(amax, AMAX_FLOOR), 1.0 / FP8_E4M3_MAX)
    s = ue8m0(pypto, y, g_rows)
    pypto.set_vec_tile_shapes(rt, BLOCK)
    codes = pypto.cast(pypto.div(g, s), pypto.DT_FP8E4M3)
    pypto.set_vec_tile_shapes(row_tile(rows), min(width, 512))
    codes = pypto.reshape(codes, [rows, width])
    pypto.set_vec_tile_shapes(row_tile(rows), nb)
    return codes, pypto.reshape(s, [rows, nb])


def block_scales(pypto, sa, sb, u: int):
    """FP32 ``[u, K/128, nb, 1]``: the golden's combined scale ``S = FP32(sa * sb)`` of every
    (token, K block, N block), from the UE8M0 activation scales ``sa [u, K/128]`` and the
    weight's block scales ``sb [K/128, nb]`` as DeepSeek ships them. One outer product: each
    operand is broadcast along one axis (PyPTO 0.2.0 refuses an operand expanded along two,
    e.g. a ``[1, nb, 1]`` row against ``[u, nb, 128]``)."""
    kbs, nb = sb.shape
    pypto.set_vec_tile_shapes(row_tile(u), kbs, 1, 1)
    sa4 = pypto.reshape(sa, [u, kbs, 1, 1])
    pypto.set_vec_tile_shapes(1, kbs, nb, 1)
    sb4 = pypto.reshape(sb, [1, kbs, nb, 1])
    tile = SCALE_TILE if u <= NBUFFER_MAX_CHUNK else SCALE_TILE_LARGE_CHUNK
    pypto.set_vec_tile_shapes(row_tile(u), min(kbs, tile[0]), min(nb, tile[1]), 1)
    return pypto.mul(sa4, sb4)


def block_linear(pypto, codes, sa, w, sb, u: int, tiles: tuple, groups: tuple):
    """FP32 ``[u, width]`` per column group ``(c0, width)`` of ``groups`` (each a run of whole
    128-column blocks, or one narrower last block) of DeepSeek's ``fp8_gemm`` with
    ``fp8_promotion="two_roundings"``: ``codes`` FP8 ``[u, K]`` with UE8M0 ``sa [u, K/128]``,
    ``w`` FP8 ``[K, N]`` with its block scales ``sb [K/128, ceil(N/128)]``. Per K block
    ascending and group: ``P = codes_kb @ w[kb, group]`` (the block's exact sum rounded once),
    viewed ``[u, 1, blocks, 128]``, times its ``[u, 1, blocks, 1]`` slice of
    :func:`block_scales` (broadcast along the columns), ``acc = FP32(acc + FP32(P * S))`` from
    ``acc = +0``: the golden's arithmetic operation for operation."""
    s4 = block_scales(pypto, sa, sb, u)
    accs = [None] * len(groups)
    for kb in range(w.shape[0] // BLOCK):
        a_k = pypto.view(codes, [u, BLOCK], [0, kb * BLOCK])
        for i, (c0, width) in enumerate(groups):
            pypto.set_cube_tile_shapes(*cube_tiles(tiles, u, 1))
            part = pypto.matmul(a_k, pypto.view(w, [BLOCK, width], [kb * BLOCK, c0]),
                                pypto.DT_FP32)  # fmt: skip
            nb, cols = _promotion_tiles(pypto, u, width)
            s_kb = pypto.view(s4, [u, 1, nb, 1], [0, kb, c0 // BLOCK, 0])
            term = pypto.mul(pypto.reshape(part, [u, 1, nb, cols]), s_kb)
            accs[i] = pypto.add(term, 0.0) if accs[i] is None else pypto.add(accs[i], term)
    out = []
    for (_c0, width), acc in zip(groups, accs, strict=True):
        _promotion_tiles(pypto, u, width)
        out.append(pypto.reshape(acc, [u, width]))
    return out


def _promotion_tiles(pypto, u: int, width: int) -> tuple:
    """Sets the vector tiles of a ``width``-column group's promotion (``PROMOTE_COLS`` columns
    a tile) and returns its ``(blocks, columns per block)``."""
    nb, cols = max(width // BLOCK, 1), min(width, BLOCK)
    pypto.set_vec_tile_shapes(row_tile(u), 1, min(nb, PROMOTE_COLS // cols), cols)
    return nb, cols


# ----------------------------------------------------------------------------- stages
def rms_norm_deepseek(pypto, v, gamma, ones, u: int, eps: float):
    """BF16 ``rms_norm(v) * gamma`` of BF16 ``v [u, n]``, DeepSeek's form: ``m = FP32(rowsum(
    x*x)) / n`` (FP32 division), ``y = x * FP32(1 / sqrt(m + eps))``, times FP32 ``gamma [1,
    n]``, BF16."""
    n = v.shape[1]
    pypto.set_vec_tile_shapes(row_tile(u), n)
    x = pypto.cast(v, pypto.DT_FP32)
    m = row_sum(pypto, pypto.mul(x, x), ones, u)
    pypto.set_vec_tile_shapes(row_tile(u), 1)
    ms = pypto.div(m, pypto.full([u, 1], float(n), pypto.DT_FP32))
    root = pypto.sqrt(pypto.add(ms, eps))
    inv = pypto.div(pypto.full([u, 1], 1.0, pypto.DT_FP32), root)
    pypto.set_vec_tile_shapes(row_tile(u), n)
    return pypto.cast(pypto.mul(pypto.mul(x, inv), gamma), pypto.DT_BF16)


def rope_interleaved(pypto, v, cos, sin, lead: list):
    """RoPE ``"interleaved"`` of BF16 ``v [*lead, 64]`` with FP32 ``cos``/``sin`` (one angle per
    pair, ``[*lead, 32]`` broadcast over ``lead[1:]``): pairs ``(a, b) = (v[2i], v[2i+1])`` ->
    ``(a*c - b*s, a*s + b*c)`` (one FP32 rounding per product and per sum), back in the
    interleaved order, BF16. The pairs are split and rejoined by two ``[32, 2]`` transposes."""
    half, d = ROPE // 2, len(lead)
    flat = [1] * (d - 1) + [min(lead[-1], 64)]
    pypto.set_vec_tile_shapes(*flat, ROPE)
    x = pypto.cast(v, pypto.DT_FP32)
    pypto.set_vec_tile_shapes(*flat, 128, 128)
    x = pypto.reshape(pypto.transpose(pypto.reshape(x, [*lead, half, 2]), d, d + 1),
                      [*lead, ROPE])  # fmt: skip
    pypto.set_vec_tile_shapes(*flat, ROPE)
    a = pypto.view(x, [*lead, half], [0] * (d + 1))
    b = pypto.view(x, [*lead, half], [0] * d + [half])
    lo = pypto.sub(pypto.mul(a, cos), pypto.mul(b, sin))
    hi = pypto.add(pypto.mul(a, sin), pypto.mul(b, cos))
    y = pypto.concat([lo, hi], -1)
    pypto.set_vec_tile_shapes(*flat, 128, 128)
    y = pypto.reshape(pypto.transpose(pypto.reshape(y, [*lead, 2, half]), d, d + 1),
                      [*lead, ROPE])  # fmt: skip
    pypto.set_vec_tile_shapes(*flat, ROPE)
    return pypto.cast(y, pypto.DT_BF16)


def query_stage(pypto, ins, xq, t0, u: int, p):
    """``q_a`` -> norm -> ``q_norm`` (BF16, written) -> act quant -> ``q_b`` -> ``query_nope``
    and ``query_rope`` (written) for the chunk's ``u`` tokens ``t0 ..``."""
    (q_a,) = block_linear(pypto, *xq, ins.w_dq, ins.w_dq_scale, u, C1_TILES, ((0, Q_LORA),))
    pypto.set_vec_tile_shapes(row_tile(u), Q_LORA)
    q_a = pypto.cast(q_a, pypto.DT_BF16)
    qn = rms_norm_deepseek(pypto, q_a, ins.gamma_cq, ins.ones, u, p.rms_eps)
    pypto.assemble(qn, [t0, 0], ins.q_norm)
    codes, qs = act_quant(pypto, qn, u, Q_LORA)
    (q_b,) = block_linear(pypto, codes, qs, ins.w_uq_qr, ins.w_uq_qr_scale, u, C2_TILES,
                          ((0, HEADS * Q_HEAD),))  # fmt: skip
    pypto.set_vec_tile_shapes(row_tile(u), PROMOTE_COLS)
    q_b = pypto.reshape(pypto.cast(q_b, pypto.DT_BF16), [u, HEADS, Q_HEAD])

    def rope(q_pe):
        cos = pypto.reshape(pypto.view(ins.cos, [u, ROPE // 2], [t0, 0]), [u, 1, ROPE // 2])
        sin = pypto.reshape(pypto.view(ins.sin, [u, ROPE // 2], [t0, 0]), [u, 1, ROPE // 2])
        return rope_interleaved(pypto, q_pe, cos, sin, [u, HEADS])

    query_heads(pypto, ins, q_b, t0, u, rope)


def latent_stage(pypto, ins, xq, t0, u: int, p):
    """``kv_a`` -> normed latent -> E4M3 codes and 4 UE8M0 scales; ``kv_a[:, 512:]`` -> RoPE;
    then the cache writes of the chunk's tokens (module docstring, W)."""
    nope, pe = block_linear(
        pypto, *xq, ins.w_dkv_kr, ins.w_dkv_kr_scale, u, C1_TILES, ((0, NOPE), (NOPE, ROPE))
    )  # 4 whole blocks, then 64 columns
    pypto.set_vec_tile_shapes(row_tile(u), ROPE)
    cos = pypto.view(ins.cos, [u, ROPE // 2], [t0, 0])
    sin = pypto.view(ins.sin, [u, ROPE // 2], [t0, 0])
    kr = rope_interleaved(pypto, pypto.cast(pe, pypto.DT_BF16), cos, sin, [u])
    pypto.set_vec_tile_shapes(row_tile(u), NOPE)
    kvn = rms_norm_deepseek(pypto, pypto.cast(nope, pypto.DT_BF16), ins.gamma_ckv, ins.ones, u,
                            p.rms_eps)  # fmt: skip
    codes, scales = act_quant(pypto, kvn, u, NOPE)
    write_rows(pypto, ins, t0, u, (codes, kr, scales))


def prolog_nest(pypto, ins, p):
    """The loop nest of the module docstring."""

    def body(x, t0, u):
        xq = act_quant(pypto, x, u, HIDDEN)  # shared by q_a and kv_a (the same codes)
        query_stage(pypto, ins, xq, t0, u, p)
        latent_stage(pypto, ins, xq, t0, u, p)

    chunk_loop(pypto, ins, p, "MLA8_T", body)


def _source(pypto):
    """The undecorated FP8 kernel source."""

    def mla_prolog_fp8(
        x: pypto.Tensor([pypto.DYNAMIC, HIDDEN], pypto.DT_BF16),  # [T, 7168]
        w_dq: pypto.Tensor([HIDDEN, Q_LORA], pypto.DT_FP8E4M3),
        w_dq_scale: pypto.Tensor([K_BLOCKS_X, Q_LORA // BLOCK], pypto.DT_FP32),  # [56, 12]
        w_uq_qr: pypto.Tensor([Q_LORA, HEADS * Q_HEAD], pypto.DT_FP8E4M3),
        w_uq_qr_scale: pypto.Tensor([K_BLOCKS_Q, HEADS * Q_HEAD // BLOCK], pypto.DT_FP32),
        w_uk: pypto.Tensor([HEADS, QK_NOPE, NOPE], pypto.DT_BF16),
        w_dkv_kr: pypto.Tensor([HIDDEN, KV_A], pypto.DT_FP8E4M3),
        w_dkv_kr_scale: pypto.Tensor([K_BLOCKS_X, -(-KV_A // BLOCK)], pypto.DT_FP32),  # [56, 5]
        gamma_cq: pypto.Tensor([1, Q_LORA], pypto.DT_FP32),
        gamma_ckv: pypto.Tensor([1, NOPE], pypto.DT_FP32),
        cos: pypto.Tensor([pypto.DYNAMIC, ROPE // 2], pypto.DT_FP32),  # [T, 32]
        sin: pypto.Tensor([pypto.DYNAMIC, ROPE // 2], pypto.DT_FP32),
        slots: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),  # [T], -1: no write
        ones: pypto.Tensor([Q_LORA, SUM_COLS], pypto.DT_FP32),
        query_nope: pypto.Tensor([pypto.DYNAMIC, HEADS, NOPE], pypto.DT_BF16),
        query_rope: pypto.Tensor([pypto.DYNAMIC, HEADS, ROPE], pypto.DT_BF16),
        q_norm: pypto.Tensor([pypto.DYNAMIC, Q_LORA], pypto.DT_BF16),
        kv_cache: pypto.Tensor([pypto.STATIC, NOPE], pypto.DT_FP8E4M3),  # [rows, 512]
        kr_cache: pypto.Tensor([pypto.STATIC, ROPE], pypto.DT_BF16),  # [rows, 64]
        kv_scale_cache: pypto.Tensor([pypto.STATIC, NSCALES], pypto.DT_FP32),  # [rows, 4]
        params,
    ):
        ins = _Inputs(x=x, w_dq=w_dq, w_dq_scale=w_dq_scale, w_uq_qr=w_uq_qr,
                      w_uq_qr_scale=w_uq_qr_scale, w_uk=w_uk, w_dkv_kr=w_dkv_kr,
                      w_dkv_kr_scale=w_dkv_kr_scale, gamma_cq=gamma_cq, gamma_ckv=gamma_ckv,
                      cos=cos, sin=sin, slots=slots, ones=ones, query_nope=query_nope,
                      query_rope=query_rope, q_norm=q_norm, kv_cache=kv_cache,
                      kr_cache=kr_cache, kv_scale_cache=kv_scale_cache)  # fmt: skip
        prolog_nest(pypto, ins, params)

    return mla_prolog_fp8


def build(params: MlaFp8Params, static_dims: tuple, jit: tuple | None = None):
    """The jit kernel on this process's target, built once per (params, static dims = cache
    rows, options); the INT8 kernel's options (:data:`~tilesim.device._mla_prolog_kernel.JIT`
    up to :data:`~tilesim.device._mla_prolog_kernel.NBUFFER_MAX_CHUNK` tokens, else
    ``JIT_LARGE_CHUNK``)."""
    if jit is None:
        jit = JIT if params.chunk <= NBUFFER_MAX_CHUNK else JIT_LARGE_CHUNK
    return _backend.compiled_jit(
        "mla_prolog_fp8", (params.key, tuple(static_dims)), jit,
        lambda: _source(require_pypto()), ready_on_host=READY_ON_HOST)  # fmt: skip


__all__ = ["MlaFp8Params", "act_quant", "block_linear", "block_scales", "build", "ue8m0"]
