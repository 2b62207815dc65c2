"""The ``@pypto.frontend.jit`` kernel of the DeepSeek-V3.2 lightning-indexer prolog (op
``dsa_indexer_prolog``), FP8 path (the 950): DeepSeek-V3.2's indexer
(``deepseek-ai/DeepSeek-V3.2-Exp:inference/model.py``, ``Indexer``; its FP8 ``Linear`` in
``inference/kernel.py``) on PyPTO, writing the new keys into the 132-byte FP8 pages the FP8
indexer kernel (:mod:`tilesim.device._dsa_indexer_kernel`) reads. The public op and its host
glue are :mod:`tilesim.device.dsa_indexer_prolog`; the arithmetic it reproduces bit for bit
is the golden's with ``fp8_promotion="two_roundings"`` (``docs/ops/dsa_indexer_prolog.md``,
"Rounding points", FP8 path, and "Kernel").

Loop nest (``T`` and every slot are runtime values; one compile per model config)::

    L0 token tiles of U tokens    pypto.loop_unroll over T, U in UNROLL of the INT8 kernel
       Q1  a, sa = act_quant(q_norm) per 128         E4M3 codes, UE8M0 scales (ladder below)
       Q2  q = BF16(LIN8(a, sa, w_qb, w_qb_scale))   per K block kb of 128: cube E4M3 x E4M3
                                                     -> FP32 P (one rounding), S = FP32(sa *
                                                     sb), acc = FP32(acc + FP32(P * S));
                                                     S of all K blocks in one operation,
                                                     every P * S in one pass, acc on views
       Q3  RoPE of each head's first 64 values       the INT8 kernel's rope_head (FP32, BF16)
       Q4  q = BF16(FWHT(q) * FP32(128^-0.5))        7 butterfly stages as FP32 matmuls
       Q5  q, q_scale = act_quant(q) per head        E4M3 codes out, FP32 scales out
       K1  k = BF16(LIN8(act_quant(x), w_k))         as Q1-Q2, 1 scale per K block of w_k
       K2  LayerNorm (the INT8 kernel's, on the BF16 key), K3 RoPE, K4 FWHT, K5 act_quant
       KB  the key's codes as their bytes (exact arithmetic: encode_e4m3_bytes)
       KW  per token u: for 0/1 trips (slot >= 0): the 128 code bytes and the 4 bytes of the
           FP32 scale into the token's places of its page (slot -1: no trip)
       W1  w = FP32(FP32(FP32(x @ w_proj) * 2^-3) * q_scale) * FP32(128^-0.5)
                                                     FP32 cube in K tiles of k_tile

``act_quant`` (DeepSeek's, :func:`tilesim.shared.quant.quantize_index_fp8`): ``amax =
max(max|v|, floor)``, ``s = 2^ceil(log2(FP32(amax / 448)))`` found by a ladder of exact
power-of-two multiplies and compares (PyPTO 0.2.0's cost model has no ``exp2``), codes
``E4M3(v / s)`` (saturating RNE cast).

The FWHT: each butterfly stage ``(a, b) -> (a + b, a - b)`` is one FP32 matmul by a ``+-1``
stage matrix (:func:`hadamard_stages`, two non-zeros per column): the cube's exact sum of
the column's two products, rounded once, is the FP32 add / subtract; the stages run in the
golden's ascending stride order. The sign of an exactly-zero result can differ from the
golden's butterflies: there ``-0 + -0`` is ``-0``, here every zero sum is ``+0`` (it needs
``-0`` entries entering the rotation; the op page, "Kernel").

The page write goes through one INT8 view of the page bytes (``[num_blocks * code_rows,
128]``, :func:`tilesim.shared.layouts.index_cache.index_page_view`): PyPTO 0.2.0 has no bit
view of an FP8 tile (``view(dtype=)`` from FP8 fails to compile), and two aliased output
views of one page (FP8 codes + FP32 words) do not survive the simulator's copy-back, so the
key's codes are re-encoded into their bytes by exact arithmetic and the FP32 scale is split
into its 4 bytes by ``view(dtype=DT_INT8)``. Private; importing it needs neither torch nor
pypto.
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
import numpy as np
from tilesim.device import backend as _backend
from tilesim.device._dsa_indexer_prolog_kernel import (
    HEAD_SCALE,
    HIDDEN_N_TILE,
    JIT,
    READY_ON_HOST,
    SOFTMAX_SCALE,
    UNROLL,
    _Args,
    layer_norm,
    rope_head,
    write_queries,
)
from tilesim.device._lazy import require_pypto
from tilesim.shared.casts import FP8_E4M3_MAX
from tilesim.shared.dsa_indexer import INDEX_HEADS as HEADS  # 64 index heads
from tilesim.shared.dsa_indexer_prolog import FP8_BLOCK, QB_COLS, ROPE_DIM
from tilesim.shared.layouts.index_cache import INDEX_DIM as DIM  # 128
from tilesim.shared.layouts.index_cache import index_page_view

#: DeepSeek ``act_quant``'s amax floor inside its FP8 ``Linear`` (``inference/kernel.py``)
LINEAR_AMAX_FLOOR = 1e-4
#: the butterfly stages of the 128-point transform (strides 1, 2, ..., 64)
STAGES = int(np.log2(DIM))
#: the UE8M0 ladder: from 2^-126 (the smallest normal FP32) up by these powers of two, each
#: step kept while the candidate stays below ``y``; 64 + 64 + 64 + 63 covers every normal
#: exponent, so the result 2 * p is the least power of two >= y
LADDER_START = 2.0**-126
LADDER = (64, 64, 64, 32, 16, 8, 4, 2, 1)
#: the smallest normal E4M3 magnitude (2^-6) and the byte encoder's exponent ladder over it
E4M3_MIN_NORMAL = 2.0**-6
E4M3_LADDER = (8, 4, 2, 1)
#: the vector tile of an ``[U, blocks, 128]`` FP32 block tensor holds at most this many values
#: (64 KiB): every token's rows of as many 128-blocks as fit (docs/ops/dsa_indexer_prolog.md,
#: "Kernel": tiles of 12-128 values spent the kernel's time in GM copies)
BLOCK_TILE_VALUES = 16384
#: the vector tile of a many-block promotion (``w_qb``'s 64 N blocks) holds at most this many
#: values: ``[1, 64, 128]``, the fastest at T = 8 (the variants measured:
#: docs/perf/journal.md)
PROMOTE_TILE_VALUES = 8192
#: the K blocks of a one-block-wide linear (``x @ w_k``) per promotion tile: the accumulation
#: runs on views of the tile (no copy per K block)
PROMOTE_K_BLOCKS = 8
#: the token rows promoted together (a 32-token tile's ``w_qb`` partials in one tensor, 12 MB,
#: do not compile: PyPTO 0.2.0 fails a pass; 16 rows the fastest of 4, 8 and 16 at T = 128,
#: docs/perf/journal.md)
PROMOTE_ROWS = 16
#: E4M3: 3 mantissa bits, exponent bias 7; subnormal step 2^-9
E4M3_MANT = 8.0
E4M3_BIAS = 7.0
E4M3_SUB_STEP = 2.0**9


class Fp8Params:
    """Static (trace-time) parameters of one FP8 build; ``repr`` keys pypto's compiled-kernel
    cache (equal parameters reuse a kernel)."""

    def __init__(self, *, eps, amax_floor, k_tile, block_size, unroll=UNROLL):
        self.eps, self.amax_floor = float(eps), float(amax_floor)
        self.k_tile, self.block_size, self.unroll = int(k_tile), int(block_size), tuple(unroll)
        page = index_page_view("fp8", self.block_size)
        self.code_rows = page.code_rows  # rows of 128 bytes per page

    @property
    def key(self) -> tuple:
        return (self.eps, self.amax_floor, self.k_tile, self.block_size, self.unroll)

    def __repr__(self) -> str:
        return ("Fp8Params(eps={}, amax_floor={}, k_tile={}, block_size={}, "
                "unroll={})").format(*self.key)  # fmt: skip


def hadamard_stages() -> np.ndarray:
    """FP32 ``[7 * 128, 128]``: the butterfly stage matrices ``M_s`` (stride ``2^s``) stacked,
    ``v @ M_s`` mapping ``(v[j], v[j + stride])`` of each block of ``2 * stride`` to ``(v[j] +
    v[j + stride], v[j] - v[j + stride])`` (:func:`tilesim.shared.hadamard.fwht_fp32`'s stage)."""
    out = np.zeros((STAGES, DIM, DIM), dtype=np.float32)
    for s in range(STAGES):
        stride = 1 << s
        for j in range(DIM):
            if j & stride:  # j is the b of the pair (j - stride, j)
                continue
            a, b = j, j + stride
            out[s, a, a], out[s, b, a] = 1.0, 1.0  # column a: v[a] + v[b]
            out[s, a, b], out[s, b, b] = 1.0, -1.0  # column b: v[a] - v[b]
    return out.reshape(STAGES * DIM, DIM)


# ----------------------------------------------------------------------------- steps
def ue8m0_scale(pypto, y):
    """``2^ceil(log2(y))`` of positive normal FP32 ``y [..., 1]``, exactly: the largest ``p =
    2^-126 * 2^m`` below ``y`` by the :data:`LADDER`, then ``2 p``."""
    p = pypto.add(pypto.mul(y, 0.0), LADDER_START)
    for b in LADDER:
        cand = pypto.mul(p, float(2.0**b))
        p = pypto.where(pypto.lt(cand, y), cand, p)
    return pypto.mul(p, 2.0)


def act_quant(pypto, v32, floor: float):
    """Per 128-vector (last axis) of FP32 ``v32``: ``(codes E4M3, scales FP32 [..., 1])``:
    ``amax = max(max|v|, floor)``, ``s = UE8M0(FP32(amax / 448))``, codes ``E4M3(v / s)``."""
    amax = pypto.maximum(pypto.amax(pypto.abs(v32), -1, keepdim=True), floor)
    s = ue8m0_scale(pypto, pypto.div(amax, FP8_E4M3_MAX))
    return pypto.cast(pypto.div(v32, s), pypto.DT_FP8E4M3), s


def block_tile(u: int, nb: int, values: int = BLOCK_TILE_VALUES) -> tuple:
    """The vector tile ``[rows, blocks, 128]`` of an FP32 ``[u, nb, 128]`` block tensor: as
    many blocks as fit ``values``, then as many of the ``u`` rows."""
    blocks = max(1, min(nb, values // FP8_BLOCK))
    return max(1, min(u, values // (blocks * FP8_BLOCK))), blocks, FP8_BLOCK


def promote_tile(u: int) -> tuple:
    """The vector tile of a one-block-wide promotion (``x @ w_k``): :data:`PROMOTE_K_BLOCKS`
    K blocks of as many of the ``u`` rows as fit :data:`BLOCK_TILE_VALUES`."""
    rows = BLOCK_TILE_VALUES // (PROMOTE_K_BLOCKS * FP8_BLOCK)
    return max(1, min(u, rows)), PROMOTE_K_BLOCKS, FP8_BLOCK


def linear_fp8(pypto, codes, sa, w, w_scale, u: int, n: int):
    """BF16 ``[u, n]``: DeepSeek's FP8 ``Linear`` of E4M3 ``codes [u, K]`` with scales ``sa [u,
    K/128, 1]`` by E4M3 ``w [K, n]`` with block scales ``w_scale [K/128, n/128]``: per K block
    ``P = codes_kb @ w_kb`` (FP32), ``acc = FP32(acc + FP32(P * FP32(sa_kb * sb_kb)))`` from
    ``acc = 0``, ascending, then BF16 (the golden's ``"two_roundings"`` promotion). The scale
    products of every K block are one operation, the partials one ``[u, K/128 * n/128, 128]``
    tensor (K block major) multiplied by them in one pass, and the accumulation runs on views
    of it: per tile one copy, not one per K block (:func:`promote`, :data:`PROMOTE_ROWS` token
    rows at a time)."""
    nb, nkb = n // FP8_BLOCK, codes.shape[1] // FP8_BLOCK
    pypto.set_vec_tile_shapes(*block_tile(u, nkb))
    scales = pypto.mul(sa, pypto.reshape(w_scale, [1, nkb, nb]))  # [u, nkb, nb]
    parts = []
    for kb in range(nkb):
        pypto.set_cube_tile_shapes([16, 16], [FP8_BLOCK, FP8_BLOCK], [min(n, 512), min(n, 512)])
        part = pypto.matmul(
            pypto.view(codes, [u, FP8_BLOCK], [0, kb * FP8_BLOCK]),
            pypto.view(w, [FP8_BLOCK, n], [kb * FP8_BLOCK, 0]),
            pypto.DT_FP32,
        )
        pypto.set_vec_tile_shapes(*block_tile(u, nb))
        parts.append(pypto.reshape(part, [u, nb, FP8_BLOCK]))
    outs = [promote(pypto, parts, scales, r0, min(PROMOTE_ROWS, u - r0))
            for r0 in range(0, u, PROMOTE_ROWS)]  # fmt: skip
    return pypto.reshape(outs[0] if len(outs) == 1 else pypto.concat(outs, 0), [u, n])


def promote(pypto, parts, scales, r0: int, m: int):
    """BF16 ``[m, nb, 128]``: rows ``r0 .. r0 + m`` of ``FP32(acc + FP32(P_kb * S_kb))`` over
    the K blocks' partials ``parts`` (each FP32 ``[u, nb, 128]``) and their scale products
    ``scales [u, nkb, nb]``, ascending from ``acc = 0``: the ``P * S`` of every K block in one
    pass over the concatenated ``[m, nkb * nb, 128]``, the accumulation on its views."""
    u, nb = parts[0].shape[0], parts[0].shape[1]
    nkb = len(parts)
    tile = promote_tile(m) if nb == 1 else block_tile(m, nb, PROMOTE_TILE_VALUES)
    pypto.set_vec_tile_shapes(*tile)
    if m < u:
        parts = [pypto.view(part, [m, nb, FP8_BLOCK], [r0, 0, 0]) for part in parts]
        scales = pypto.view(scales, [m, nkb, nb], [r0, 0, 0])
    terms = pypto.mul(pypto.concat(parts, 1), pypto.reshape(scales, [m, nkb * nb, 1]))
    acc = None
    for kb in range(nkb):
        term = pypto.view(terms, [m, nb, FP8_BLOCK], [0, kb * nb, 0])
        acc = pypto.add(term, 0.0) if acc is None else pypto.add(acc, term)  # 0 + P*S first
    return pypto.cast(acc, pypto.DT_BF16)


def quant_blocks(pypto, v, u: int, k: int, floor: float):
    """``act_quant`` of BF16 ``v [u, k]`` per 128 values: ``(codes [u, k], scales [u, k/128,
    1])``."""
    pypto.set_vec_tile_shapes(u, min(k, BLOCK_TILE_VALUES // u))  # a 2-D tile for the 2-D cast
    v32 = pypto.cast(v, pypto.DT_FP32)
    pypto.set_vec_tile_shapes(*block_tile(u, k // FP8_BLOCK))
    v3 = pypto.reshape(v32, [u, k // FP8_BLOCK, FP8_BLOCK])
    codes, s = act_quant(pypto, v3, floor)
    return pypto.reshape(codes, [u, k]), s


def rotate_fwht(pypto, v2, stages, m: int):
    """``BF16(FWHT(v2) * FP32(128^-0.5))`` of BF16 ``v2 [m, 128]``: the butterfly stages as
    FP32 matmuls (module docstring)."""
    mt = min(m, 128)
    pypto.set_vec_tile_shapes(mt, DIM)
    y = pypto.cast(v2, pypto.DT_FP32)
    for s in range(STAGES):
        pypto.set_cube_tile_shapes([mt, mt], [DIM, DIM], [DIM, DIM])
        y = pypto.matmul(y, pypto.view(stages, [DIM, DIM], [s * DIM, 0]), pypto.DT_FP32)
    pypto.set_vec_tile_shapes(mt, DIM)
    return pypto.cast(pypto.mul(y, SOFTMAX_SCALE), pypto.DT_BF16)


def quant_rows(pypto, v, floor: float, m: int):
    """``act_quant`` of BF16 ``v [m, 128]`` per row: ``(codes E4M3 [m, 128], scales FP32 [m,
    1])``."""
    pypto.set_vec_tile_shapes(min(m, 64), DIM)
    return act_quant(pypto, pypto.cast(v, pypto.DT_FP32), floor)


def tables(pypto, ins, t0, u: int, ndim: int):
    """FP32 ``cos``/``sin`` of tokens ``t0 ..`` as halves tables ``[u, 1, 64]`` (``ndim`` 3) or
    ``[u, 64]``; a ``[T, 32]`` table (one angle per pair) is read twice, ``[c | c]``."""
    w = ins.cos.shape[1]
    pypto.set_vec_tile_shapes(1, ROPE_DIM)
    out = []
    for tab in (ins.cos, ins.sin):
        c = pypto.cast(pypto.view(tab, [u, w], [t0, 0]), pypto.DT_FP32)
        if w != ROPE_DIM:
            c = pypto.concat([c, pypto.mul(c, 1.0)], -1)
        out.append(pypto.reshape(c, [u, 1, ROPE_DIM]) if ndim == 3 else c)
    return out


def queries(pypto, ins, t0, u: int, p):
    """Q1-Q5 of ``u`` tokens ``t0 ..``: ``(codes E4M3 [u*64, 128], scales FP32 [u*64, 1])``."""
    qn = pypto.view(ins.q_norm, [u, ins.rank], [t0, 0])
    codes, sa = quant_blocks(pypto, qn, u, ins.rank, LINEAR_AMAX_FLOOR)
    q = linear_fp8(pypto, codes, sa, ins.w_qb, ins.w_qb_scale, u, QB_COLS)
    cos, sin = tables(pypto, ins, t0, u, 3)
    pypto.set_vec_tile_shapes(1, HEADS // 2, DIM)
    cat = rope_head(pypto, pypto.reshape(q, [u, HEADS, DIM]), cos, sin, HEADS)
    rot = rotate_fwht(pypto, pypto.reshape(cat, [u * HEADS, DIM]), ins.stages, u * HEADS)
    return quant_rows(pypto, rot, p.amax_floor, u * HEADS)


def keys(pypto, ins, t0, u: int, p):
    """K1-K5 of ``u`` tokens: ``(codes E4M3 [u, 128], scales FP32 [u, 1])``."""
    x = pypto.view(ins.x, [u, ins.hidden], [t0, 0])
    codes, sx = quant_blocks(pypto, x, u, ins.hidden, LINEAR_AMAX_FLOOR)
    k = linear_fp8(pypto, codes, sx, ins.w_k, ins.w_k_scale, u, DIM)
    pypto.set_vec_tile_shapes(u, DIM)
    k = layer_norm(pypto, ins, pypto.cast(k, pypto.DT_FP32), u, p.eps)
    cos, sin = tables(pypto, ins, t0, u, 2)
    pypto.set_vec_tile_shapes(u, DIM)
    cat = rope_head(pypto, k, cos, sin, u)
    return quant_rows(pypto, rotate_fwht(pypto, cat, ins.stages, u), p.amax_floor, u)


def encode_e4m3_bytes(pypto, codes, m: int):
    """INT8 ``[m, 128]``: the bytes of E4M3 ``codes`` (finite), from their exact FP32 values
    ``v``: ``|v| >= 2^-6``: ``8 (e + 7) + 8 (|v| / 2^e - 1)`` with ``2^e <= |v|`` the largest
    (an exponent ladder), else ``|v| * 2^9``; ``+128`` for a set sign bit (``-0`` too); as
    int8 (two's complement), through the INT8 kernel's exact INT32 -> FP16 -> INT8 chain."""
    pypto.set_vec_tile_shapes(min(m, 64), DIM)
    v = pypto.cast(codes, pypto.DT_FP32)
    a = pypto.abs(v)
    p = pypto.add(pypto.mul(a, 0.0), E4M3_MIN_NORMAL)
    e = pypto.add(pypto.mul(a, 0.0), -E4M3_BIAS + 1.0)  # log2(2^-6) = -6
    for b in E4M3_LADDER:
        cand = pypto.mul(p, float(2.0**b))
        ok = pypto.ge(a, cand)
        p = pypto.where(ok, cand, p)
        e = pypto.where(ok, pypto.add(e, float(b)), e)
    normal = pypto.add(pypto.mul(pypto.div(a, p), E4M3_MANT),
                       pypto.mul(pypto.add(e, E4M3_BIAS - 1.0), E4M3_MANT))  # fmt: skip
    byte = pypto.where(pypto.ge(a, E4M3_MIN_NORMAL), normal, pypto.mul(a, E4M3_SUB_STEP))
    byte = pypto.where(pypto.signbit(v), pypto.add(byte, -128.0), byte)  # 128 + b - 256
    c32 = pypto.cast(byte, pypto.DT_INT32, pypto.CastMode.CAST_RINT)
    c16 = pypto.cast(c32, pypto.DT_FP16, pypto.CastMode.CAST_ROUND)
    return pypto.cast(c16, pypto.DT_INT8, pypto.CastMode.CAST_TRUNC,
                      satmode=pypto.SaturationMode.ON)  # fmt: skip


def write_keys(pypto, ins, kbytes, scales, t0, u: int, p, pages):
    """KW: token ``t0 + i``'s code bytes to row ``block * code_rows + offset`` of the page
    bytes, its scale's 4 bytes to the scale run (byte ``128 * bs + 4 * offset`` of the page),
    ``block, offset = divmod(slot, bs)``; one 0/1-trip loop per token (slot -1: no trip)."""
    bs, rows = p.block_size, p.code_rows
    words_per_row = DIM // 4  # FP32 scale words per 128-byte row
    for i in range(u):
        slot = ins.slot_mapping[t0 + i]
        trips = (slot + 1).min(1)
        blk, off = slot // bs, slot % bs
        for _w in pypto.loop(0, trips, 1, name=f"IP8_WRITE{u}_{i}", idx_name=f"w{u}_{i}"):
            pypto.set_vec_tile_shapes(1, DIM)
            pypto.assemble(pypto.view(kbytes, [1, DIM], [i, 0]), [blk * rows + off, 0], pages)
            pypto.set_vec_tile_shapes(1, 32)  # a 32-byte tile shape; the tensor is [1, 4]
            four = pypto.view(pypto.view(scales, [1, 1], [i, 0]), dtype=pypto.DT_INT8)
            at = [blk * rows + bs + off // words_per_row, (off % words_per_row) * 4]
            pypto.assemble(four, at, pages)


def head_weights(pypto, ins, qs, t0, u: int, p):
    """W1: FP32 ``[u, 64]`` ``FP32(FP32(FP32(x @ w_proj) * 2^-3) * q_scale) * FP32(128^-0.5)``
    (``x`` widened exactly, the FP32 cube in K tiles of ``k_tile``)."""
    pypto.set_vec_tile_shapes(u, min(ins.hidden, 1024))
    x = pypto.cast(pypto.view(ins.x, [u, ins.hidden], [t0, 0]), pypto.DT_FP32)
    nt = HIDDEN_N_TILE
    pypto.set_cube_tile_shapes([16, 16], [p.k_tile, p.k_tile], [nt, nt])
    w = pypto.matmul(x, ins.w_proj, pypto.DT_FP32)
    pypto.set_vec_tile_shapes(u, HEADS)
    w = pypto.mul(pypto.mul(w, HEAD_SCALE), pypto.reshape(qs, [u, HEADS]))
    return pypto.mul(w, SOFTMAX_SCALE)


def prolog_nest(pypto, ins, outs, p):
    """The loop nest of the module docstring."""
    t = ins.x.shape[0]
    for t0, u in pypto.loop_unroll(0, t, 1, name="IP8_TOK", idx_name="t0",
                                   unroll_list=list(p.unroll)):  # fmt: skip
        qc, qsc = queries(pypto, ins, t0, u, p)
        write_queries(pypto, outs, qc, qsc, t0, 16)
        kc, ksc = keys(pypto, ins, t0, u, p)
        kbytes = encode_e4m3_bytes(pypto, kc, u)
        write_keys(pypto, ins, kbytes, ksc, t0, u, p, outs.pages)
        w = head_weights(pypto, ins, qsc, t0, u, p)
        pypto.set_vec_tile_shapes(u, HEADS)
        pypto.assemble(w, [t0, 0], outs.weights)


# ----------------------------------------------------------------------------- the kernel
def _source(pypto, ln_dtype, tab_dtype, tab_width: int):
    """The undecorated FP8 kernel for the LayerNorm parameters' and the RoPE tables' dtypes
    and the tables' width (64: halves tables; 32: one angle per pair)."""

    def ip_fp8(
        x: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # [T, H]
        q_norm: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_BF16),  # [T, R]
        w_qb: pypto.Tensor([pypto.STATIC, QB_COLS], pypto.DT_FP8E4M3),  # [R, 8192]
        w_qb_scale: pypto.Tensor([pypto.STATIC, QB_COLS // FP8_BLOCK], pypto.DT_FP32),
        w_k: pypto.Tensor([pypto.STATIC, DIM], pypto.DT_FP8E4M3),  # [H, 128]
        w_k_scale: pypto.Tensor([pypto.STATIC, 1], pypto.DT_FP32),  # [H/128, 1]
        w_proj: pypto.Tensor([pypto.STATIC, HEADS], pypto.DT_FP32),  # [H, 64]
        ln_gamma: pypto.Tensor([1, DIM], ln_dtype),  # [1, 128]
        ln_beta: pypto.Tensor([1, DIM], ln_dtype),  # [1, 128]
        cos: pypto.Tensor([pypto.DYNAMIC, tab_width], tab_dtype),  # [T, 64] or [T, 32]
        sin: pypto.Tensor([pypto.DYNAMIC, tab_width], tab_dtype),
        stages: pypto.Tensor([STAGES * DIM, DIM], pypto.DT_FP32),  # the FWHT's stages
        ones: pypto.Tensor([DIM, 16], pypto.DT_FP32),  # the row sums' ones columns
        slot_mapping: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),  # [T]
        q: pypto.Tensor([pypto.DYNAMIC, DIM], pypto.DT_FP8E4M3),  # [T*64, 128]
        q_scale: pypto.Tensor([pypto.DYNAMIC, 1], pypto.DT_FP32),  # [T*64, 1]
        weights: pypto.Tensor([pypto.DYNAMIC, HEADS], pypto.DT_FP32),  # [T, 64]
        pages: pypto.Tensor([pypto.STATIC, DIM], pypto.DT_INT8),  # page bytes, 128-byte rows
        params,
    ):
        _Args(dtypes=(ln_dtype, tab_dtype, tab_width))  # the closure's (annotations read them)
        ins = _Args(x=x, q_norm=q_norm, w_qb=w_qb, w_qb_scale=w_qb_scale, w_k=w_k,
                    w_k_scale=w_k_scale, w_proj=w_proj, ln_gamma=ln_gamma, ln_beta=ln_beta,
                    cos=cos, sin=sin, stages=stages, ones=ones, slot_mapping=slot_mapping,
                    hidden=x.shape[1], rank=q_norm.shape[1])  # fmt: skip
        outs = _Args(q=q, q_scale=q_scale, weights=weights, pages=pages)
        prolog_nest(pypto, ins, outs, params)

    return ip_fp8


_DTYPES = {"bfloat16": "DT_BF16", "float32": "DT_FP32"}


def build(params: Fp8Params, dtypes: tuple, static_dims: tuple, jit: tuple = JIT):
    """The jit kernel on this process's target, built once per (params, the LayerNorm
    parameters' and RoPE tables' dtype names, static dims = ``(H, R, page rows, table
    width)``, options) (:func:`tilesim.device.backend.compiled`); ``T`` and the slots are
    runtime values."""
    pypto = require_pypto()
    ln_dt, tab_dt = (getattr(pypto, _DTYPES[d]) for d in dtypes)
    return _backend.compiled_jit(
        "dsa_indexer_prolog", ("fp8", params.key, tuple(dtypes), tuple(static_dims)), jit,
        lambda: _source(pypto, ln_dt, tab_dt, static_dims[-1]),
        ready_on_host=READY_ON_HOST)  # fmt: skip


__all__ = [
    "LINEAR_AMAX_FLOOR",
    "Fp8Params",
    "build",
    "hadamard_stages",
]
