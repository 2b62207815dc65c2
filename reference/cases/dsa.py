"""Golden-data generator and named cases for DeepSeek-V3.2 sparse MLA attention.

:func:`dsa_make_case` builds inputs the way the seeds' tests do (``hicann/pypto-gym``, the
DeepSeek sparse-attention tests; ``docs/sources.md``) and returns the case dict of
:func:`tilesim.shared.registry.case_schema.make_case`, so that ``op(**case["inputs"],
**case["params"])`` runs the golden (``op`` is the name of
:func:`~tilesim.reference.sparse_attention_antiquant` or ``..._kv_split`` in
:mod:`tilesim.reference`). :data:`DSA_CASES` names the seeds' test matrix with tile preset and SoC
marks; :data:`CASE_INFO` describes each named case for the registry.

Data recipe (deterministic from ``seed``; NumPy ``SeedSequence(seed).spawn`` gives one
independent stream per component, so e.g. the top-k rule never changes the cache bytes):

1. Block table: ``ceil(act_b / block_size)`` blocks per batch; a random permutation of all
   blocks is handed out in order (batch 0's logical blocks first); table ``[B, ceil(max(act) /
   block_size)]`` int32, unused entries ``-1``.
2. Top-k indices ``[B*s1, topk]`` int32, rule ``"seeds"``: a batch with ``act < topk`` gets
   ``0 .. act-1`` then zeros in every row; otherwise every row is a fresh permutation of
   ``0 .. topk-1`` (so only the first ``topk`` positions are ever selected). Rule ``"causal"``:
   query token ``s`` draws ``cur_seq`` distinct positions uniformly from its whole causal range
   ``0 .. act-s1+s`` (random order); the tail is ``-1``. ``invalid_frac`` turns that fraction of
   the used entries into ``-1`` (skipped keys).
3. Query ``[B*s1*nq, 576]``, latent ``[rows, 512]`` and rope ``[rows, 64]``: uniform BF16 on
   the grid ``j/128``, ``j`` in ``-128 .. 127`` (one random byte per value: the raw PCG64
   output words, little endian). torch's
   ``-1 + 2*rand(bf16)`` in the seeds is also uniform in [-1, 1) but has extra values near 0;
   the RNG streams differ anyway (NumPy PCG64 here, torch's Philox/MT there), so bits never
   match the seeds' tensors, only the recipe does.
4. Quantization of each 128-value group by ``quant``: ``"fp8"`` (seeds: ``max(amax,1e-8)/448``),
   ``"fp8_ue8m0"`` (FlashMLA power-of-two scale), ``"int8"`` (``/127``, round half even,
   clamp) and ``"fp8_int8grid"`` (the seeds' FP8 kv_split test: the INT8 recipe, then the
   integers cast to E4M3). The rules are :mod:`tilesim.shared.quant`'s; because every value sits
   on the 256-value grid, a group's result depends only on its ``amax`` index and each value's
   byte, so the cache is quantized by table lookup in chunks of ``chunk_rows`` rows (tables
   built by those very functions; ``tests/reference/test_dsa_cases.py`` proves the equality).
   No float32 copy of the whole latent is ever made: the 64-batch cases (4.2M rows, 2.75 GB of
   cache) build in about 10 s within ~3 GB.
5. Packing by ``layout``: ``"pypto"`` / ``"flashmla"`` row order (one ``[rows, 656]`` array) or
   ``"kv_split"`` (three tensors, for the kv_split op).

``poison_unreached=True`` overwrites every cache row that no used, non-``-1`` entry reaches with
NaN (nope bytes 0x7F — E4M3 NaN, INT8 127 —, rope BF16 NaN, scales FP32 NaN), the FlashMLA
trick that exposes any out-of-range read.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from tilesim.reference.util.progress import progress_bar
from tilesim.shared.casts import BF16, FP8_E4M3, to_bf16, to_fp8_e4m3
from tilesim.shared.dsa import tiling_argument
from tilesim.shared.layouts.mla_cache import (
    CACHE_LAYOUTS,
    NOPE,
    NSCALES,
    PYPTO_ROW_BYTES,
    ROPE,
    is_packed,
    pack_rows,
)
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.quant import (
    QUANT_GROUP,
    quantize_latent_fp8,
    quantize_latent_fp8_ue8m0,
    quantize_latent_int8,
)
from tilesim.shared.registry.case_schema import CaseInfo, make_case, tolerance
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.validate import (
    check_bool,
    check_choice,
    check_elements,
    check_float,
    check_int,
)

QUANT_RULES = ("fp8", "fp8_ue8m0", "int8", "fp8_int8grid")
TOPK_RULES = ("seeds", "causal")
#: rows quantized per step (bounds the temporaries at ~100 MB)
CHUNK_ROWS = 16384
#: the Ascend-house compare rule the seeds' tests use for this op (``docs/sources.md``)
SEEDS_TOLERANCE = {"atol": 1e-4, "rtol": 5e-3, "ratio": 0.005}
_GRID = 256  # values j/128, j = int8(byte)
_AMAX_LEVELS = 129  # amax index A = max|j| in 0..128

# ----------------------------------------------------------------------------- quantization


def _quantize_rule(quant: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x [rows, 128*g]`` BF16 -> ``(q, scales)`` by ``quant`` (the shared quantizers)."""
    if quant == "fp8":
        return quantize_latent_fp8(x)
    if quant == "fp8_ue8m0":
        return quantize_latent_fp8_ue8m0(x)
    if quant == "int8":
        return quantize_latent_int8(x)
    if quant == "fp8_int8grid":
        q8, s = quantize_latent_int8(x)
        return to_fp8_e4m3(q8.astype(np.float32)), s
    raise ValueError(f"quant: expected one of {QUANT_RULES}, got {quant!r}")


