"""PyPTO kernels of DeepSeek-V3.2 sparse MLA attention over a quantized latent cache.

Imported lazily by :mod:`tilesim.device.dsa` (this module imports pypto at the top).
The public entry points, argument checks and the CPU/NPU launch live there; this module holds
the tensor programs only. Contract, options and measured figures: ``docs/ops/dsa.md#kernel``
"DeepSeek sparse attention kernels".

One loop nest serves every cache form (:func:`attention_nest`)::

    L0 b < B                       act = kv_act_seqs[b]
    L1 s < s1                      cur_seq = min(max(act - s1 + 1 + s, 0), topk)
                                   bn = ceil(cur_seq / s_kv_tile)
    L2 n < n_kv                    (n_kv = 1)
    L3 g < nq / g_tile             rows row0 .. row0 + g_tile - 1 of query/out
      L4z  (1 - min(bn, 1)) trips  cur_seq = 0: write zeros (the seeds' kernels write nothing)
      L4 t < bn                    KV tile of s_kv_tile top-k columns, `valid` of them used
          V0  gather + dequant     kn = BF16(FP32(q) * scale_g) [valid, 512], kr BF16 [valid, 64]
          C1  S = Q @ [kn|kr]^T    FP32 [g_tile, valid]; Q = a view of the [T*nq, 576] query
          V1  S *= scale; [masked: S = -3e38 at skipped entries, a select]; m = rowmax
              [masked: m = max(m, -1e30)]; P = exp(S - m); l = rowsum(P)
          C2  online:   O_t = BF16(P) @ kn (FP32)
              per_tile: O_t = BF16(BF16(P / l) @ kn)
          V2  first / middle / last merge (pypto.cond on is_loop_begin / is_loop_end)

Online softmax, ``kv_splits = 1``, at most ``UNROLL_TILES`` tiles (the decode preset: 4):
L4 is unrolled at trace time (:func:`unrolled_tiles`): tile ``t`` runs in a 0/1-trip loop
(``t < bn``) and leaves its raw ``(O_t, l_t, m_t)`` in its own FP32 tensors, and V2 becomes
the fold of the tiles in tile order after them (:func:`fold_tiles`, the merge tree of
:mod:`tilesim.device._pypto_common` as in the MSA kernels): one task computes the
merge coefficients ``a_t, c_t`` and ``L`` from the tiles' ``(l, m)`` (ready after V1, so
while the C2 matmuls run), then one task per column block folds ``O = O*a + O_t*c`` and
writes ``BF16(O / L)``: merge_online's expressions in its order (same bits), but one
dependent task after the last C2 instead of two per merged tile.

Split-KV (``kv_splits > 1``, online; :func:`split_tiles`): L4 becomes one loop per split
``j`` (unrolled at trace time) over tiles ``j*tps ..``, each merging into its own FP32 state
``(O, L, M)``; then the combine: the same fold (:func:`fold_tiles`) over the
``ceil(bn / tps)`` non-empty splits' states in split order (an empty split is never read;
none when ``cur_seq = 0``), which writes ``BF16(O / L)``. The query is ONE ``[T*nq, 576]``
tensor (the wrapper concatenates ``query_nope`` and ``query_rope``) so that C1 reads Q from
an input: a Q assembled per group tile was a task with ~129 successor edges whose
resolution stalled the schedule (docs/ops/dsa.md#kernel).
The matmul-only probe of the same tiles is ``tests/probes/dsa_probe.py`` (not installed).

The V0 stage differs per cache form (``load_*`` below). Where PyPTO 0.2.0 cannot express the
seeds' formulation, the replacement is used on every target (sim and NPU) and documented at the
function: FP8 bytes cannot be reinterpreted (``view(dtype=)`` rejects FP8 on either side in the
ReplaceTensor pass), so the packed FP8 cache is passed twice, as FP8 and as INT8 bytes of the
same memory (:func:`load_packed_fp8`); ``clone`` of a byte-reinterpreted BF16 view breaks the
DAV_3510 code generator, so the rope part is copied as ``BF16(FP32(kr))`` (exact for every BF16
value including -0; NaN stays NaN; :func:`assemble_keys`). The whole V0 stage of a tile is one
manual subgraph scope on row tiles of ``V0_ROWS`` keys (:func:`load_keys`): one task per row
tile, with the dequant done per 128-column group straight into K (no reshape).
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
import pypto
from pypto.experimental import gather_in_ub
from tilesim.device._pypto_common import (
    combine_axis,
    eval_tree,
    fold_stats,
    merge_chunk,
    merge_tree,
    replaced,
)
from tilesim.device.backend import compiled_jit

# online, kv_splits = 1: tokens of up to UNROLL_TILES tiles fold once (also the split cap)
from tilesim.shared.layouts.dsa_split_rule import UNROLL_TILES

# the cache's byte layouts: the kernel-facing views of tilesim.shared.layouts.mla_cache, as module
# ints
from tilesim.shared.layouts.mla_cache import (
    KV_SPLIT_VIEW,
    NOPE,
    NSCALES,
    ROPE,
    SCALE_GROUP,
    packed_row_view,
)
from tilesim.shared.layouts.mla_cache import PYPTO_ROW_BYTES as ROW_BYTES  # a packed row in GM

_ROW = packed_row_view("pypto")  # the sizes, equal in both layouts (offsets: NestParams)
HEAD = NOPE + ROPE  # query / key width: nope + rope values
GROUP = SCALE_GROUP  # latent values per FP32 scale
NOPE_BYTES = _ROW.nope_bytes  # the nope run, first in every packed layout (one byte per value)
UB_PITCH = _ROW.ub_pitch  # a packed row padded to the UB alignment (the seeds' pitch)
TAIL_BYTES = _ROW.tail_bytes  # rope + scales of a packed row, after the nope run
TAIL_PITCH = _ROW.tail_pitch  # the tail padded to the UB alignment
ROPE_BYTES = _ROW.rope_bytes  # the rope run (BF16)
SCALE_BYTES = _ROW.scale_bytes  # the scales run (FP32)
SCALE_PITCH = KV_SPLIT_VIEW.scale_pitch  # FP32 columns of a kv_split scale row in UB
#: keys per V0 row tile = per V0 task (load_keys): every task costs the device a fixed dispatch
#: + completion overhead and every dependency edge a resolution (docs/ops/dsa.md#kernel). 64-row
#: tasks
#: compile within both SoCs' UB; 32 and 128 rows measured slower (128 on the 910B)
V0_ROWS = 64
#: the manual subgraph scope (``set_pass_options(sg_set_scope=)``) of the V0 stage
V0_SCOPE = 13
MASK_BIAS = 3.0e38  # -MASK_BIAS is selected as the score of skipped entries (masked builds)
NEG_INF = float("-inf")  # the other columns' fill of coef_column: the max's identity
MASK_FLOOR = 1.0e30  # row max of an all-skipped tile is clamped to -MASK_FLOOR (masked builds)
SCOPE_COEF = 20  # sg_set_scope of the fold's coefficient task (fold_coefficients)
SCOPE_FOLD = 21  # sg_set_scope of the fold's first column block (then 22, 23, ..; fold_outputs)
FOLD_UB = 128 * 1024  # bytes of O tiles one fold task may hold (fold_width)


class NestParams:
    """Static (trace-time) parameters of one kernel build: plain Python values.

    Its ``repr`` lists every value: pypto's jit keys its compiled-kernel cache on ``str()`` of
    the non-tensor arguments, so equal parameters reuse a compiled kernel and different ones
    never collide."""

    def __init__(
        self, *, nq, n_kv, softmax_scale, topk, block_size, tile, online, quant, layout, mask_col0,
        kv_splits=1, tiles_per_split=None, combine_axis=True,
    ):  # fmt: skip
        self._key = (nq, n_kv, repr(softmax_scale), topk, block_size, repr(tile), online, quant)
        self._key += (layout, mask_col0, kv_splits, tiles_per_split, bool(combine_axis))
        self.nq = nq
        self.n_kv = n_kv
        self.softmax_scale = softmax_scale
        self.topk = topk
        self.block_size = block_size
        self.g_tile = tile[0]
        self.s_kv_tile = tile[1]
        self.c1 = tile[2]
        self.v1 = tile[3]
        self.c2 = tile[4]
        self.v2 = tile[5]
        self.online = online
        self.quant = quant  # "int8" or "fp8"
        # byte offsets inside a packed row and inside its tail (tilesim.shared.layouts.mla_cache)
        row = packed_row_view(layout)
        self.rope_off, self.scale_off = row.rope_off, row.scale_off
        self.tail_rope_off, self.tail_scale_off = row.tail_rope_off, row.tail_scale_off
        # masked builds: topk_indices columns mask_col0.. hold 1 at skipped (-1) entries
        self.mask_col0 = mask_col0
        self.masked = mask_col0 is not None
        # split-KV: kv_splits ranges of tiles_per_split KV tiles
        # (tilesim.shared.layouts.dsa_split_rule)
        self.kv_splits = kv_splits
        self.tps = tiles_per_split
        # the jit spec's combine_axis operation option (set in the kernel body)
        self.combine_axis = bool(combine_axis)

    @property
    def key(self) -> tuple:
        """Every static value: the compile key (:func:`build`)."""
        return self._key

    def __repr__(self) -> str:
        names = ("nq", "n_kv", "scale", "topk", "block_size", "tile", "online", "quant", "layout")
        names += ("mask_col0", "kv_splits", "tiles_per_split", "combine_axis")
        return (
            "NestParams("
            + ", ".join(f"{n}={v}" for n, v in zip(names, self._key, strict=True))
            + ")"
        )


# ----------------------------------------------------------------------------- V0 loaders
# V0 of a KV tile -- the gathers, the FP8 / INT8 -> FP32 casts, the dequant multiply, the BF16
# casts into K and the rope copy -- is built on row tiles of V0_ROWS keys and placed in one
# manual subgraph scope (load_keys), so the partitioner makes ONE task per row tile out of it
# (s_kv_tile / V0_ROWS tasks per KV tile, each a successor of the root's entry task and a
# predecessor of the C1 / C2 tasks that read its rows). docs/ops/dsa.md#kernel


def int8_to_fp32(q8):
    """INT8 -> FP32 through FP16 (both steps exact; the seeds' path)."""
    return pypto.cast(pypto.cast(q8, pypto.DT_FP16), pypto.DT_FP32)


def to_fp32(q, p):
    """The quantized latent values (INT8 or FP8 E4M3) as FP32 (exact)."""
    return int8_to_fp32(q) if p.quant == "int8" else pypto.cast(q, pypto.DT_FP32)


def load_packed_int8(cache, idx, bt, valid, p):
    """Packed INT8 cache ``[rows, ROW_BYTES]``: ONE gather of whole rows through the block table
    into a ``[s_kv_tile, UB_PITCH]`` UB tile (ROW_BYTES valid), then byte views: nope INT8,
    rope viewed as BF16, scales viewed as FP32. Returns ``(q, scales, kr)``: ``q`` the
    quantized nope values ``[s_kv_tile, 512]``, ``scales`` FP32 ``[s_kv_tile, 4]``, ``kr`` BF16
    ``[s_kv_tile, 64]``, ``valid`` rows each (:func:`assemble_keys` makes K of them)."""
    t = p.s_kv_tile
    pypto.set_vec_tile_shapes(V0_ROWS, UB_PITCH)
    rows_view = pypto.view(
        cache, [cache.shape[0], UB_PITCH], [0, 0], valid_shape=[cache.shape[0], ROW_BYTES]
    )
    rows = gather_in_ub(rows_view, idx, bt, p.block_size, -2)
    pypto.set_vec_tile_shapes(V0_ROWS, NOPE)
    q8 = pypto.view(rows, [t, NOPE_BYTES], [0, 0], valid_shape=[valid, NOPE_BYTES])
    sc8 = pypto.view(rows, [t, SCALE_BYTES], [0, p.scale_off], valid_shape=[valid, SCALE_BYTES])
    kr8 = pypto.view(rows, [t, ROPE_BYTES], [0, p.rope_off], valid_shape=[valid, ROPE_BYTES])
    return q8, pypto.view(sc8, dtype=pypto.DT_FP32), pypto.view(kr8, dtype=pypto.DT_BF16)


def load_packed_fp8(cache, cache_fp8, idx, bt, valid, p):
    """Packed FP8 cache ``[rows, ROW_BYTES]``, given twice: ``cache`` as INT8 bytes and
    ``cache_fp8`` as FP8 E4M3 (the same memory). PyPTO 0.2.0 rejects ``view(dtype=)`` from or to
    FP8, so the seeds' single whole-row gather followed by byte reinterpretation cannot be
    compiled. Instead two gathers through the same indices and block table fetch disjoint byte
    ranges of each row: the nope run from the FP8 view and the tail (rope + scales,
    ``TAIL_BYTES`` padded to ``TAIL_PITCH``) from the INT8 view. Same HBM bytes as one gather;
    twice the descriptors. Used on CPU and NPU alike. Returns as :func:`load_packed_int8`
    (``q`` FP8)."""
    t = p.s_kv_tile
    pypto.set_vec_tile_shapes(V0_ROWS, NOPE)
    nope_view = pypto.view(cache_fp8, [cache_fp8.shape[0], NOPE_BYTES], [0, 0])
    qf8 = gather_in_ub(nope_view, idx, bt, p.block_size, -2)
    pypto.set_vec_tile_shapes(V0_ROWS, TAIL_PITCH)
    tail_view = pypto.view(
        cache,
        [cache.shape[0], TAIL_PITCH],
        [0, NOPE_BYTES],
        valid_shape=[cache.shape[0], TAIL_BYTES],
    )
    tail = gather_in_ub(tail_view, idx, bt, p.block_size, -2)
    pypto.set_vec_tile_shapes(V0_ROWS, NOPE)
    so, ro = p.tail_scale_off, p.tail_rope_off
    sc8 = pypto.view(tail, [t, SCALE_BYTES], [0, so], valid_shape=[valid, SCALE_BYTES])
    kr8 = pypto.view(tail, [t, ROPE_BYTES], [0, ro], valid_shape=[valid, ROPE_BYTES])
    return qf8, pypto.view(sc8, dtype=pypto.DT_FP32), pypto.view(kr8, dtype=pypto.DT_BF16)


def load_split(kn_quant, kr, kn_scales, idx, bt, valid, p):
    """kv_split cache: three gathers through the same indices: ``kn_quant [rows, 512]`` (FP8 E4M3
    or INT8), ``kr [rows, 64]`` BF16, ``kn_scales [rows, 4]`` FP32 (gathered as a 32-byte
    ``[rows, 8]`` view with 4 valid columns). Returns as :func:`load_packed_int8`."""
    t = p.s_kv_tile
    pypto.set_vec_tile_shapes(V0_ROWS, NOPE)
    qk = gather_in_ub(kn_quant, idx, bt, p.block_size, -2)
    pypto.set_vec_tile_shapes(V0_ROWS, ROPE)
    kr_rows = gather_in_ub(kr, idx, bt, p.block_size, -2)
    pypto.set_vec_tile_shapes(V0_ROWS, SCALE_PITCH)
    sc_view = pypto.view(
        kn_scales,
        [kn_scales.shape[0], SCALE_PITCH],
        [0, 0],
        valid_shape=[kn_scales.shape[0], NSCALES],
    )
    sc_rows = gather_in_ub(sc_view, idx, bt, p.block_size, -2)
    sc = pypto.view(sc_rows, [t, NSCALES], [0, 0], valid_shape=[valid, NSCALES])
    pypto.set_vec_tile_shapes(V0_ROWS, NOPE)
    return qk, sc, pypto.view(kr_rows, [t, ROPE], [0, 0], valid_shape=[valid, ROPE])


def assemble_keys(q, scales, kr, valid, skip_col, p):
    """``K = [kn | kr]`` BF16 ``[s_kv_tile, 576]`` and ``kn`` (its first 512 columns, the V of
    C2), ``valid`` rows each, from a loader's ``(q, scales, kr)``. Per 128-column group ``g``:
    ``kn_g = BF16(FP32(q_g) * scale_g)`` -- the exact casts, one FP32 multiply by the ``[t, 1]``
    scale column, one RNE rounding, the reference's expression -- written straight into its
    columns of K (no reshape of the tile, so nothing splits the V0 task). ``skip_col``
    (masked builds, else ``None``): BOOL ``[s_kv_tile, 1]``, true at skipped entries, whose V
    rows are SELECTED to exactly +0 (their gathered stand-in row may hold garbage: a multiply
    by a 0/1 mask would keep a NaN, and ``P = 0`` times a NaN V row is NaN). The rope part is
    copied as ``BF16(FP32(kr))``, exact for every BF16 value (NaN stays NaN), not with
    ``clone`` (module docstring) nor with ``mul(kr, 1.0)``: on the 910B that left a MULS and a
    CAST task per row tile outside the V0 scope. The scale of group ``g`` is selected in UB
    (:func:`coef_column`: the row max over the ``[t, 4]`` scales with the other columns set to
    ``-inf``, which returns every FP32 scale as stored -- ``-inf`` and NaN included -- so a
    ``-inf`` scale gives the golden's NaN (``q = 0``) or ``+-inf``), not taken as a ``[t, 1]``
    column view: a column at a 4-byte offset of a UB tile is not addressable there, and the
    partitioner routed each group's column through GM (a copy out of the scales, then one GM
    copy in per group on the V0 task's chain; docs/ops/dsa.md#kernel)."""
    t = p.s_kv_tile
    pypto.set_vec_tile_shapes(V0_ROWS, NOPE)
    kj = pypto.tensor([t, HEAD], pypto.DT_BF16, "kj")
    sc = pypto.add(scales, 0.0)  # materialise the reinterpreted view (as before: same bits)
    col_id = pypto.view(
        coef_col_ids(t, NSCALES), [t, NSCALES], [0, 0], valid_shape=[valid, NSCALES]
    )
    pypto.set_vec_tile_shapes(V0_ROWS, GROUP)
    for g in range(NSCALES):
        qg = pypto.view(q, [t, GROUP], [0, g * GROUP], valid_shape=[valid, GROUP])
        sg = coef_column(sc, col_id, g)
        kg = pypto.mul(to_fp32(qg, p), sg)
        if skip_col is not None:
            kg = pypto.where(skip_col, 0.0, kg)
        pypto.assemble(pypto.cast(kg, pypto.DT_BF16), [0, g * GROUP], kj)
    pypto.set_vec_tile_shapes(V0_ROWS, ROPE)
    pypto.assemble(pypto.cast(pypto.cast(kr, pypto.DT_FP32), pypto.DT_BF16), [0, NOPE], kj)
    kn = pypto.view(kj, [t, NOPE], [0, 0], valid_shape=[valid, NOPE])
    return kn, pypto.view(kj, [t, HEAD], [0, 0], valid_shape=[valid, HEAD])


def load_keys(load, idx, bt, valid, drop, p):
    """V0 of one KV tile -> ``(kn, K)`` (:func:`assemble_keys`): the cache form's ``load(idx,
    bt, valid) -> (q, scales, kr)`` and the assembly, inside the manual subgraph scope
    :data:`V0_SCOPE` (one task per row tile). ``drop`` (masked builds, else ``None``): the INT32
    ``[1, s_kv_tile]`` skip flags, turned into a ``[s_kv_tile, 1]`` column BEFORE the scope
    (PyPTO documents that a reshape may stay a subgraph of its own inside a manual scope)."""
    t = p.s_kv_tile
    skip_col = None
    if drop is not None:
        pypto.set_vec_tile_shapes(V0_ROWS, NOPE)
        col = pypto.reshape(pypto.cast(drop, pypto.DT_FP32), [t, 1], valid_shape=[valid, 1])
        skip_col = pypto.gt(col, 0.5)
    pypto.set_pass_options(sg_set_scope=V0_SCOPE)
    q, scales, kr = load(idx, bt, valid)
    kn, kj = assemble_keys(q, scales, kr, valid, skip_col, p)
    pypto.set_pass_options(sg_set_scope=-1)
    return kn, kj


# ----------------------------------------------------------------------------- C1 / V1 / C2 / V2


def cube_tiles(c):
    pypto.set_cube_tile_shapes([c[0], c[1]], [c[2], c[3]], [c[4], c[5]])


def tile_attention(qi, kn, kj, skip, valid, p):
    """C1 + V1 + C2 of one KV tile -> ``(o_t, l, m)``: ``o_t`` FP32 (online) or BF16 (per_tile)
    ``[g_tile, 512]``, ``l`` and ``m`` FP32 ``[g_tile, 1]``.

    ``skip`` (masked builds only): INT32 ``[1, s_kv_tile]``, 1 at skipped entries. The scaled
    scores of those columns are SELECTED to ``-MASK_BIAS`` (a select, not an add: the stand-in
    row a skipped entry gathers may hold NaN), so with the row max taken over live columns
    their ``P = exp(-3e38 - m)`` is exactly 0 (and their V rows are +0, :func:`dequant_nope`).
    A tile whose columns are all skipped has
    ``m ~ -3e38``; ``m`` is clamped to ``-MASK_FLOOR`` so that its ``P`` is still 0 and the
    online merge treats the tile as an exact no-op (``a = 1``, ``c = 0``, or ``a = 0`` before
    the first live tile; the per-tile merge up to one FP32 rounding)."""
    t = p.s_kv_tile
    pypto.set_semantic_label("Sa_C1")
    cube_tiles(p.c1)
    s = pypto.matmul(qi, kj, pypto.DT_FP32, a_trans=False, b_trans=True)
    pypto.set_semantic_label("Sa_V1")
    pypto.set_vec_tile_shapes(p.v1[0], p.v1[1])
    s = pypto.mul(s, p.softmax_scale)
    if p.masked:
        s = pypto.where(pypto.gt(pypto.cast(skip, pypto.DT_FP32), 0.5), -MASK_BIAS, s)
    m = pypto.amax(s, dim=-1, keepdim=True)
    if p.masked:
        m = pypto.maximum(m, -MASK_FLOOR)
    pr = pypto.exp(pypto.sub(s, m))
    l = pypto.sum(pr, dim=-1, keepdim=True)
    if p.online:
        pb = pypto.cast(pr, pypto.DT_BF16)
        out_dtype = pypto.DT_FP32
    else:
        pb = pypto.cast(pypto.div(pr, safe_sum(l, p)), pypto.DT_BF16)
        out_dtype = pypto.DT_BF16
    pypto.set_semantic_label("Sa_C2")
    cube_tiles(p.c2)
    pypto.set_matrix_size([p.g_tile, t, NOPE])
    vj = pypto.view(kn, [t, NOPE], [0, 0], valid_shape=[valid, NOPE])
    o_t = pypto.matmul(pb, vj, out_dtype)
    return o_t, l, m


def write_rows(res_fp32, out, row0):
    pypto.assemble(pypto.cast(res_fp32, pypto.DT_BF16), [row0, 0], out)


def safe_sum(l, p):
    """``l`` (a row sum of P) for a division: as is, or ``max(l, 1e-30)`` in masked builds, where
    a token whose every entry is skipped has ``l = 0`` and must give 0, not NaN. Any ``l`` with
    a live key is >= 1 (its maximum contributes exp(0)), so the clamp changes nothing else."""
    return pypto.maximum(l, 1e-30) if p.masked else l


def merge_online(t, o_t, l, m, acc, out, row0, p):
    """V2 of the online kernel (first / middle / last), FP32; writes BF16 rows on the last tile.
    A middle tile: :func:`~tilesim.device._pypto_common.fold_stats` (``maximum=True``, as
    :func:`~tilesim.device._pypto_common.merge_chunk`), then ``O*a + O_t*c``."""
    o_acc, l_acc, m_acc = acc
    if pypto.cond(pypto.is_loop_begin(t)):
        if pypto.cond(pypto.is_loop_end(t)):
            write_rows(pypto.div(o_t, safe_sum(l, p)), out, row0)
        else:
            o_acc[:] = o_t
            l_acc[:] = l
            m_acc[:] = m
    else:
        (m_new, l_new), (a, c) = fold_stats(pypto, (m_acc, l_acc), (m, l), maximum=True)
        tmp = pypto.add(pypto.mul(o_acc, a), pypto.mul(o_t, c))
        if pypto.cond(pypto.is_loop_end(t)):
            write_rows(pypto.div(tmp, safe_sum(l_new, p)), out, row0)
        else:
            o_acc[:] = tmp
            l_acc[:] = l_new
            m_acc[:] = m_new


def merge_per_tile(t, o_t, l, m, acc, out, row0, p):
    """V2 of the per-tile kernel. One tile (the seeds' case): its BF16 C2 output is the answer.
    Several tiles (beyond the seeds, whose kernel keeps the last tile): the normalised tile
    outputs are merged with softmax weights, FP32: the terms of ``L'`` from
    :func:`~tilesim.device._pypto_common.fold_stats` (``maximum=True``, ``weighted=True``:
    ``M' = max(M, m)``, ``A = exp(M - M')*L``, ``C = exp(m - M')*l``, ``L' = A + C``), then
    ``O = (O*A + O_t*C) / L'``; last tile writes ``BF16(O)``."""
    o_acc, l_acc, m_acc = acc
    if pypto.cond(pypto.is_loop_begin(t)):
        if pypto.cond(pypto.is_loop_end(t)):
            pypto.assemble(o_t, [row0, 0], out)
        else:
            o_acc[:] = pypto.cast(o_t, pypto.DT_FP32)
            l_acc[:] = l
            m_acc[:] = m
    else:
        (m_new, l_new), (big_a, big_c) = fold_stats(
            pypto, (m_acc, l_acc), (m, l), maximum=True, weighted=True
        )
        o_new = pypto.div(
            pypto.add(pypto.mul(o_acc, big_a), pypto.mul(pypto.cast(o_t, pypto.DT_FP32), big_c)),
            safe_sum(l_new, p),
        )
        if pypto.cond(pypto.is_loop_end(t)):
            write_rows(o_new, out, row0)
        else:
            o_acc[:] = o_new
            l_acc[:] = l_new
            m_acc[:] = m_new


# ----------------------------------------------------------------------------- the loop nest


class _Token:
    """The symbolic scalars of one (b, s, n, g) iteration the tile loops read."""

    def __init__(self, b, s, n, s1, cur_seq, row0, rows):
        self.b, self.s, self.n, self.s1 = b, s, n, s1
        self.cur_seq, self.row0, self.rows = cur_seq, row0, rows


def kv_tile(query, topk_indices, block_table, tok, t, load, p):
    """V0 + C1 + V1 + C2 of KV tile ``t`` of a token -> ``(o_t, l, m)``."""
    st = p.s_kv_tile
    valid = (tok.cur_seq - t * st).min(st)
    pypto.set_semantic_label("Sa_V0")
    col0 = tok.n * p.topk + t * st
    idx = pypto.view(topk_indices, [1, st], [tok.b * tok.s1 + tok.s, col0], valid_shape=[1, valid])
    bt = pypto.view(block_table, [1, block_table.shape[1]], [tok.b, 0])
    skip = drop = None
    if p.masked:
        flag = pypto.view(
            topk_indices,
            [1, st],
            [tok.b * tok.s1 + tok.s, p.mask_col0 + col0],
            valid_shape=[1, valid],
        )
        skip = drop = flag  # selects of the score columns (V1) and of the V rows (V0)
    kn, kj = load_keys(load, idx, bt, valid, drop, p)
    # Q is a view of the kernel's [T*nq, 576] query: no per-group-tile copy (docs/ops/dsa.md#kernel)
    qi = pypto.view(query, [p.g_tile, HEAD], [tok.row0, 0])
    return tile_attention(qi, kn, kj, skip, valid, p)


def store_state(acc, o, l, m):
    """Keep ``(O, L, M)`` in a split's FP32 state tensors."""
    acc[0][:] = o
    acc[1][:] = l
    acc[2][:] = m


def merge_split(t, o_t, l, m, acc, p):
    """V2 inside one split (online): first / middle / last, all kept in the split's state
    ``acc`` by :func:`~tilesim.device._pypto_common.merge_chunk` (no division and no output:
    the combine stage reads the state)."""
    o_acc, l_acc, m_acc = acc
    if pypto.cond(pypto.is_loop_begin(t)):
        merge_chunk(pypto, m_acc, l_acc, o_acc, m, l, o_t, first=True)
    else:
        merge_chunk(pypto, m_acc, l_acc, o_acc, m, l, o_t, first=False)


def state_tensors(gt, tag=""):
    """FP32 ``(O [gt, 512], L [gt, 1], M [gt, 1])`` scratch of one merge."""
    return (
        pypto.tensor([gt, NOPE], pypto.DT_FP32, "o_acc" + tag),
        pypto.tensor([gt, 1], pypto.DT_FP32, "l_acc" + tag),
        pypto.tensor([gt, 1], pypto.DT_FP32, "m_acc" + tag),
    )


def split_tiles(query, topk_indices, block_table, out, tok, bn, load, p):
    """Split-KV: ``kv_splits`` tile loops, one per split (unrolled here, so each split has its
    own state tensors and no loop iteration depends on another split's); split ``j`` runs
    tiles ``j*tps ..`` of the token. Then the combine: the non-empty splits' states folded in
    split order by :func:`fold_tiles` (``ceil(bn / tps)`` of them; none when ``cur_seq = 0``),
    the online merge's expressions, as the reference's combine."""
    gt = p.g_tile
    states = []
    for j in range(p.kv_splits):
        acc = state_tensors(gt, f"_{j}")
        states.append(acc)
        nt = (bn - j * p.tps).max(0).min(p.tps)
        nt.as_variable()
        for tt in pypto.loop(0, nt, 1, name=f"LOOP_L4s{j}_SA", idx_name=f"t{j}"):
            t = j * p.tps + tt
            o_t, l, m = kv_tile(query, topk_indices, block_table, tok, t, load, p)
            pypto.set_semantic_label("Sa_V2")
            pypto.set_vec_tile_shapes(p.v2[0], p.v2[1])
            merge_split(tt, o_t, l, m, acc, p)
    fold_tiles(states, out, tok, (bn + p.tps - 1) // p.tps, p)


def coef_col_ids(gt, cols):
    """FP32 ``[gt, cols]`` holding its column index ``0, 1, ..`` in every row, built in UB (a
    cumulative sum of ones along the row: exact small integers; no GM round trip)."""
    return pypto.sub(pypto.cumsum(pypto.full([gt, cols], 1.0, pypto.DT_FP32), -1), 1.0)


def fold_coefficients(states, coef, p):
    """The scalar part of the online fold of the tiles' states, in tile order: the ``(m, l)``
    half of :func:`~tilesim.device._pypto_common.merge_tree` over one range (``maximum=True``:
    merge_online's expressions, ``M' = max(M, m)``, ``a = exp(M - M')``, ``c = exp(m - M')``,
    ``L' = a*L + c*l``). The merge's weights -- ``pre[0..n-1]`` (one per state), then its
    ``chained`` ones -- and the final (safe) ``L`` are placed in columns ``0 .. 2n-2`` of ONE
    FP32 ``[g_tile, cols]`` tensor ``coef`` by selects in UB (exact) and written at once, so
    that each fold task reads them with one copy and one dependence edge. One subgraph
    (``sg_set_scope``): a single task. Returns the merge (its ``tree`` is the O half)."""
    pypto.set_semantic_label("Sa_V2")
    gt, cols = coef.shape
    pypto.set_vec_tile_shapes(gt, cols)
    pypto.set_pass_options(sg_set_scope=SCOPE_COEF)
    m_c = [m for _o, _l, m in states]
    l_c = [l for _o, l, _m in states]
    merge = merge_tree(pypto, m_c, l_c, [(0, len(states))], maximum=True)
    values = merge.pre + merge.chained + [safe_sum(merge.l, p)]
    col_id = coef_col_ids(gt, cols)
    packed = pypto.full([gt, cols], 0.0, pypto.DT_FP32)
    for k, v in enumerate(values):
        packed = pypto.where(pypto.eq(col_id, float(k)), v, packed)
    coef[:] = packed
    pypto.set_pass_options(sg_set_scope=-1)
    return merge


def coef_column(cf, col_id, k):
    """Column ``k`` of a small FP32 ``[rows, cols]`` matrix ``cf`` as ``[rows, 1]``, in UB: the
    row max with every other column selected to ``-inf`` (``col_id``: :func:`coef_col_ids`).
    Contract: the result is column ``k`` as stored, for every FP32 value -- ``max(x, -inf) = x``
    for every ``x > -inf``, ``max(-inf, -inf) = -inf``, and a NaN in column ``k`` stays NaN.
    Used for the fold's coefficients (>= 0, or NaN) and V0's cache scales (any FP32 value)."""
    return pypto.amax(pypto.where(pypto.eq(col_id, float(k)), cf, NEG_INF), -1, True)


def fold_width(n, gt):
    """Columns per fold task: the widest of 128, 64, .., 16 whose ``n`` FP32 ``[gt, w]`` O tiles
    take at most FOLD_UB bytes (4 x 64 KiB at w = 128 overflow the 910B's 192 KiB UB: the
    scheduler spills to GM)."""
    w = 128
    while w > 16 and n * gt * w * 4 > FOLD_UB:
        w //= 2
    return w


def fold_outputs(states, coef, tree, out, row0, p):
    """The O part of the fold: the merge's ``tree``
    (:func:`~tilesim.device._pypto_common.eval_tree`) over ``O_t * pre[t]`` with the
    coefficients of :func:`fold_coefficients` -- ``O' = O*a + O_t*c`` in tile order -- then
    ``BF16(O / L)`` into the output rows; per column block of :func:`fold_width` columns, each
    block ONE task (its own ``sg_set_scope``) that reads the packed coefficients once."""
    pypto.set_semantic_label("Sa_V2")
    gt, cols = coef.shape
    n = len(states)
    w = fold_width(n, gt)
    for b in range(NOPE // w):
        pypto.set_pass_options(sg_set_scope=SCOPE_FOLD + b)
        pypto.set_vec_tile_shapes(gt, cols)
        col_id = coef_col_ids(gt, cols)
        k = [coef_column(coef, col_id, j) for j in range(2 * n - 1)]
        pypto.set_vec_tile_shapes(gt, w)
        views = [pypto.view(o_t, [gt, w], [0, b * w]) for o_t, _l, _m in states]
        prods = [pypto.mul(v, k[t]) for t, v in enumerate(views)]  # O_t * pre[t]
        res = pypto.div(eval_tree(tree, prods, k[n:-1]), k[-1])
        pypto.assemble(pypto.cast(res, pypto.DT_BF16), [row0, b * w], out)
    pypto.set_pass_options(sg_set_scope=-1)


def fold_tiles(states, out, tok, bn, p):
    """The fold of the first ``bn`` tile states (``bn`` known at run time): one variant per
    possible count ``n``, each behind a 0/1-trip loop (``bn == n``), so that the fold of a
    short token reads only the tiles it has. ``n = 1``: ``BF16(O / L)`` directly; else the
    coefficient task then the O fold (two loops: a task boundary, so that the coefficients,
    which need only the V1 outputs, are done while the C2 matmuls run)."""
    gt = p.g_tile
    for n in range(1, len(states) + 1):
        is_n = (bn - n + 1).max(0).min(1) - (bn - n).max(0).min(1)
        if n == 1:
            for _f in pypto.loop(0, is_n, 1, name="LOOP_L5f1_SA", idx_name="f1"):
                pypto.set_semantic_label("Sa_V2")
                pypto.set_vec_tile_shapes(p.v2[0], p.v2[1])
                o0, l0, _m0 = states[0]
                write_rows(pypto.div(o0, safe_sum(l0, p)), out, tok.row0)
            continue
        cols = -(-(2 * n - 1) // 8) * 8
        coef = pypto.tensor([gt, cols], pypto.DT_FP32, f"fold_coef{n}")
        for _c in pypto.loop(0, is_n, 1, name=f"LOOP_L5c{n}_SA", idx_name=f"c{n}"):
            merge = fold_coefficients(states[:n], coef, p)
        for _f in pypto.loop(0, is_n, 1, name=f"LOOP_L5f{n}_SA", idx_name=f"f{n}"):
            fold_outputs(states[:n], coef, merge.tree, out, tok.row0, p)


def unrolled_tiles(query, topk_indices, block_table, out, tok, bn, load, p):
    """``kv_splits = 1``, online, at most UNROLL_TILES tiles per token: the tiles unrolled at
    trace time, tile ``t`` in a 0/1-trip loop (``t < bn``) that leaves its raw ``(O_t, l_t,
    m_t)`` in its own FP32 tensors, then :func:`fold_tiles`. Same expressions in the same
    order as :func:`merge_online` (the loop it replaces): same bits. Why: the loop's merge is
    a chain of two dependent tasks per tile after the tiles' C2 (docs/ops/dsa.md#kernel); the fold
    is one task per column block after the last C2."""
    gt = p.g_tile
    states = []
    for t in range(-(-p.topk // p.s_kv_tile)):
        acc = state_tensors(gt, f"_t{t}")
        states.append(acc)
        present = (bn - t).max(0).min(1)
        for it in pypto.loop(0, present, 1, name=f"LOOP_L4t{t}_SA", idx_name=f"t{t}"):
            # the tile index as a symbolic value (it = 0): measured ~2 s less CPU per sim call
            # (compile + interpret) than a Python-constant t; same tasks, same cost-model µs
            o_t, l, m = kv_tile(query, topk_indices, block_table, tok, it + t, load, p)
            pypto.set_semantic_label("Sa_V2")
            pypto.set_vec_tile_shapes(p.v2[0], p.v2[1])
            store_state(acc, o_t, l, m)
    fold_tiles(states, out, tok, bn, p)


def single_tile(query, topk_indices, block_table, out, tok, bn, load, p):
    """``kv_splits = 1``, online, one KV tile per token (``s_kv_tile >= topk``): the tile in a
    0/1-trip loop (``bn``) that writes ``BF16(O_t / l)`` itself, the one-tile fold's expression
    (same bits). No state tensors and no fold loop: the token is one root function, so the
    scheduler resolves no state copy and a submission window holds twice as many tokens."""
    for it in pypto.loop(0, bn, 1, name="LOOP_L4t0_SA", idx_name="t0"):
        o_t, l, _m = kv_tile(query, topk_indices, block_table, tok, it, load, p)
        pypto.set_semantic_label("Sa_V2")
        pypto.set_vec_tile_shapes(p.v2[0], p.v2[1])
        write_rows(pypto.div(o_t, safe_sum(l, p)), out, tok.row0)


def whole_tiles(query, topk_indices, block_table, out, tok, bn, load, p):
    """``kv_splits = 1``: the token's tiles in one loop, merged as they come (the last tile
    writes the output rows)."""
    if p.online and p.s_kv_tile >= p.topk:
        single_tile(query, topk_indices, block_table, out, tok, bn, load, p)
        return
    if p.online and -(-p.topk // p.s_kv_tile) <= UNROLL_TILES:
        unrolled_tiles(query, topk_indices, block_table, out, tok, bn, load, p)
        return
    gt = p.g_tile
    merge = merge_online if p.online else merge_per_tile
    acc = state_tensors(gt)
    for t in pypto.loop(0, bn, 1, name="LOOP_L4_s2_SA", idx_name="t"):
        o_t, l, m = kv_tile(query, topk_indices, block_table, tok, t, load, p)
        pypto.set_semantic_label("Sa_V2")
        pypto.set_vec_tile_shapes(p.v2[0], p.v2[1])
        merge(t, o_t, l, m, acc, out, tok.row0, p)


def attention_nest(query, topk_indices, block_table, kv_act_seqs, out, load, p):
    """The loop nest (module docstring). ``load(idx, bt, valid) -> (q, scales, kr)`` is the V0
    loader of the cache form (:func:`load_keys`)."""
    nq = p.nq
    group = nq // p.n_kv
    gt = p.g_tile
    st = p.s_kv_tile
    n_b = kv_act_seqs.shape[0]
    rows = query.shape[0]
    rows_per_b = rows // n_b
    s1 = rows_per_b // nq
    for b in pypto.loop(0, n_b, 1, name="LOOP_L0_b_SA", idx_name="b"):
        act = kv_act_seqs[b]
        for s in pypto.loop(0, s1, 1, name="LOOP_L1_s1_SA", idx_name="s"):
            cur_seq = (act - s1 + 1 + s).max(0).min(p.topk)
            cur_seq.as_variable()
            bn = (cur_seq + st - 1) // st
            for n in pypto.loop(0, p.n_kv, 1, name="LOOP_L2_n_kv_SA", idx_name="n"):
                for g in pypto.loop(0, group // gt, 1, name="LOOP_L3_g_SA", idx_name="g"):
                    row0 = b * rows_per_b + s * nq + n * group + g * gt
                    tok = _Token(b, s, n, s1, cur_seq, row0, rows)
                    # cur_seq = 0: no key to attend -> zeros (a 0- or 1-trip loop)
                    for _z in pypto.loop(0, 1 - bn.min(1), 1, name="LOOP_L4z_SA", idx_name="z"):
                        pypto.set_vec_tile_shapes(min(gt, 64), NOPE)
                        pypto.assemble(pypto.full([gt, NOPE], 0.0, pypto.DT_BF16), [row0, 0], out)
                    if p.kv_splits > 1:
                        split_tiles(query, topk_indices, block_table, out, tok, bn, load, p)
                    else:
                        whole_tiles(query, topk_indices, block_table, out, tok, bn, load, p)


def packed_nest(query, nope_cache, cache_fp8, topk_indices, block_table, kv_act_seqs,
                attention_out, p):  # fmt: skip
    """Packed cache (INT8 bytes; FP8 also through ``cache_fp8``)."""
    pypto.experimental.set_operation_options(combine_axis=p.combine_axis)
    if p.quant == "fp8":

        def load(idx, bt, valid):
            return load_packed_fp8(nope_cache, cache_fp8, idx, bt, valid, p)
    else:

        def load(idx, bt, valid):
            return load_packed_int8(nope_cache, idx, bt, valid, p)

    attention_nest(query, topk_indices, block_table, kv_act_seqs, attention_out, load, p)


def split_nest(query, kn_quant, kr, kn_scales, topk_indices, block_table, kv_act_seqs,
               attention_out, p):  # fmt: skip
    """kv_split cache."""
    pypto.experimental.set_operation_options(combine_axis=p.combine_axis)

    def load(idx, bt, valid):
        return load_split(kn_quant, kr, kn_scales, idx, bt, valid, p)

    attention_nest(query, topk_indices, block_table, kv_act_seqs, attention_out, load, p)


# ----------------------------------------------------------------------------- kernel sources
# Undecorated: :func:`build` wraps each in ``pypto.frontend.jit`` with the options of a SoC and
# mode. The parameter names block_table / kv_act_seqs are referenced by ready_on_host_tensors.


def sa_packed_int8(
    query: pypto.Tensor([pypto.DYNAMIC, HEAD], pypto.DT_BF16),
    nope_cache: pypto.Tensor([pypto.STATIC, ROW_BYTES], pypto.DT_INT8),
    topk_indices: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
    block_table: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
    kv_act_seqs: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
    attention_out: pypto.Tensor([pypto.DYNAMIC, NOPE], pypto.DT_BF16),
    params,
):
    packed_nest(query, nope_cache, None, topk_indices, block_table, kv_act_seqs,
                attention_out, params)  # fmt: skip


def sa_packed_fp8(
    query: pypto.Tensor([pypto.DYNAMIC, HEAD], pypto.DT_BF16),
    nope_cache: pypto.Tensor([pypto.STATIC, ROW_BYTES], pypto.DT_INT8),
    nope_cache_fp8: pypto.Tensor([pypto.STATIC, ROW_BYTES], pypto.DT_FP8E4M3),
    topk_indices: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
    block_table: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
    kv_act_seqs: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
    attention_out: pypto.Tensor([pypto.DYNAMIC, NOPE], pypto.DT_BF16),
    params,
):
    packed_nest(query, nope_cache, nope_cache_fp8, topk_indices, block_table, kv_act_seqs,
                attention_out, params)  # fmt: skip


def sa_split_fp8(
    query: pypto.Tensor([pypto.DYNAMIC, HEAD], pypto.DT_BF16),
    kn_quant: pypto.Tensor([pypto.STATIC, NOPE], pypto.DT_FP8E4M3),
    kr: pypto.Tensor([pypto.STATIC, ROPE], pypto.DT_BF16),
    kn_scales: pypto.Tensor([pypto.STATIC, NSCALES], pypto.DT_FP32),
    topk_indices: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
    block_table: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
    kv_act_seqs: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
    attention_out: pypto.Tensor([pypto.DYNAMIC, NOPE], pypto.DT_BF16),
    params,
):
    split_nest(query, kn_quant, kr, kn_scales, topk_indices, block_table, kv_act_seqs,
               attention_out, params)  # fmt: skip


def sa_split_int8(
    query: pypto.Tensor([pypto.DYNAMIC, HEAD], pypto.DT_BF16),
    kn_quant: pypto.Tensor([pypto.STATIC, NOPE], pypto.DT_INT8),
    kr: pypto.Tensor([pypto.STATIC, ROPE], pypto.DT_BF16),
    kn_scales: pypto.Tensor([pypto.STATIC, NSCALES], pypto.DT_FP32),
    topk_indices: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
    block_table: pypto.Tensor([pypto.DYNAMIC, pypto.STATIC], pypto.DT_INT32),
    kv_act_seqs: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
    attention_out: pypto.Tensor([pypto.DYNAMIC, NOPE], pypto.DT_BF16),
    params,
):
    split_nest(query, kn_quant, kr, kn_scales, topk_indices, block_table, kv_act_seqs,
               attention_out, params)  # fmt: skip


SOURCES = {
    ("packed", "int8"): sa_packed_int8,
    ("packed", "fp8"): sa_packed_fp8,
    ("split", "fp8"): sa_split_fp8,
    ("split", "int8"): sa_split_int8,
}


# ----------------------------------------------------------------------------- options


#: the contract every build needs (the loop bounds read these inputs on the host), not a tuning
READY_ON_HOST = ("block_table", "kv_act_seqs")

#: the seeds' options per softmax mode (``hicann/pypto-gym``'s DeepSeek sparse-attention
#: kernels, ``docs/sources.md``): ``online`` = the ``_high`` / ``_d_950`` kernels, ``per_tile`` =
#: ``_d``. A hashable spec (part of the compile key): ``(kind, name, value)`` with kind
#: ``"pass"`` (value: ``((scope, n), ...)``, a ``{scope: n}`` dict), ``"runtime"`` or
#: ``"operation"`` (``set_operation_options`` in the kernel body). PyPTO 0.2.0 has no
#: ``ooo_sched_mode`` pass option and no ``max_workspace_kb`` runtime option (the ``_high``
#: kernel sets both); its ``"DEFAULT"`` key is written ``-1``.
SEED_JIT = {
    "online": (
        ("pass", "vec_nbuffer_setting", ((-1, 1),)),
        ("pass", "cube_l1_reuse_setting", ((-1, 1),)),
        ("pass", "cube_nbuffer_setting", ((-1, 1),)),
        ("runtime", "stitch_function_max_num", 128),
        ("runtime", "device_sched_mode", 1),
        ("operation", "combine_axis", True),
    ),
    "per_tile": (
        ("pass", "vec_nbuffer_setting", ((-1, 2), (0, 4))),
        ("pass", "cube_l1_reuse_setting", ((-1, 2),)),
        ("runtime", "stitch_function_max_num", 128),
        ("runtime", "device_sched_mode", 3),
        ("operation", "combine_axis", True),
    ),
}


#: the large-batch build of the online kernel (picked by token count:
#: :func:`tilesim.shared.dsa.kernel_build`): the seeds' options with two task merges that
#: change no arithmetic. ``cube_l1_reuse_setting {-1: 4}`` (the L1 reuse of
#: ``hicann/pypto:models/deepseek_v32_exp/sparse_attention_antiquant_impl.py``'s ``_p``
#: kernel) packs a KV tile's four 128-key C1 subgraphs, which read the same Q rows, into one
#: cube task that copies Q once (15 copies instead of 24); ``vec_nbuffer_setting {-1: 4}`` (as
#: the indexer, ``_dsa_indexer_kernel.JIT``) packs identically shaped vector subgraphs (the V0
#: row tiles, the V1 halves) into shared tasks: fewer tasks and fewer successor edges for the
#: scheduler threads to resolve. Both lengthen a token's chain, so a small batch keeps the
#: seeds' build (docs/ops/dsa.md#kernel, "Builds by token count")
LARGE_BATCH_JIT = replaced(
    SEED_JIT["online"],
    ("pass", "cube_l1_reuse_setting", ((-1, 4),)),
    ("pass", "vec_nbuffer_setting", ((-1, 4),)),
)
#: the many-token build (the large-batch tiling's calls of many tokens:
#: :func:`tilesim.shared.dsa.kernel_build`): the large-batch build with ``cube_nbuffer_setting
#: {-1: 4}``, which packs a token's identically shaped cube subgraphs into one task -- its four
#: C1 subgraphs (one per 512 keys) and the two C2 column halves, which copy the same P -- so a
#: token's cube work is two tasks that copy Q, K and P once each. One cube task per stage is a
#: longer chain per token, which pays only when many tokens keep the cube cores busy
#: (docs/ops/dsa.md#kernel, "The 910B's b64 trace"). The build's C1 tiles:
#: :func:`tilesim.shared.dsa.build_tiling`
MANY_TOKENS_JIT = replaced(LARGE_BATCH_JIT, ("pass", "cube_nbuffer_setting", ((-1, 4),)))
#: the kernel's builds: the name :func:`tilesim.shared.dsa.kernel_build` returns -> its spec
#: per softmax mode (``None``: the seeds' options of every mode, :data:`SEED_JIT`)
BUILDS = {
    "seeds": None,
    "large_batch": {"online": LARGE_BATCH_JIT},
    "many_tokens": {"online": MANY_TOKENS_JIT},
}


def jit_spec(soc: str, mode: str, build: str = "seeds") -> tuple:
    """The option spec the kernels use on ``soc`` in softmax ``mode`` for ``build`` (a key of
    :data:`BUILDS`; a mode the build does not cover runs the seeds' options,
    :data:`SEED_JIT`, which keep every option that does not make the cost model worse on
    either SoC: tests/device/dsa_sweep.py, docs/ops/dsa.md#kernel)."""
    if build not in BUILDS:
        raise ValueError(f"build: expected one of {sorted(BUILDS)}, got {build!r}")
    return (BUILDS[build] or {}).get(mode) or SEED_JIT[mode]


def build(form: str, quant: str, mode: str, params: NestParams, static_dims: tuple, jit: tuple):
    """The jit kernel for a cache ``form`` ("packed"/"split"), ``quant`` ("int8"/"fp8"),
    softmax ``mode`` ("online"/"per_tile"), static ``params`` and option spec ``jit``
    (:func:`jit_spec`; its ``combine_axis`` must be ``params.combine_axis``) on this process's
    target, built once per compile key (:func:`tilesim.device.backend.compiled`; the key is the
    model constants, tiles incl. ``kv_splits``, quant, layout, mode, masked or not and the
    options, never a batch, sequence length or ``cur_seq``: those are runtime values of the
    loop nest). ``static_dims``: the ``pypto.STATIC`` axes of the call, ``(cache rows,
    block-table columns)``: 0.2.0's ``view`` takes only constant shapes, so the cache pool's
    row count (a deployment constant) and the block table's width (padded by the wrapper to a
    power of two, a bucket) are compiled in."""
    if combine_axis(jit) != params.combine_axis:
        raise ValueError(f"params.combine_axis {params.combine_axis} does not match jit {jit!r}")
    name = "dsa_sparse_attention" if form == "packed" else "dsa_sparse_attention_kv_split"
    key = (quant, mode, params.key, tuple(static_dims))
    return compiled_jit(name, key, jit, lambda: SOURCES[(form, quant)], ready_on_host=READY_ON_HOST)
