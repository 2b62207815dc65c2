"""The ``@pypto.frontend.jit`` kernel of the DeepSeek-V3.2 MLA prolog (op ``mla_prolog``), INT8
path (pypto-gym's ``mla_prolog_quant`` arithmetic, ``kv_split`` cache). The public op and its
host glue are :mod:`tilesim.device.mla_prolog`; the contract is :mod:`tilesim.shared.mla_prolog`;
the rounding points are ``docs/ops/mla_prolog.md`` ("Rounding points", INT8 path; "Kernel").

Loop nest (``T`` and every slot are runtime values; one compile per model config)::

    L0 token chunks of U rows   pypto.loop over T / U (U = chunk_rows(T); T padded to U)
       C1  x [U, 7168] @ [w_dq | w_dkv_kr]    one BF16 matmul per weight, the whole K in one
                                             sum (FP32, one rounding), BF16 out
       V1  RMSNorm of q_a (row sum: an FP32 matmul with a ones column, one rounding);
           per-token INT8 quant -> q_norm, q_norm_scale (written)
       C2  q_norm [U, 1536] @ w_uq_qr INT8 -> INT32 (exact), dequant by token and channel, BF16,
           (U <= 16: as two tensors, q_nope [U, 128, 128] and q_pe [U, 128, 64]: dequant_heads)
       C3  absorption: per head q_nope [U, 128] @ w_uk[h] (transposed batch matmul), BF16
       V2  RoPE of the query's rope part and of kv_a[:, 512:] ("deinterleave": transposes)
       V3  RMSNorm of kv_a[:, :512]; INT8 quant per group of 128 -> codes, 4 FP32 scales
       W   per token t of the chunk: a loop of (slot_mapping[t] >= 0) trips (0 or 1) that
           assembles the token's codes / rope / scales into cache row slot_mapping[t]
           (slot -1: no trip, nothing written; every other row keeps its bytes)

Why these shapes: the interpreter sums a matmul's K in one float64 sum rounded once to FP32
when no K step is set (``docs/device.md``, "A deterministic interpreter"), which is the golden's
``matmul_fp32(k_tile=None)``; ``pypto.sum`` is libtorch's FP32 reduction, whose order no golden
states, so the norms' row sums are matmuls too. Private; importing it needs neither torch nor
pypto.
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto
from tilesim.shared.casts import INT8_QMAX
from tilesim.shared.layouts.mla_cache import NOPE, NSCALES, ROPE
from tilesim.shared.mla_prolog import HEADS, HIDDEN, KV_A, Q_HEAD, Q_LORA, QK_NOPE

#: columns of the ones matrix the norms' row sums multiply by (one cube N tile; column 0 used)
SUM_COLS = 16
#: the jit options: PyPTO's DeepSeek prolog example's stitch limit and 910B scheduling mode 2
#: (hicann/pypto ``models/deepseek_v32_exp/mla_prolog_quant_impl.py`` ``options_list``); an
#: L1 reuse of 1: without it the compiler packs every N tile of a matmul that shares the ``x``
#: tile into one cube task, so ``x @ w_dq`` ran on one or two cores;
#: and, for chunks of at most 16 tokens, the example's cube n-buffer of 4 outside scopes 0 and
#: 1 (C1 keeps one task per N tile), which packs C2's and C3's tasks four to one (96 -> 24 and
#: 256 -> 64); at T = 128 it costs more, so larger chunks build with :data:`JIT_LARGE_CHUNK`
#: (the measured figures: docs/ops/mla_prolog.md#kernel)
JIT_LARGE_CHUNK = (
    ("runtime", "stitch_function_max_num", 128),
    ("runtime", "device_sched_mode", 2),
    ("pass", "cube_l1_reuse_setting", ((-1, 1),)),
)
JIT = (*JIT_LARGE_CHUNK, ("pass", "cube_nbuffer_setting", ((-1, 4), (0, 1), (1, 1))))
#: the largest chunk built with :data:`JIT`
NBUFFER_MAX_CHUNK = 16
#: INT8 kernel, chunks of :data:`ABSORB_CHUNK` tokens: the absorption's (C3's) group of 256
#: same-shape cube tasks merged per SoC into one wave instead of :data:`JIT`'s 64 tasks (three
#: waves on 24 / 28 cores): ``(hash order, tasks merged)`` of that group, found in the cost
#: model's trace (the order numbers the compiler's groups of same-shape subgraphs and differs
#: between the 910B's and the 950's pass pipelines; C2 is order 3 / 4; figures:
#: docs/ops/mla_prolog.md#kernel). Other chunks build a different graph, whose orders were not
#: measured: they keep :data:`JIT`.
ABSORB_MERGE = {"910b": (4, 11), "950": (5, 10)}
ABSORB_CHUNK = 8
READY_ON_HOST = ("slots",)
#: cube tiles ``([m0, m1], [k0, k1], [n0, n1])`` of C1 (``x @ w_dq``, ``x @ w_dkv_kr``), C2
#: (``q_norm @ w_uq_qr``) and C3 (the absorption); they change the cost model's tasks, never
#: a bit (the interpreter sums each matmul's K at once). N tiles of 64 give ``x @ w_dq`` one
#: task per core (24); K1 tiles of 1024 / the whole 1536 copy each weight slab into L1 in one
#: piece (the model charges a fixed latency per copy, whatever its size); C2's 256-wide N tiles
#: halve its tasks (docs/ops/mla_prolog.md#kernel)
C1_TILES = ([16, 16], [256, 1024], [64, 64])
C2_TILES = ([16, 16], [256, 1536], [256, 256])
C3_TILES = ([16, 16], [128, 128], [256, 512])
SUM_TILES = ([16, 16], [512, 1536], [SUM_COLS, SUM_COLS])
GROUP = NOPE // NSCALES  # 128 latent values per scale
#: heads per vector tile of the ``q_nope`` dequant (``q_pe``: twice as many): 8 x 8 x 128
#: FP32 values, 32 KB, as the 2-D dequant's 8 x 1024 tiles were
DEQUANT_HEADS = 8
#: the largest token chunk (the cube's M tile at most 128 rows)
MAX_CHUNK = 128
L0A_BYTES = 65536  # the cube's left-operand buffer (the compiler refuses a larger A tile)


class MlaParams:
    """Static (trace-time) parameters of one build; ``repr`` keys pypto's compiled-kernel
    cache. ``rms_form``: ``"gym_golden"`` (``x / sqrt(m + eps)``) or ``"gym_kernel"`` (``x *
    (1 / sqrt(m + eps))``); ``rms_eps``: FP32 value; ``chunk``: tokens per trip of the token
    loop (:func:`chunk_rows`)."""

    def __init__(self, *, rms_form, rms_eps, chunk=8):
        self.rms_form, self.rms_eps, self.chunk = rms_form, float(rms_eps), int(chunk)

    @property
    def key(self) -> tuple:
        return ("int8", "kv_split", self.rms_form, self.rms_eps, self.chunk)

    def __repr__(self) -> str:
        return "MlaParams(path={}, cache={}, rms_form={}, rms_eps={}, chunk={})".format(*self.key)


def chunk_rows(tokens: int) -> int:
    """Tokens per trip of the token loop for ``tokens`` new tokens: the power of two at or
    above it, at most :data:`MAX_CHUNK` (one trip reads every weight once; the wrapper pads
    ``T`` to a multiple with rows it discards, slot -1). One build per doubling of ``T``."""
    return min(MAX_CHUNK, 1 << max(int(tokens) - 1, 0).bit_length())


def row_tile(u: int) -> int:
    """Rows of the vector tiles of a ``u``-token chunk (a 1536-wide FP32 row tile stays in
    48 KB of the unified buffer)."""
    return min(u, 8)


def cube_tiles(tiles: tuple, u: int, a_bytes: int = 2) -> tuple:
    """``tiles`` with the M tiles set for a ``u``-row chunk (16 .. 128, a multiple of 16);
    above 16 rows the L1 K tile shrinks to the L0 one and the L0 K tile to what a 64 KB L0A
    holds of ``[m, k]`` elements of ``a_bytes`` (the A tile grows with M)."""
    m = min(MAX_CHUNK, max(16, -(-u // 16) * 16))
    if m == 16:
        return ([m, m], *tiles[1:])
    k0 = min(tiles[1][0], L0A_BYTES // (m * a_bytes))
    return ([m, m], [k0, k0], tiles[2])


# ----------------------------------------------------------------------------- stages
def row_sum(pypto, t, ones, u: int):
    """FP32 ``[u, 1]`` row sums of FP32 ``t [u, n]``: ``t @ ones`` (an FP32 matmul, the exact
    sum rounded once, as the golden's ``rowsum_fp32``); column 0 of the ``[u, 16]`` product."""
    n = t.shape[1]
    pypto.set_cube_tile_shapes(*cube_tiles(SUM_TILES, u, 4))
    s = pypto.matmul(t, pypto.view(ones, [n, SUM_COLS], [0, 0]), pypto.DT_FP32)
    pypto.set_vec_tile_shapes(row_tile(u), SUM_COLS)
    return pypto.view(s, [u, 1], [0, 0])


def rms_norm(pypto, v, gamma, ones, u: int, p):
    """BF16 ``rms_norm(v) * gamma`` of BF16 ``v [u, n]`` (``gamma`` FP32 ``[1, n]``): ``m =
    rowsum(FP32(v*v) * FP32(1/n))``, ``root = sqrt(m + eps)``, then ``v / root``
    (``"gym_golden"``) or ``v * FP32(1 / root)`` (``"gym_kernel"``), times gamma, BF16."""
    n = v.shape[1]
    pypto.set_vec_tile_shapes(row_tile(u), n)
    x = pypto.cast(v, pypto.DT_FP32)
    sq = pypto.mul(pypto.mul(x, x), 1.0 / n)
    m = row_sum(pypto, sq, ones, u)
    pypto.set_vec_tile_shapes(row_tile(u), 1)
    root = pypto.sqrt(pypto.add(m, p.rms_eps))
    pypto.set_vec_tile_shapes(row_tile(u), n)
    if p.rms_form == "gym_golden":
        y = pypto.div(x, root)
    else:
        pypto.set_vec_tile_shapes(row_tile(u), 1)
        inv = pypto.div(pypto.full([u, 1], 1.0, pypto.DT_FP32), root)
        pypto.set_vec_tile_shapes(row_tile(u), n)
        y = pypto.mul(x, inv)
    return pypto.cast(pypto.mul(y, gamma), pypto.DT_BF16)


def quant_int8(pypto, v, rows: int, group: int):
    """pypto-gym's INT8 quant of BF16 / FP32 ``v [rows, group]`` per row: ``s =
    FP32(FP32(1/amax) * 127)``, codes ``int8(trunc(fp16(int32(rint(v * s)))))`` (saturating),
    dequant scale ``FP32(1/s)`` -> ``(codes INT8 [rows, group], scales FP32 [rows, 1])``."""
    rt = min(rows, max(8, 4096 // group))  # rows of a tile: at most 16 KB of FP32
    pypto.set_vec_tile_shapes(rt, group)
    x = pypto.cast(v, pypto.DT_FP32)
    amax = pypto.amax(pypto.abs(x), -1, keepdim=True)
    pypto.set_vec_tile_shapes(rt, 1)
    one = pypto.full([rows, 1], 1.0, pypto.DT_FP32)
    s = pypto.mul(pypto.div(one, amax), float(INT8_QMAX))
    scale = pypto.div(pypto.full([rows, 1], 1.0, pypto.DT_FP32), s)
    pypto.set_vec_tile_shapes(rt, group)
    y = pypto.cast(pypto.mul(x, s), pypto.DT_INT32, pypto.CastMode.CAST_RINT)
    y = pypto.cast(y, pypto.DT_FP16, pypto.CastMode.CAST_ROUND)
    codes = pypto.cast(y, pypto.DT_INT8, pypto.CastMode.CAST_TRUNC,
                       satmode=pypto.SaturationMode.ON)  # fmt: skip
    return codes, scale


def rope_deinterleave(pypto, v, cos, sin, lead: list):
    """RoPE ``"deinterleave"`` of BF16 ``v [*lead, 64]`` with FP32 ``cos``/``sin`` broadcast
    over ``lead[1:]``: ``v' = [v0, v2, .., v62, v1, .., v63]`` (FP32), ``v'*cos +
    cat(-v'[32:], v'[:32])*sin`` (one FP32 rounding per product and per add), BF16, the output
    left de-interleaved."""
    half, d = ROPE // 2, len(lead)
    flat = [1] * (d - 1) + [min(lead[-1], 64)]  # the elementwise tiles: whole 64-wide rows
    pypto.set_vec_tile_shapes(*flat, ROPE)
    x = pypto.cast(v, pypto.DT_FP32)
    pypto.set_vec_tile_shapes(*flat, 128, 128)  # the pair transpose (last dims padded)
    pairs = pypto.reshape(x, [*lead, half, 2])
    x = pypto.reshape(pypto.transpose(pairs, d, d + 1), [*lead, ROPE])
    pypto.set_vec_tile_shapes(*flat, ROPE)
    lo = pypto.view(x, [*lead, half], [0] * (d + 1))
    hi = pypto.view(x, [*lead, half], [0] * d + [half])
    rot = pypto.concat([pypto.mul(hi, -1.0), pypto.add(lo, 0.0)], -1)
    return pypto.cast(pypto.add(pypto.mul(x, cos), pypto.mul(rot, sin)), pypto.DT_BF16)


def query_stage(pypto, ins, x, t0, u: int, p):
    """``q_a`` -> norm -> INT8 ``q_norm`` (written) -> ``q_b`` -> ``query_nope`` and
    ``query_rope`` (written) for the chunk's ``u`` tokens ``t0 ..``."""
    pypto.set_cube_tile_shapes(*cube_tiles(C1_TILES, u))
    q_a = pypto.matmul(x, ins.w_dq, pypto.DT_BF16)  # [u, 1536]
    qn = rms_norm(pypto, q_a, ins.gamma_cq, ins.ones, u, p)
    codes, qs = quant_int8(pypto, qn, u, Q_LORA)
    pypto.set_vec_tile_shapes(row_tile(u), Q_LORA)
    pypto.assemble(codes, [t0, 0], ins.q_norm)
    pypto.set_vec_tile_shapes(row_tile(u), 1)
    pypto.assemble(qs, [t0, 0], ins.q_norm_scale)
    pypto.set_cube_tile_shapes(*cube_tiles(C2_TILES, u))
    acc = pypto.matmul(codes, ins.w_uq_qr, pypto.DT_INT32)  # [u, 24576], exact
    if u <= NBUFFER_MAX_CHUNK:
        q_b = dequant_heads(pypto, ins, acc, qs, u)
    else:  # one q_b [u, HEADS, Q_HEAD] (at T = 128 the two parts cost more)
        pypto.set_vec_tile_shapes(row_tile(u), 1024)
        q_b = pypto.mul(pypto.mul(pypto.cast(acc, pypto.DT_FP32), qs), ins.w_scale)
        q_b = pypto.reshape(pypto.cast(q_b, pypto.DT_BF16), [u, HEADS, Q_HEAD])

    def rope(q_pe):
        cos = pypto.reshape(pypto.view(ins.cos, [u, ROPE], [t0, 0]), [u, 1, ROPE])
        sin = pypto.reshape(pypto.view(ins.sin, [u, ROPE], [t0, 0]), [u, 1, ROPE])
        return rope_deinterleave(pypto, q_pe, cos, sin, [u, HEADS])

    query_heads(pypto, ins, q_b, t0, u, rope)


def dequant_heads(pypto, ins, acc, qs, u: int):
    """``q_b = BF16(FP32(FP32(acc) * qs) * w_scale)`` of INT32 ``acc [u, HEADS * Q_HEAD]``
    (``qs`` FP32 ``[u, 1]``), computed per head part into two tensors: ``q_nope`` BF16
    ``[u, HEADS, QK_NOPE]`` and ``q_pe`` BF16 ``[u, HEADS, ROPE]`` (the golden's products, in
    its order). Each part is its own contiguous tensor, so the absorption reads ``q_nope`` as
    it is (a view of one ``q_b`` cost a copy task between the dequant and C3); ``qs`` is
    widened to ``[u, HEADS, 1]`` first (off the critical path: PyPTO 0.2.0 broadcasts an
    operand along one axis only). Used for chunks up to :data:`NBUFFER_MAX_CHUNK` tokens."""
    pypto.set_vec_tile_shapes(row_tile(u), HEADS)
    qs3 = pypto.reshape(pypto.expand_clone(qs, [u, HEADS]), [u, HEADS, 1])
    acc = pypto.reshape(acc, [u, HEADS, Q_HEAD])
    w_scale = pypto.reshape(ins.w_scale, [1, HEADS, Q_HEAD])

    def part(width: int, offset: int, heads: int):
        pypto.set_vec_tile_shapes(row_tile(u), heads, width)
        v = pypto.cast(pypto.view(acc, [u, HEADS, width], [0, 0, offset]), pypto.DT_FP32)
        s = pypto.view(w_scale, [1, HEADS, width], [0, 0, offset])
        return pypto.cast(pypto.mul(pypto.mul(v, qs3), s), pypto.DT_BF16)

    return part(QK_NOPE, 0, DEQUANT_HEADS), part(ROPE, QK_NOPE, 2 * DEQUANT_HEADS)


def query_heads(pypto, ins, q_b, t0, u: int, rope):
    """BF16 ``q_b [u, HEADS, Q_HEAD]`` -> ``query_nope`` (its nope part absorbed by ``w_uk``,
    a transposed batch matmul) and ``query_rope`` (``rope(q_pe)``), both written at ``t0``;
    shared by the INT8 and FP8 kernels. ``q_b`` may also be the pair ``(q_nope [u, HEADS,
    QK_NOPE], q_pe [u, HEADS, ROPE])`` (the INT8 kernel's :func:`dequant_heads`)."""
    parts = q_b if isinstance(q_b, tuple) else None
    q_nope = parts[0] if parts else pypto.view(q_b, [u, HEADS, QK_NOPE], [0, 0, 0])
    pypto.set_cube_tile_shapes(*cube_tiles(C3_TILES, u))
    nope = pypto.experimental.transposed_batchmatmul(q_nope, ins.w_uk, pypto.DT_BF16)
    pypto.set_vec_tile_shapes(min(u, 8), 16, NOPE)
    pypto.assemble(nope, [t0, 0, 0], ins.query_nope)
    pypto.set_vec_tile_shapes(1, 64, ROPE)
    q_rope = rope(parts[1] if parts else pypto.view(q_b, [u, HEADS, ROPE], [0, 0, QK_NOPE]))
    pypto.set_vec_tile_shapes(min(u, 8), 16, ROPE)
    pypto.assemble(q_rope, [t0, 0, 0], ins.query_rope)


def latent_stage(pypto, ins, x, t0, u: int, p):
    """``kv_a`` -> normed latent -> INT8 codes and 4 scales; ``kv_a[:, 512:]`` -> RoPE; then the
    cache writes of the chunk's tokens (module docstring, W)."""
    pypto.set_cube_tile_shapes(*cube_tiles(C1_TILES, u))
    kv_a = pypto.matmul(x, ins.w_dkv_kr, pypto.DT_BF16)  # [u, 576]
    pypto.set_vec_tile_shapes(row_tile(u), ROPE)
    cos = pypto.view(ins.cos, [u, ROPE], [t0, 0])
    sin = pypto.view(ins.sin, [u, ROPE], [t0, 0])
    kr = rope_deinterleave(pypto, pypto.view(kv_a, [u, ROPE], [0, NOPE]), cos, sin, [u])
    kvn = rms_norm(pypto, pypto.view(kv_a, [u, NOPE], [0, 0]), ins.gamma_ckv, ins.ones, u, p)
    codes, scales = quant_int8(pypto, pypto.reshape(kvn, [u * NSCALES, GROUP]), u * NSCALES,
                               GROUP)  # fmt: skip
    pypto.set_vec_tile_shapes(row_tile(u), NOPE)
    codes = pypto.reshape(codes, [u, NOPE])
    scales = pypto.reshape(scales, [u, NSCALES])
    write_rows(pypto, ins, t0, u, (codes, kr, scales))


def write_rows(pypto, ins, t0, u: int, fields):
    """Each token ``t0 + i`` of the chunk: ``slots[t0 + i] >= 0`` trips (0 or 1) of a loop that
    assembles its row of each field into that cache row."""
    caches = (ins.kv_cache, ins.kr_cache, ins.kv_scale_cache)
    for i in range(u):
        slot = ins.slots[t0 + i]
        for _w in pypto.loop(0, (slot + 1).min(1), 1, name=f"MLA_W{u}_{i}", idx_name=f"w{i}"):
            for field, cache in zip(fields, caches, strict=True):
                width = field.shape[1]
                pypto.set_vec_tile_shapes(1, max(width, 32))  # >= one 32-byte block
                pypto.assemble(pypto.view(field, [1, width], [i, 0]), [slot, 0], cache)


def chunk_loop(pypto, ins, p, name: str, body):
    """The token loop of both kernels: ``body(x, t0, u)`` per chunk of ``u = p.chunk`` tokens
    from ``t0``, ``x`` the chunk's BF16 ``[u, HIDDEN]`` view (``T`` a multiple of ``p.chunk``:
    the wrapper pads)."""
    u = p.chunk
    for c in pypto.loop(0, ins.x.shape[0] // u, 1, name=name, idx_name="c"):
        t0 = c * u
        pypto.set_vec_tile_shapes(row_tile(u), 512)
        body(pypto.view(ins.x, [u, HIDDEN], [t0, 0]), t0, u)


def prolog_nest(pypto, ins, p):
    """The loop nest of the module docstring."""

    def body(x, t0, u):
        query_stage(pypto, ins, x, t0, u, p)
        latent_stage(pypto, ins, x, t0, u, p)

    chunk_loop(pypto, ins, p, "MLA_T", body)


class _Inputs:
    """The kernel's tensors as the nest reads them."""

    def __init__(self, **tensors):
        self.__dict__.update(tensors)


def _source(pypto):
    """The undecorated INT8 kernel source."""

    def mla_prolog_int8(
        x: pypto.Tensor([pypto.DYNAMIC, HIDDEN], pypto.DT_BF16),  # [T, 7168]
        w_dq: pypto.Tensor([HIDDEN, Q_LORA], pypto.DT_BF16),
        w_uq_qr: pypto.Tensor([Q_LORA, HEADS * Q_HEAD], pypto.DT_INT8),
        w_scale: pypto.Tensor([1, HEADS * Q_HEAD], pypto.DT_FP32),
        w_uk: pypto.Tensor([HEADS, QK_NOPE, NOPE], pypto.DT_BF16),
        w_dkv_kr: pypto.Tensor([HIDDEN, KV_A], pypto.DT_BF16),
        gamma_cq: pypto.Tensor([1, Q_LORA], pypto.DT_FP32),
        gamma_ckv: pypto.Tensor([1, NOPE], pypto.DT_FP32),
        cos: pypto.Tensor([pypto.DYNAMIC, ROPE], pypto.DT_FP32),  # [T, 64]
        sin: pypto.Tensor([pypto.DYNAMIC, ROPE], pypto.DT_FP32),
        slots: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),  # [T], -1: no write
        ones: pypto.Tensor([Q_LORA, SUM_COLS], pypto.DT_FP32),
        query_nope: pypto.Tensor([pypto.DYNAMIC, HEADS, NOPE], pypto.DT_BF16),
        query_rope: pypto.Tensor([pypto.DYNAMIC, HEADS, ROPE], pypto.DT_BF16),
        q_norm: pypto.Tensor([pypto.DYNAMIC, Q_LORA], pypto.DT_INT8),
        q_norm_scale: pypto.Tensor([pypto.DYNAMIC, 1], pypto.DT_FP32),
        kv_cache: pypto.Tensor([pypto.STATIC, NOPE], pypto.DT_INT8),  # [rows, 512]
        kr_cache: pypto.Tensor([pypto.STATIC, ROPE], pypto.DT_BF16),  # [rows, 64]
        kv_scale_cache: pypto.Tensor([pypto.STATIC, NSCALES], pypto.DT_FP32),  # [rows, 4]
        params,
    ):
        ins = _Inputs(x=x, w_dq=w_dq, w_uq_qr=w_uq_qr, w_scale=w_scale, w_uk=w_uk,
                      w_dkv_kr=w_dkv_kr, gamma_cq=gamma_cq, gamma_ckv=gamma_ckv, cos=cos,
                      sin=sin, slots=slots, ones=ones, query_nope=query_nope,
                      query_rope=query_rope, q_norm=q_norm, q_norm_scale=q_norm_scale,
                      kv_cache=kv_cache, kr_cache=kr_cache,
                      kv_scale_cache=kv_scale_cache)  # fmt: skip
        prolog_nest(pypto, ins, params)

    return mla_prolog_int8


def int8_jit(chunk: int, soc: str) -> tuple:
    """The INT8 kernel's jit options for ``chunk``-token chunks on ``soc``: :data:`JIT` (with
    the absorption merged as :data:`ABSORB_MERGE` for :data:`ABSORB_CHUNK` tokens) up to
    :data:`NBUFFER_MAX_CHUNK` tokens, else :data:`JIT_LARGE_CHUNK`."""
    if chunk > NBUFFER_MAX_CHUNK:
        return JIT_LARGE_CHUNK
    if chunk != ABSORB_CHUNK:
        return JIT
    *head, (_pass, name, merges) = JIT
    return (*head, (_pass, name, (*merges, ABSORB_MERGE[soc])))


def build(params: MlaParams, static_dims: tuple, jit: tuple | None = None):
    """The jit kernel on this process's target, built once per (params, static dims = cache
    rows, options) (:func:`tilesim.device.backend.compiled`); ``T`` and the slots are runtime
    values. ``jit``: the options (default :func:`int8_jit` for the chunk on this process's
    target)."""
    if jit is None:
        jit = int8_jit(params.chunk, _backend.npu_soc())
    return _backend.compiled_jit(
        "mla_prolog", (params.key, tuple(static_dims)), jit,
        lambda: _source(require_pypto()), ready_on_host=READY_ON_HOST)  # fmt: skip


__all__ = [
    "JIT",
    "JIT_LARGE_CHUNK",
    "READY_ON_HOST",
    "MlaParams",
    "build",
    "chunk_rows",
    "int8_jit",
]