def quant_dtype(quant: str) -> np.dtype:
    """Storage dtype of a quant rule's cache: float8_e4m3fn or int8."""
    if quant not in QUANT_RULES:
        raise ValueError(f"quant: expected one of {QUANT_RULES}, got {quant!r}")
    return np.dtype(np.int8) if quant == "int8" else FP8_E4M3


@functools.lru_cache(maxsize=1)
def grid_bf16_bits() -> np.ndarray:
    """uint16 ``[256]``: BF16 bits of ``int8(byte) / 128`` for every byte value."""
    j = np.arange(_GRID, dtype=np.uint8).view(np.int8).astype(np.float32)
    return to_bf16(j / np.float32(128)).view(np.uint16)


@functools.lru_cache(maxsize=len(QUANT_RULES))
def grid_quant_tables(quant: str) -> tuple[np.ndarray, np.ndarray]:
    """Lookup tables of ``quant`` on the grid: ``(q_bits uint8 [129*256], scale float32 [129])``.

    ``q_bits[A*256 + byte]`` is the quantized byte of value ``int8(byte)/128`` in a group whose
    ``amax`` is ``A/128``; ``scale[A]`` that group's scale. Built by running the shared quantizer
    on one crafted group per (A, byte): ``[value, -A/128, 0, ...]`` (entries with
    ``|value| > A/128`` cannot occur in real data and are never looked up).
    """
    a = np.repeat(np.arange(_AMAX_LEVELS), _GRID)
    byte = np.tile(np.arange(_GRID), _AMAX_LEVELS)
    vals = np.zeros((a.size, QUANT_GROUP), dtype=np.float32)
    vals[:, 0] = np.arange(_GRID, dtype=np.uint8).view(np.int8)[byte] / np.float32(128)
    vals[:, 1] = -a / np.float32(128)
    q, s = _quantize_rule(quant, to_bf16(vals))
    q_bits = np.ascontiguousarray(q[:, 0]).view(np.uint8).copy()
    zero_byte = np.arange(_AMAX_LEVELS) * _GRID  # value 0: amax is exactly A
    return q_bits, s[zero_byte, 0].astype(np.float32)


