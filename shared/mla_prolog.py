"""The contract of the DeepSeek-V3.2 MLA prolog (op ``mla_prolog``): :class:`Args`,
:func:`check_meta`, :func:`check_values`, :func:`host_plan`, :func:`cost`, and the two paths'
defaults (:data:`PATH_DEFAULTS`). Everything here runs on host data and rounds nothing.

The prolog turns hidden states ``x [T, 7168]`` into the attention's queries (``query_nope [T,
128, 512]``, ``query_rope [T, 128, 64]``), the normalised ``q`` the indexer prolog reads
(``q_norm``, INT8 with a per-token scale on the INT8 path) and the new tokens' quantized
latent rows, written into the paged MLA cache at ``slot_mapping``. The arithmetic is
``docs/ops/mla_prolog.md``; the golden is :mod:`tilesim.reference.mla_prolog`.

Linears are chosen by the weights' dtypes (one rule per weight):

==============  ============================================================================
``w_dq``,       BF16 ``[7168, N]``, no scale: ``bf16(fp32(x @ w))``; or FP8 E4M3 ``[7168,
``w_dkv_kr``    N]`` with FP32 block scales ``[56, ceil(N/128)]`` (DeepSeek's ``fp8_gemm``)
``w_uq_qr``     INT8 ``[1536, 24576]`` with FP32 per-output-channel scales ``[24576]`` (pypto-gym:
                the normalised q is quantized per token first); FP8 with ``[12, 192]`` block
                scales (DeepSeek); or BF16 without scale
==============  ============================================================================

Weights are ``[K, N]`` (``x @ w``); DeepSeek's checkpoints store ``[N, K]`` with ``[N/128,
K/128]`` scales: pass both transposed. ``w_uk [128, 128, 512]`` BF16 is ``wkv_b`` viewed
``[128, 256, 512]`` and cut to its first 128 rows per head (DeepSeek's ``weight_dequant``
output on the FP8 path).

Slot rule: ``slot_mapping[t]`` is the physical cache row of token ``t`` (``block_table[b, p //
block_size] * block_size + p % block_size``); ``-1`` skips the token's cache write (vLLM's
padding); any other value outside ``[0, rows)``, a row named twice or a mapping that is not
``[T]`` is refused: the one slot rule of :mod:`tilesim.shared.layouts.slots`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.layouts.mla_cache import (
    CACHE_LAYOUTS,
    NOPE,
    NSCALES,
    PATH_CACHE_LAYOUT,
    PYPTO_ROW_BYTES,
    ROPE,
    is_packed,
)
from tilesim.shared.layouts.slots import NO_SLOT, check_slot_mapping, check_slot_mapping_meta
from tilesim.shared.quant import FP8_PROMOTIONS
from tilesim.shared.registry.op_record import Call, OpRecord, Output
from tilesim.shared.rope import PAIRINGS as ROPE_PAIRINGS
from tilesim.shared.validate import (
    check_array,
    check_choice,
    check_finite,
    check_float,
    check_trace,
    check_weight_values,
    dtype_of,
    host_data,
    shape_of,
)

HIDDEN = 7168
Q_LORA = 1536
HEADS = 128
QK_NOPE = 128
QK_ROPE = ROPE  # 64
Q_HEAD = QK_NOPE + QK_ROPE  # 192
KV_LORA = NOPE  # 512
KV_A = KV_LORA + QK_ROPE  # 576
BLOCK = 128  # DeepSeek's FP8 weight / activation block
INT8 = np.dtype(np.int8)

PATHS = ("int8", "fp8")
RMS_FORMS = ("gym_golden", "gym_kernel", "deepseek")
KV_QUANTS = ("int8_gym", "int8_seeds", "fp8_ue8m0_deepseek", "fp8_ue8m0_flashmla", "fp8_amax")
#: the storage dtype of each latent quant rule
KV_QUANT_DTYPE = {q: (INT8 if q.startswith("int8") else FP8_E4M3) for q in KV_QUANTS}

#: the defaults of each path: the public golden it reproduces (docs/ops/mla_prolog.md)
PATH_DEFAULTS = {
    # hicann/pypto-gym tests/ops/deepseek_v32_exp/test_mla_prolog_quant.py (mla_prolog_quant)
    "int8": {
        "rope_pairing": "deinterleave",
        "rms_form": "gym_golden",
        "rms_eps": 0.0,
        "kv_quant": "int8_gym",
        "cache_layout": PATH_CACHE_LAYOUT["int8"],
    },
    # deepseek-ai/DeepSeek-V3.2-Exp inference/model.py MLA.forward, FP8 KV-cache simulation
    "fp8": {
        "rope_pairing": "interleaved",
        "rms_form": "deepseek",
        "rms_eps": 1e-6,
        "kv_quant": "fp8_ue8m0_deepseek",
        "cache_layout": PATH_CACHE_LAYOUT["fp8"],
    },
}


class Args(NamedTuple):
    """The checked arguments of one call (:func:`check_meta`; ``values`` after
    :func:`check_values`, which replaces ``slot_mapping`` by a host int64 copy).

    ``linears``: ``{"q_a", "q_b", "kv_a"}`` -> ``"bf16"`` / ``"fp8_block"`` / ``"int8_channel"``;
    ``cache_rows``: rows of the latent cache; ``cache_shape``: the caller's shape of ``kv_cache``.
    """

    ins: object
    tokens: int
    linears: dict
    path: str
    rope_pairing: str
    rms_form: str
    rms_eps: np.float32
    kv_quant: str
    cache_layout: str
    cache_rows: int
    cache_shape: tuple
    slot_mapping: object = None
    values: bool = False
    fp8_promotion: str = "fma"  #: the FP8 linears' K-block promotion (FP8_PROMOTIONS)


class MlaPrologOutputs(NamedTuple):
    """The results of :func:`tilesim.reference.mla_prolog` and
    :func:`tilesim.device.mla_prolog`. ``q_norm``: INT8 ``[T, 1536]`` with ``q_norm_scale``
    FP32 ``[T, 1]`` when ``w_uq_qr`` is INT8, else BF16 ``[T, 1536]`` and ``None``. The caches
    are updated copies in the caller's shapes (``kr_cache``/``kv_scale_cache`` ``None`` for a
    packed layout)."""

    query_nope: object
    query_rope: object
    q_norm: object
    q_norm_scale: object
    kv_cache: object
    kr_cache: object
    kv_scale_cache: object


# ----------------------------------------------------------------------------- inputs
def prolog_inputs(
    x,
    w_dq,
    w_uq_qr,
    w_uq_qr_scale,
    w_uk,
    w_dkv_kr,
    gamma_cq,
    gamma_ckv,
    cos,
    sin,
    slot_mapping,
    kv_cache,
    kr_cache=None,
    kv_scale_cache=None,
    w_dq_scale=None,
    w_dkv_kr_scale=None,
):
    """The arrays of ``mla_prolog``, in order: BF16 ``x [T, 7168]``; ``w_dq [7168, 1536]``,
    ``w_uq_qr [1536, 24576]`` with ``w_uq_qr_scale`` (``None`` for BF16), BF16 ``w_uk [128, 128,
    512]``, ``w_dkv_kr [7168, 576]`` (linears: module docstring); BF16 ``gamma_cq [1536]``,
    ``gamma_ckv [512]``; ``cos``/``sin`` ``[T, 32]`` FP32 or ``[T, 64]`` BF16/FP32
    (:mod:`tilesim.shared.rope`); int ``slot_mapping [T]``; the latent cache: ``kv_cache`` packed
    ``[rows, 656]`` (``"pypto"``/``"flashmla"``) or, for ``"kv_split"``, ``kv_cache [rows, 512]``,
    ``kr_cache [rows, 64]`` BF16, ``kv_scale_cache [rows, 4]`` FP32 (or pypto-gym's ``[blocks,
    block_size, 1, d]`` forms); ``w_dq_scale`` / ``w_dkv_kr_scale`` for FP8 weights."""


def prolog_keywords(
    *,
    path: str = "int8",
    rope_pairing: str | None = None,
    rms_form: str | None = None,
    rms_eps: float | None = None,
    kv_quant: str | None = None,
    cache_layout: str | None = None,
    fp8_promotion: str = "fma",
):
    """The switches: ``path`` (``"int8"``: pypto-gym ``mla_prolog_quant``, 910B; ``"fp8"``:
    DeepSeek's reference, 950) sets the defaults of every other switch (:data:`PATH_DEFAULTS`);
    ``None`` takes the path's value. ``rope_pairing`` in :data:`tilesim.shared.rope.PAIRINGS`;
    ``rms_form`` in :data:`RMS_FORMS`; ``rms_eps`` >= 0; ``kv_quant`` in :data:`KV_QUANTS`;
    ``cache_layout`` in :data:`~tilesim.shared.layouts.mla_cache.CACHE_LAYOUTS`; ``fp8_promotion``
    in :data:`tilesim.shared.quant.FP8_PROMOTIONS`, the K-block promotion of every FP8 linear
    (``"fma"``: DeepSeek's ``fp8_gemm`` as nvcc builds it, one rounding; ``"two_roundings"``; no
    effect on BF16 / INT8 linears)."""


# ----------------------------------------------------------------------------- checks
def _switches(path, rope_pairing, rms_form, rms_eps, kv_quant, cache_layout) -> dict:
    check_choice(path, "path", PATHS)
    d = dict(PATH_DEFAULTS[path])
    given = {
        "rope_pairing": rope_pairing,
        "rms_form": rms_form,
        "rms_eps": rms_eps,
        "kv_quant": kv_quant,
        "cache_layout": cache_layout,
    }
    d.update({k: v for k, v in given.items() if v is not None})
    check_choice(d["rope_pairing"], "rope_pairing", ROPE_PAIRINGS)
    check_choice(d["rms_form"], "rms_form", RMS_FORMS)
    check_choice(d["kv_quant"], "kv_quant", KV_QUANTS)
    check_choice(d["cache_layout"], "cache_layout", CACHE_LAYOUTS)
    eps = check_float(d["rms_eps"], "rms_eps", fp32=True)
    if eps < 0:
        raise ValueError(f"rms_eps: expected a value >= 0, got {rms_eps!r}")
    d["rms_eps"] = np.float32(eps)
    return d


def _linear_kind(w, w_name: str, scale, s_name: str, k: int, n: int, *, int8_ok: bool) -> str:
    allowed = (BF16, FP8_E4M3, INT8) if int8_ok else (BF16, FP8_E4M3)
    check_array(w, w_name, dtype=allowed, shape=(k, n), layout="[K, N]")
    dt = dtype_of(w, w_name)
    if dt == BF16:
        if scale is not None:
            raise ValueError(f"{s_name}: expected None for a BF16 {w_name}, got an array")
        return "bf16"
    if scale is None:
        raise TypeError(f"{s_name}: expected an FP32 scale array for {dt} {w_name}, got None")
    if dt == INT8:
        check_array(scale, s_name, dtype=np.float32)
        if shape_of(scale, s_name) not in ((n,), (n, 1), (1, n)):
            got = shape_of(scale, s_name)
            raise ValueError(f"{s_name}: expected shape [{n}] (per output channel), got {got}")
        return "int8_channel"
    blocks = (-(-k // BLOCK), -(-n // BLOCK))
    check_array(scale, s_name, dtype=np.float32, shape=blocks, layout="[K/128, N/128] blocks")
    return "fp8_block"


def _check_caches(ins, layout: str, kv_dtype: np.dtype) -> tuple[int, tuple]:
    kv, kr, ks = ins.kv_cache, ins.kr_cache, ins.kv_scale_cache
    if is_packed(layout, "cache_layout"):
        for v, name in ((kr, "kr_cache"), (ks, "kv_scale_cache")):
            if v is not None:
                raise ValueError(f"{name}: expected None with cache_layout {layout!r}, got array")
        check_array(kv, "kv_cache", dtype=kv_dtype, ndim=2, layout="[rows, 656]")
        shp = shape_of(kv, "kv_cache")
        if shp[1] != PYPTO_ROW_BYTES:
            raise ValueError(f"kv_cache: expected shape [rows, 656] ({layout}), got {shp}")
        return shp[0], shp
    for v, name in ((kr, "kr_cache"), (ks, "kv_scale_cache")):
        if v is None:
            raise TypeError(f"{name}: expected an array with cache_layout 'kv_split', got None")
    check_array(kv, "kv_cache", dtype=kv_dtype)
    shp = shape_of(kv, "kv_cache")
    if len(shp) == 2 and shp[1] == NOPE:
        lead = shp[:1]
    elif len(shp) == 4 and shp[2:] == (1, NOPE):
        lead = shp[:3]
    else:
        raise ValueError(f"kv_cache: expected shape [rows, 512] or [blocks, bs, 1, 512], got {shp}")
    check_array(kr, "kr_cache", dtype=BF16, shape=lead + (ROPE,), layout="kv_cache's rows, 64")
    check_array(ks, "kv_scale_cache", dtype=np.float32, shape=lead + (NSCALES,), layout="rows, 4")
    return int(np.prod(lead)), shp


def _check_dense(ins) -> int:
    check_array(ins.x, "x", dtype=BF16, ndim=2, layout="[T, 7168]")
    t, h = shape_of(ins.x, "x")
    if h != HIDDEN:
        raise ValueError(f"x: expected shape [T, {HIDDEN}], got {(t, h)}")
    if t == 0:
        raise ValueError(f"x: expected at least one token (shape [T >= 1, {HIDDEN}]), got {(t, h)}")
    check_array(
        ins.w_uk, "w_uk", dtype=BF16, shape=(HEADS, QK_NOPE, KV_LORA), layout="[128,128,512]"
    )
    check_array(ins.gamma_cq, "gamma_cq", dtype=(BF16, np.float32), shape=(Q_LORA,))
    check_array(ins.gamma_ckv, "gamma_ckv", dtype=(BF16, np.float32), shape=(KV_LORA,))
    for name in ("cos", "sin"):
        check_array(getattr(ins, name), name, dtype=(BF16, np.float32), ndim=2, layout="[T, 32|64]")
        shp = shape_of(getattr(ins, name), name)
        if shp[0] != t or shp[1] not in (QK_ROPE // 2, QK_ROPE):
            raise ValueError(f"{name}: expected shape [{t}, 32] or [{t}, 64], got {shp}")
    check_slot_mapping_meta(ins.slot_mapping, t)
    return t


def check_meta(ins, *, path, rope_pairing, rms_form, rms_eps, kv_quant, cache_layout, trace=None,
               fp8_promotion="fma"):  # fmt: skip
    """Shapes, dtypes and switches of one call (``ins``: the namespace of
    :func:`prolog_inputs`), reading no value. ``ValueError`` / ``TypeError`` naming the argument,
    the expected and the actual value. Returns :class:`Args` (``values=False``)."""
    sw = _switches(path, rope_pairing, rms_form, rms_eps, kv_quant, cache_layout)
    check_choice(fp8_promotion, "fp8_promotion", FP8_PROMOTIONS)
    check_trace(trace)
    t = _check_dense(ins)
    linears = {
        "q_a": _linear_kind(ins.w_dq, "w_dq", ins.w_dq_scale, "w_dq_scale", HIDDEN, Q_LORA,
                            int8_ok=False),
        "q_b": _linear_kind(ins.w_uq_qr, "w_uq_qr", ins.w_uq_qr_scale, "w_uq_qr_scale", Q_LORA,
                            HEADS * Q_HEAD, int8_ok=True),
        "kv_a": _linear_kind(ins.w_dkv_kr, "w_dkv_kr", ins.w_dkv_kr_scale, "w_dkv_kr_scale",
                             HIDDEN, KV_A, int8_ok=False),
    }  # fmt: skip
    if sw["rope_pairing"] == "interleaved" and shape_of(ins.cos, "cos")[1] != QK_ROPE // 2:
        raise ValueError(
            f"cos: expected shape [{t}, 32] (one angle per pair) for rope_pairing 'interleaved', "
            f"got {shape_of(ins.cos, 'cos')}"
        )
    rows, cshape = _check_caches(ins, sw["cache_layout"], KV_QUANT_DTYPE[sw["kv_quant"]])
    return Args(
        ins, t, linears, path, sw["rope_pairing"], sw["rms_form"], sw["rms_eps"],
        sw["kv_quant"], sw["cache_layout"], rows, cshape, ins.slot_mapping, False, fp8_promotion,
    )  # fmt: skip


def check_int_values(args: Args) -> Args:
    """The slot checks (the small integer input a device wrapper reads on the host anyway:
    its cache write reads the slots there; the record's ``int_checks``), with
    :func:`check_values`' messages: ``slot_mapping`` entries ``-1`` or a row in ``[0,
    cache_rows)``, no row twice. Returns :class:`Args` with a host int64 ``slot_mapping`` and
    ``values=True`` (the float inputs are not checked)."""
    slots = check_slot_mapping(args.ins.slot_mapping, tokens=args.tokens, rows=args.cache_rows,
                               rows_of=f"rows of kv_cache {args.cache_shape}")  # fmt: skip
    return args._replace(slot_mapping=slots, values=True)


def check_data_values(args: Args) -> Args:
    """The scans of the float inputs (the record's ``scan_checks``): finite ``x``, gammas and
    ``cos``/``sin``; every weight and its scale by the rule both prologs share
    (:func:`tilesim.shared.validate.check_weight_values`: no NaN / inf, no E4M3 NaN code,
    finite scales, FP8 block scales ``> 0``). Reads every weight once (about 85 MB at full
    size, a bit test). Returns ``args``."""
    ins = args.ins
    for name in ("x", "gamma_cq", "gamma_ckv", "cos", "sin"):
        check_finite(host_data(getattr(ins, name), name), name)
    for w, linear in (("w_dq", "q_a"), ("w_uq_qr", "q_b"), ("w_dkv_kr", "kv_a")):
        check_weight_values(getattr(ins, w), w, getattr(ins, f"{w}_scale"), f"{w}_scale",
                            block=args.linears[linear] == "fp8_block")  # fmt: skip
    check_weight_values(ins.w_uk, "w_uk")
    return args


def check_values(args: Args) -> Args:
    """Every value check (the golden's): :func:`check_int_values` then
    :func:`check_data_values`. Returns :class:`Args` with a host int64 ``slot_mapping``
    (``values=True``)."""
    return check_data_values(check_int_values(args))


# ----------------------------------------------------------------------------- host rules
def host_plan(args: Args) -> np.ndarray:
    """The token rows that are written (slot not ``-1``), as int64 indices into ``x``."""
    if not args.values:
        raise TypeError("args: host_plan needs the Args of check_values")
    return np.flatnonzero(args.slot_mapping != NO_SLOT)


def cost(args: Args) -> dict:
    """``{flop, bytes}`` of one call: the four matmuls (2 per multiply-add) and the bytes of
    the weights, ``x``, the outputs and the written cache rows."""
    t = args.tokens
    flop = 2 * t * (HIDDEN * Q_LORA + Q_LORA * HEADS * Q_HEAD + HEADS * QK_NOPE * KV_LORA)
    flop += 2 * t * HIDDEN * KV_A
    wbytes = {"bf16": 2, "fp8_block": 1, "int8_channel": 1}
    weights = (
        HIDDEN * Q_LORA * wbytes[args.linears["q_a"]]
        + Q_LORA * HEADS * Q_HEAD * wbytes[args.linears["q_b"]]
        + HIDDEN * KV_A * wbytes[args.linears["kv_a"]]
        + HEADS * QK_NOPE * KV_LORA * 2
    )
    outs = t * (HEADS * (KV_LORA + QK_ROPE) * 2 + Q_LORA + 4)
    written = t if not args.values else int((np.asarray(args.slot_mapping) != NO_SLOT).sum())
    return {"flop": int(flop), "bytes": int(weights + t * HIDDEN * 2 + outs + written * 656)}


# ----------------------------------------------------------------------------- record
#: the op's record in the registry of ops (:mod:`tilesim.shared.registry.ops`)
RECORD = OpRecord(
    name="mla_prolog",
    calls=(
        Call("mla_prolog", "mla_prolog",
             (Output("query_nope", "float", ("token", "head")),
              Output("query_rope", "float", ("token", "head")),
              Output("q_norm", "codes", ("token",)), Output("q_norm_scale", "float", ("token",)),
              Output("kv_cache", "cache"), Output("kr_cache", "cache"),
              Output("kv_scale_cache", "cache")),
             signature=(prolog_inputs, prolog_keywords), judged_by="stages", device=True),
    ),
    cost=cost,
    int_checks=check_int_values,
    scan_checks=check_data_values,
    names={"MlaPrologOutputs": "mla_prolog"},
    # the INT8 kernel rounds where the golden does: every output bit for bit in the simulator
    budgets={"bit_exact": 1.0, "row_ulp": 0.0},
)  # fmt: skip


__all__ = [
    "RECORD",
    "KV_QUANTS",
    "MlaPrologOutputs",
    "PATHS",
    "PATH_DEFAULTS",
    "RMS_FORMS",
    "Args",
    "check_meta",
    "check_data_values",
    "check_int_values",
    "check_values",
    "cost",
    "host_plan",
    "prolog_inputs",
    "prolog_keywords",
]