def quantize_grid_rows(byte_rows: np.ndarray, quant: str) -> tuple[np.ndarray, np.ndarray]:
    """Quantize latent rows given as grid bytes (``uint8 [n, 512]``, value ``int8(b)/128``).

    Returns ``(q [n, 512] e4m3/int8, scales float32 [n, 4])``, equal to ``_quantize_rule(quant,
    bf16(int8(b)/128))`` without materialising any float array: the 128-byte groups are sorted by
    their amax index ``A``, each run of equal ``A`` is mapped through its 256-byte table with
    ``bytes.translate`` (1 byte per value of traffic instead of an 8-byte index), and the groups
    are put back in place.
    """
    q_lut, s_lut = grid_quant_tables(quant)
    tables = q_lut.reshape(_AMAX_LEVELS, _GRID)
    n = byte_rows.shape[0]
    groups = np.ascontiguousarray(byte_rows).reshape(n * NSCALES, QUANT_GROUP)
    j = groups.view(np.int8)
    amax = np.maximum(j.max(axis=1).astype(np.int16), -j.min(axis=1).astype(np.int16))
    order = np.argsort(amax, kind="stable")
    sorted_groups = groups[order]
    levels, starts = np.unique(amax[order], return_index=True)
    ends = np.append(starts[1:], order.size)
    for a, lo, hi in zip(levels.tolist(), starts.tolist(), ends.tolist(), strict=True):
        mapped = sorted_groups[lo:hi].tobytes().translate(tables[a].tobytes())
        sorted_groups[lo:hi] = np.frombuffer(mapped, dtype=np.uint8).reshape(hi - lo, QUANT_GROUP)
    q = np.empty_like(groups)
    q[order] = sorted_groups
    return q.reshape(n, NOPE).view(quant_dtype(quant)), s_lut.take(amax).reshape(n, NSCALES)


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class DsaCase:
    """One named case of the seeds' test matrix (``docs/ops/dsa.md``)."""

    name: str
    b: int
    s1: int
    actual_seq: tuple[int, ...]
    quant: str  # see QUANT_RULES
    preset: str  # SaTileShapeConfig preset: "decode" (online 512) or "prefill" (per-tile 2048)
    entry: str  # the seeds' kernel entry the case exercises
    soc: tuple[str, ...]
    status: str  # what the seeds' test does with it: "runs", "skip: perf", "skip: large"
    layout: str = "pypto"
    size: str = "large"  # CaseInfo.size: "medium" (a minute) or "large" (minutes, GB)

    @property
    def tiling(self) -> SaTileShapeConfig:
        return SaTileShapeConfig.preset(self.preset)

    @property
    def tolerance(self) -> dict:
        return dict(SEEDS_TOLERANCE)


_UNIFORM_64 = (16384,) * 8 + (32768,) * 8 + (49152,) * 8 + (65536,) * 16
_UNIFORM_64 += (81920,) * 8 + (98304,) * 8 + (114688,) * 8
_TOTAL_4 = (65536, 16381, 666, 15)


# (name, b, s1, actual_seq, quant, preset, entry, soc, status, layout, size)
_HIGH = "sparse_attention_antiquant_fp8_high"  # current FP8 packed test: online, s_kv_tile 512
_D, _P = "sparse_attention_antiquant_d", "sparse_attention_antiquant_p"  # per-tile, 2048
_D950 = "sparse_attention_antiquant_d_950"  # INT8 online, s_kv_tile 512
_SPLIT_D = "sparse_attention_antiquant_kv_split_d"  # older FP8 kv_split test, per-tile
_SPLIT_P = "sparse_attention_antiquant_kv_split_p"
_S950, _SBOTH = ("950",), ("950", "910b")
_L, _M = "large", "medium"
_CASE_ROWS = [
    ("sfa_bf16_b4_s2_seq64K_per_fp8_d", 4, 2, (65536,) * 4, "fp8", "decode", _HIGH, _S950,
     "skip: large", "pypto", _L),
    ("sfa_bf16_b64_s2_seq64K_per_fp8_d", 64, 2, (65536,) * 64, "fp8", "decode", _HIGH, _S950,
     "runs", "pypto", _L),
    ("sfa_bf16_b64_s2_seq64K_uniform_per_fp8_d", 64, 2, _UNIFORM_64, "fp8", "decode", _HIGH,
     _S950, "skip: large", "pypto", _L),
    ("sfa_bf16_b4_s2_seq64K_total_fp8_d", 4, 2, _TOTAL_4, "fp8", "prefill", _D, _S950, "runs",
     "pypto", _M),
    ("sfa_bf16_b1_s256_seq64K_fp8_p", 1, 256, (65536,), "fp8", "prefill", _P, _SBOTH,
     "skip: large", "pypto", _L),
    ("sfa_bf16_b4_s2_seq64K_total_int8_d", 4, 2, _TOTAL_4, "int8", "prefill", _D, _SBOTH, "runs",
     "pypto", _M),
    ("sfa_bf16_b4_s2_seq64K_per_int8_d", 4, 2, (65536,) * 4, "int8", "prefill", _D, _SBOTH,
     "skip: perf", "pypto", _L),
    ("sfa_bf16_b1_s256_seq64K_int8_p", 1, 256, (65536,), "int8", "prefill", _P, _SBOTH,
     "skip: large", "pypto", _L),
    ("sfa_bf16_b64_s2_seq64K_uniform_per_int8_d_950", 64, 2, _UNIFORM_64, "int8", "decode", _D950,
     _S950, "skip: large", "pypto", _L),
    ("sfa_bf16_b4_s2_seq64K_per_int8_d_950", 4, 2, (65536,) * 4, "int8", "decode", _D950, _S950,
     "skip: large", "pypto", _L),
    ("sfa_bf16_b64_s2_seq64K_per_int8_d_950", 64, 2, (65536,) * 64, "int8", "decode", _D950,
     _S950, "runs", "pypto", _L),
    ("sfa_bf16_b4_s2_seq64K_total_fp8_kv_split_d", 4, 2, _TOTAL_4, "fp8_int8grid", "prefill",
     _SPLIT_D, _S950, "runs", "kv_split", _M),
    ("sfa_bf16_b4_s2_seq64K_per_fp8_kv_split_d", 4, 2, (65536,) * 4, "fp8_int8grid", "prefill",
     _SPLIT_D, _S950, "skip: perf", "kv_split", _L),
    ("sfa_bf16_b1_s256_seq64K_fp8_kv_split_p", 1, 256, (65536,), "fp8_int8grid", "prefill",
     _SPLIT_P, _S950, "skip: large", "kv_split", _L),
]  # fmt: skip


#: the seeds' named cases; ``dsa_make_case(name)`` builds one
DSA_CASES: Mapping[str, DsaCase] = {r[0]: DsaCase(*r) for r in _CASE_ROWS}

_SEED_NOTE = (
    "the seeds draw with torch.manual_seed(42); tilesim's NumPy streams (seed 0) follow the same "
    "recipe, not the same bits"
)
_QUANT_TEXT = {"fp8": "FP8", "fp8_ue8m0": "FP8 (UE8M0 scales)", "int8": "INT8",
               "fp8_int8grid": "FP8 (INT8-grid quirk)"}  # fmt: skip


def _acts_text(acts: tuple[int, ...]) -> str:
    """``[65536]*4``, ``8x16K,8x32K,...`` (runs of multiples of 1024) or ``[65536,16381,...]``."""
    if len(set(acts)) == 1:
        return f"[{acts[0]}]*{len(acts)}"
    if all(a % 1024 == 0 for a in acts):
        runs: list[list[int]] = []
        for a in acts:
            if runs and runs[-1][0] == a:
                runs[-1][1] += 1
            else:
                runs.append([a, 1])
        return ",".join(f"{n}x{a // 1024}K" for a, n in runs)
    return "[" + ",".join(str(a) for a in acts) + "]"


def case_summary(
    c: DsaCase, *, nq: int = DEEPSEEK_V32.num_q_heads, block_size: int = DEEPSEEK_V32.block_size
) -> str:
    """One line describing a named case (shape, cache form, softmax mode, the seeds' entry)."""
    blocks = sum(math.ceil(a / block_size) for a in c.actual_seq)
    cache = f"{c.layout} packed cache" if is_packed(c.layout) else "kv_split tensors"
    soft = "online" if c.tiling.softmax == "online" else "per-tile"
    return (
        f"b {c.b}, s1 {c.s1}, nq {nq}, act {_acts_text(c.actual_seq)}, {blocks} blocks, "
        f"{_QUANT_TEXT[c.quant]} {cache}, {soft} softmax, s_kv_tile {c.tiling.s_kv_tile} "
        f"(seeds' entry {c.entry})"
    )


def _case_info(c: DsaCase) -> CaseInfo:
    op = "sparse_attention_antiquant" + ("" if is_packed(c.layout) else "_kv_split")
    return CaseInfo(
        name=c.name,
        family="dsa",
        op=op,
        model="DeepSeek-V3.2",
        summary=case_summary(c),
        seed=0,
        size=c.size,
        tolerance=tolerance(**SEEDS_TOLERANCE, mode="compare"),
        builder="tilesim.reference.cases.dsa:dsa_make_case",
        soc=c.soc,
        status=c.status,
        notes={"seed_note": _SEED_NOTE},
    )


#: the registry's view of :data:`DSA_CASES` (``tilesim.shared.registry.case_schema.CaseInfo``)
CASE_INFO: dict[str, CaseInfo] = {name: _case_info(c) for name, c in DSA_CASES.items()}

_DEFAULTS = {
    "b": 2,
    "s1": 2,
    "actual_seq": (300, 1000),
    "nq": DEEPSEEK_V32.num_q_heads,
    "n_kv": DEEPSEEK_V32.num_kv_heads,
    "topk": DEEPSEEK_V32.topk,
    "block_size": DEEPSEEK_V32.block_size,
    "softmax_scale": DEEPSEEK_V32.test_softmax_scale,
    "quant": "fp8",
    "layout": "pypto",
    "preset": "decode",
    "tiling": None,
    "topk_rule": "seeds",
    "invalid_frac": 0.0,
    "poison_unreached": False,
    "chunk_rows": CHUNK_ROWS,
    "progress": None,
}


# ----------------------------------------------------------------------------- builders


def build_block_table(
    actual_seq: Sequence[int], block_size: int, rng: np.random.Generator
) -> tuple[np.ndarray, int]:
    """Seeds' block table: ``(table int32 [B, ceil(max/bs)], block_num)`` (unused = -1)."""
    per = [math.ceil(a / block_size) for a in actual_seq]
    block_num = sum(per)
    width = max(math.ceil(max(actual_seq) / block_size), 0)
    table = np.full((len(actual_seq), width), -1, dtype=np.int32)
    perm = rng.permutation(block_num).astype(np.int32)
    k = 0
    for b, n in enumerate(per):
        table[b, :n] = perm[k : k + n]
        k += n
    return table, block_num


def build_topk_indices(
    actual_seq: Sequence[int],
    s1: int,
    topk: int,
    rule: str,
    rng: np.random.Generator,
    invalid_frac: float = 0.0,
    rng_invalid: np.random.Generator | None = None,
) -> np.ndarray:
    """Top-k indices ``[B*s1, topk]`` int32 by ``rule`` (``"seeds"`` or ``"causal"``)."""
    n_b = len(actual_seq)
    out = np.zeros((n_b * s1, topk), dtype=np.int32)
    for b, act in enumerate(actual_seq):
        for s in range(s1):
            r = b * s1 + s
            if rule == "seeds":
                n = min(act, topk)
                if n < topk:
                    out[r, :n] = np.arange(n, dtype=np.int32)
                else:
                    out[r] = rng.permutation(topk).astype(np.int32)
            elif rule == "causal":
                span = max(act - s1 + 1 + s, 0)
                cur = min(span, topk)
                out[r, :cur] = rng.choice(span, size=cur, replace=False).astype(np.int32)
                out[r, cur:] = -1
            else:
                raise ValueError(f"topk_rule: expected one of {TOPK_RULES}, got {rule!r}")
    if invalid_frac > 0:
        rng_invalid = rng_invalid if rng_invalid is not None else rng
        for b, act in enumerate(actual_seq):
            for s in range(s1):
                cur = min(max(act - s1 + 1 + s, 0), topk)
                drop = rng_invalid.random(cur) < invalid_frac
                out[b * s1 + s, :cur][drop] = -1
    return out


def random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` uniform random bytes (``n % 8 == 0``): the generator's raw 64-bit outputs, little
    endian. Consecutive calls concatenate, so chunking never changes the bytes."""
    if n % 8:
        raise ValueError(f"n: expected a multiple of 8, got {n}")
    raw = rng.bit_generator.random_raw(n // 8)
    return np.asarray(raw, dtype="<u8").view(np.uint8)


def grid_bf16(byte_values: np.ndarray) -> np.ndarray:
    """Grid bytes (uint8) -> BF16 values ``int8(b)/128`` of the same shape."""
    return grid_bf16_bits().take(byte_values).view(BF16)


def reached_rows(
    topk_indices: np.ndarray,
    block_table: np.ndarray,
    actual_seq: Sequence[int],
    s1: int,
    topk: int,
    block_size: int,
    n_rows: int,
) -> np.ndarray:
    """bool ``[n_rows]``: cache rows some used, non-``-1`` top-k entry reaches."""
    hit = np.zeros(n_rows, dtype=bool)
    for b, act in enumerate(actual_seq):
        for s in range(s1):
            cur = min(max(act - s1 + 1 + s, 0), topk)
            pos = topk_indices[b * s1 + s, :cur].astype(np.int64)
            pos = pos[pos != -1]
            blocks = block_table[b].astype(np.int64)[pos // block_size]
            hit[blocks * block_size + pos % block_size] = True
    return hit


def _poison_fields(n: int, qdtype: np.dtype):
    nope = np.full((n, NOPE), 0x7F, dtype=np.uint8).view(qdtype)
    rope = np.full((n, ROPE), 0x7FC0, dtype=np.uint16).view(BF16)
    scales = np.full((n, NSCALES), np.nan, dtype=np.float32)
    return nope, rope, scales


def build_cache(
    n_rows: int,
    quant: str,
    layout: str,
    rng_nope: np.random.Generator,
    rng_rope: np.random.Generator,
    *,
    chunk_rows: int = CHUNK_ROWS,
    progress=None,
) -> dict[str, np.ndarray]:
    """The quantized cache of ``n_rows`` grid-uniform tokens, built ``chunk_rows`` at a time.

    Returns ``{"nope_cache": [rows, 656]}`` for ``"pypto"`` / ``"flashmla"``, or ``{"kn_quant",
    "kr", "kn_scales"}`` for ``"kv_split"``. The bytes do not depend on ``chunk_rows``.
    """
    qdt = quant_dtype(quant)
    if is_packed(layout):
        out = {"nope_cache": np.empty((n_rows, PYPTO_ROW_BYTES), dtype=qdt)}
    else:
        out = {
            "kn_quant": np.empty((n_rows, NOPE), dtype=qdt),
            "kr": np.empty((n_rows, ROPE), dtype=BF16),
            "kn_scales": np.empty((n_rows, NSCALES), dtype=np.float32),
        }
    bar = progress_bar(n_rows, progress, "dsa cache", unit="row")
    try:
        for r0 in range(0, n_rows, chunk_rows):
            n = min(chunk_rows, n_rows - r0)
            nope_bytes = random_bytes(rng_nope, n * NOPE).reshape(n, NOPE)
            rope_bytes = random_bytes(rng_rope, n * ROPE).reshape(n, ROPE)
            q, scales = quantize_grid_rows(nope_bytes, quant)
            rope = grid_bf16(rope_bytes)
            if not is_packed(layout):
                out["kn_quant"][r0 : r0 + n] = q
                out["kr"][r0 : r0 + n] = rope
                out["kn_scales"][r0 : r0 + n] = scales
            else:
                out["nope_cache"][r0 : r0 + n] = pack_rows(q, rope, scales, layout)
            if bar is not None:
                bar.update(n)
    finally:
        if bar is not None:
            bar.close()
    return out


def poison_rows(cache: dict[str, np.ndarray], mask: np.ndarray, layout: str) -> None:
    """Overwrite the cache rows where ``mask`` is True with NaN fields (in place)."""
    n = int(mask.sum())
    if n == 0:
        return
    if not is_packed(layout):
        nope, rope, scales = _poison_fields(1, cache["kn_quant"].dtype)
        cache["kn_quant"][mask] = nope
        cache["kr"][mask] = rope
        cache["kn_scales"][mask] = scales
    else:
        nope, rope, scales = _poison_fields(1, cache["nope_cache"].dtype)
        cache["nope_cache"][mask] = pack_rows(nope, rope, scales, layout)


def _as_actual_seq(actual_seq, b) -> tuple[int, ...]:
    if isinstance(actual_seq, (list, tuple)) and not actual_seq:
        raise ValueError("actual_seq: expected at least one batch")
    if b is not None:
        b = check_int(b, "b", lo=1)
    if isinstance(actual_seq, (int, np.integer)) and not isinstance(actual_seq, bool):
        if b is None:
            raise ValueError("actual_seq: an int needs b (the batch count)")
        acts = (int(actual_seq),) * b
    elif isinstance(actual_seq, (list, tuple)):
        acts = tuple(check_int(a, "actual_seq[]") for a in actual_seq)
    else:
        raise TypeError(f"actual_seq: expected an int or a list of ints, got {actual_seq!r}")
    if any(a < 0 for a in acts):
        raise ValueError(f"actual_seq: expected lengths >= 0, got {list(acts)}")
    if b is not None and len(acts) != b:
        raise ValueError(f"actual_seq: expected {b} lengths (b = {b}), got {len(acts)}")
    return acts


def _case_tiling(tiling, preset) -> SaTileShapeConfig:
    """The case's tile config: ``tiling``, else ``preset``'s."""
    tiling = tiling_argument(tiling)
    return SaTileShapeConfig.preset(preset) if tiling is None else tiling


def _merged_params(name, params: dict) -> tuple[dict, DsaCase | None]:
    """Defaults, then the named case's shape and recipe, then the caller's overrides."""
    unknown = set(params) - set(_DEFAULTS)
    if unknown:
        raise TypeError(
            f"dsa_make_case: unknown parameter(s) {sorted(unknown)}; expected some of "
            f"{sorted(_DEFAULTS)}"
        )
    p = dict(_DEFAULTS)
    case = None
    if name is not None:
        case = DSA_CASES.get(name)
        if case is None:
            raise ValueError(f"name: unknown case {name!r}; expected one of {sorted(DSA_CASES)}")
        p.update(b=case.b, s1=case.s1, actual_seq=case.actual_seq, quant=case.quant,
                 layout=case.layout, preset=case.preset)  # fmt: skip
    p.update(params)
    if "b" in params and "actual_seq" not in params and name is None:
        p["actual_seq"] = 1000  # b sequences of 1000 tokens
    if "actual_seq" in params and "b" not in params and isinstance(p["actual_seq"], (list, tuple)):
        p["b"] = len(p["actual_seq"])
    return p, case


def _checked(p: dict) -> dict:
    """The builder's parameters checked with :mod:`tilesim.shared.validate` (a new dict)."""
    q = dict(p)
    q["actual_seq"] = _as_actual_seq(p["actual_seq"], p["b"])
    for k in ("s1", "nq", "topk", "block_size", "chunk_rows"):
        q[k] = check_int(p[k], k, lo=1)
    if check_int(p["n_kv"], "n_kv", lo=1) != 1:
        raise ValueError(f"n_kv: expected 1 (one latent KV head), got {p['n_kv']!r}")
    q["softmax_scale"] = check_float(p["softmax_scale"], "softmax_scale", positive=True, fp32=True)
    check_choice(p["quant"], "quant", QUANT_RULES)
    check_choice(p["layout"], "layout", CACHE_LAYOUTS)
    check_choice(p["topk_rule"], "topk_rule", TOPK_RULES)
    q["invalid_frac"] = check_float(p["invalid_frac"], "invalid_frac")
    if not 0 <= q["invalid_frac"] <= 1:
        raise ValueError(f"invalid_frac: expected a fraction in [0, 1], got {p['invalid_frac']!r}")
    check_bool(p["poison_unreached"], "poison_unreached")
    if p["progress"] is not None:
        check_bool(p["progress"], "progress")
    q["tiling"] = _case_tiling(p["tiling"], p["preset"])
    _check_sizes(q)
    return q


def _check_sizes(q: dict) -> None:
    """Bound the arrays the builder allocates (Python ints: a ``ValueError`` naming the
    parameters, never a ``MemoryError`` or a wrapped-around shape)."""
    acts, s1, nq, topk, bs = (q[k] for k in ("actual_seq", "s1", "nq", "topk", "block_size"))
    tokens = len(acts) * s1
    check_elements((tokens * nq, NOPE + ROPE), "actual_seq, s1, nq", "the queries")
    check_elements((tokens, topk), "actual_seq, s1, topk", "topk_indices")
    rows = sum(-(-a // bs) for a in acts) * bs + bs
    check_elements((rows, PYPTO_ROW_BYTES), "actual_seq, block_size", "the cache")


def _build_inputs(p: dict, seed: int) -> tuple[dict, int, int]:
    """``(inputs, block_num, poisoned_rows)`` from the checked parameters (module recipe)."""
    acts, s1, nq, topk, bs = p["actual_seq"], p["s1"], p["nq"], p["topk"], p["block_size"]
    streams = [np.random.default_rng(c) for c in np.random.SeedSequence(seed).spawn(6)]
    rng_bt, rng_topk, rng_q, rng_nope, rng_rope, rng_invalid = streams
    block_table, block_num = build_block_table(acts, bs, rng_bt)
    topk_indices = build_topk_indices(
        acts, s1, topk, p["topk_rule"], rng_topk, p["invalid_frac"], rng_invalid
    )
    n_q_rows = len(acts) * s1 * nq
    q = grid_bf16(random_bytes(rng_q, n_q_rows * (NOPE + ROPE))).reshape(n_q_rows, NOPE + ROPE)
    cache = build_cache(
        block_num * bs, p["quant"], p["layout"], rng_nope, rng_rope,
        chunk_rows=p["chunk_rows"], progress=p["progress"],
    )  # fmt: skip
    n_poisoned = 0
    if p["poison_unreached"]:
        hit = reached_rows(topk_indices, block_table, acts, s1, topk, bs, block_num * bs)
        n_poisoned = int((~hit).sum())
        poison_rows(cache, ~hit, p["layout"])
    inputs = {
        "query_nope": np.ascontiguousarray(q[:, :NOPE]),
        "query_rope": np.ascontiguousarray(q[:, NOPE:]),
        **cache,
        "topk_indices": topk_indices,
        "block_table": block_table,
        "kv_act_seqs": np.asarray(acts, dtype=np.int32),
    }
    return inputs, block_num, n_poisoned


def dsa_make_case(name: str | None = None, *, seed: int = 0, **params) -> dict:
    """Build one sparse-attention case (module docstring: the recipe).

    Args:
        name: a key of :data:`DSA_CASES` (its shape, quant rule, layout and tile preset become
            the defaults), or ``None`` for a small ad-hoc case.
        seed: seeds the NumPy streams (``SeedSequence(seed).spawn(6)``); same seed, same bytes.
        **params: overrides — ``b``, ``s1``, ``actual_seq`` (int or list; ``b`` alone gives ``b``
            sequences of 1000 tokens; no name and no ``b``: lengths 300 and 1000), ``nq``, ``n_kv``,
            ``topk``, ``block_size``, ``softmax_scale``, ``quant`` (:data:`QUANT_RULES`),
            ``layout`` (``"pypto"``, ``"flashmla"``, ``"kv_split"``), ``preset`` or ``tiling``,
            ``topk_rule`` (``"seeds"``,
            ``"causal"``), ``invalid_frac``, ``poison_unreached``, ``chunk_rows``, ``progress``
            (a bool or None: the cache-building bar).

    Returns:
        The case dict of :func:`tilesim.shared.registry.case_schema.make_case`:
        ``getattr(tilesim.reference, case["op"])(**case["inputs"], **case["params"])`` is the
        golden; ``tolerance`` is the seeds' rule (atol 1e-4, rtol 5e-3, ratio 0.005, mode
        ``"compare"``); ``meta`` holds the seed, the SoC marks, the seeds' status and entry, and
        what the case was built from.
    """
    seed = check_int(seed, "seed", lo=0)
    p, case = _merged_params(name, params)
    p = _checked(p)
    inputs, block_num, n_poisoned = _build_inputs(p, seed)
    params_out = {
        "nq": p["nq"], "n_kv": 1, "softmax_scale": p["softmax_scale"], "topk": p["topk"],
        "block_size": p["block_size"], "tiling": p["tiling"],
    }  # fmt: skip
    op = "sparse_attention_antiquant_kv_split"
    if is_packed(p["layout"]):
        op = "sparse_attention_antiquant"
        params_out["layout"] = p["layout"]
    meta = {
        "seed": seed,
        "soc": case.soc if case else ("950", "910b"),
        "status": case.status if case else "ad hoc",
        "entry": case.entry if case else None,
        "b": len(p["actual_seq"]),
        "s1": p["s1"],
        "actual_seq": list(p["actual_seq"]),
        "block_num": block_num,
        "quant": p["quant"],
        "layout": p["layout"],
        "topk_rule": p["topk_rule"],
        "invalid_frac": p["invalid_frac"],
        "poisoned_rows": n_poisoned,
    }
    return make_case(
        name=name, op=op, inputs=inputs, params=params_out,
        tolerance=tolerance(**SEEDS_TOLERANCE, mode="compare"), meta=meta,
    )  # fmt: skip


__all__ = [
    "CASE_INFO",
    "DSA_CASES",
    "QUANT_RULES",
    "SEEDS_TOLERANCE",
    "TOPK_RULES",
    "DsaCase",
    "build_block_table",
    "build_cache",
    "build_topk_indices",
    "case_summary",
    "dsa_make_case",
    "grid_quant_tables",
    "quantize_grid_rows",
    "reached_rows",
]
