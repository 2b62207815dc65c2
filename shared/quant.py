"""Quantizers for the DeepSeek-V3.2 MLA latent ("nope", 512 values per token row).

One FP32 scale per group of 128 values (4 per row). All arithmetic is FP32, as in the torch
goldens the kernels are judged against:

* ``quantize_latent_fp8`` — the seeds' rule: ``s = max(amax, 1e-8) / 448``,
  ``q = e4m3(clamp(x / s, -448, 448))`` (RNE).
* ``quantize_latent_fp8_ue8m0`` — FlashMLA / DeepSeek V3.2: ``s = 2^ceil(log2(max(amax/448,
  1e-4)))`` (a power of two, so dequantization is exact), ``q = e4m3(clamp(x / s))``.
* ``quantize_latent_int8`` — the 910B variant: ``s = max(amax, 1e-8) / 127``,
  ``q = int8(clamp(round_half_even(x / s), -128, 127))``.
* ``dequantize_latent`` — what every kernel does on load: ``bf16(fp32(q) * s)``.

Quantizers for the DeepSeek-V3.2 lightning-indexer q and k (one scale per 128-value vector:
per token and index head for q, per token for k; ``docs/ops/dsa_indexer.md``):

* ``quantize_index_int8`` — the Ascend INT8 rule (per token-head): ``amax = max(max|x|,
  amax_floor)``, ``q = int8(clip(round_half_even(x * fp32(127 / amax)), -127, 127))``, scale
  ``fp16(fp32(amax / 127))``. ``amax_floor`` defaults to 1e-8 (an all-zero vector gives
  codes 0); pypto-gym's prolog test uses none.
* ``quantize_index_fp8`` — DeepSeek ``act_quant`` / DeepGEMM: ``amax = max(max|x|,
  amax_floor)`` (default 1e-4, the DeepSeek and DeepGEMM floor), ``s = fp32(amax / 448)`` or,
  with ``ue8m0=True``, ``s = 2^ceil(log2(amax / 448))`` (exact), ``q = e4m3(clamp(x / s,
  -448, 448))``.
* ``e4m3_to_fp32`` — the exact widening of FP8 codes by table look-up.

Sources: the seeds' tests ``hicann/pypto-gym:tests/ops/experimental/ops_transformer/
sparse_attention_antiquant_{fp8,kv_split}/``, ``deepseek-ai/FlashMLA:tests/quant.py``,
``deepseek-ai/DeepSeek-V3.2-Exp:inference/kernel.py`` (``act_quant``); the rules side by side
in docs/sources.md#deepseek-sparse-attention. Indexer: ``hicann/pypto-gym:tests/ops/
deepseek_v32_exp/test_lightning_indexer_prolog_quant.py`` (INT8), ``act_quant`` above and
``deepseek-ai/DeepGEMM:tests/test_attention.py`` (FP8); docs/ops/dsa_indexer.md.

Arguments follow :mod:`tilesim.shared.validate` (NumPy arrays or torch tensors, BF16/FP8 and
``requires_grad`` tensors included; the results are NumPy arrays; inputs are never written).
"""

from __future__ import annotations

import numpy as np
from tilesim.shared.casts import BF16, FP8_E4M3, FP8_E4M3_MAX, INT8_QMAX, to_bf16, to_fp8_e4m3
from tilesim.shared.validate import (
    check_array,
    check_bool,
    check_choice,
    check_finite,
    check_float,
    check_pos_int,
    host_data,
    raise_at_first,
    shape_of,
)

QUANT_GROUP = 128
#: the promotions of DeepSeek's FP8 block GEMM (``fp8_gemm``), ``acc += partial * FP32(sa *
#: sb)`` per 128-deep K block: ``"fma"`` one rounding (a fused multiply-add, as nvcc's default
#: ``--fmad=true`` builds it), ``"two_roundings"`` the product rounded to FP32, then the sum
#: (:func:`tilesim.reference.util.arith.block_scaled_matmul_fp32`, ``docs/numerics.md``)
FP8_PROMOTIONS = ("fma", "two_roundings")
#: how :func:`quantize_index_int8` forms its code factor and FP16 scale (``"reciprocal"``:
#: pypto-gym's prolog golden, ``127 * (1 / amax)`` and ``1 / factor``)
INDEX_INT8_SCALE_RULES = ("amax/127", "reciprocal")
#: the smallest ``amax_floor`` of :func:`quantize_index_fp8`, ``225 * 2**-149`` (~3.15e-43):
#: below it the FP32 scale ``amax_floor / 448`` rounds to 0 (codes ``x / 0``, NaN)
INDEX_FP8_AMAX_FLOOR_MIN = 225 * 2.0**-149
#: the smallest FP32 ``amax`` of :func:`quantize_index_int8` per scale rule (~3.7322e-37, one
#: FP32 ULP apart): below it the FP32 code factor ``127 / amax`` (``"amax/127"``) or ``(1 /
#: amax) * 127`` (``"reciprocal"``) overflows to inf (codes ``0 * inf``, NaN)
INDEX_INT8_AMAX_MIN = {"amax/127": float.fromhex("0x1.fc0002p-122"),
                       "reciprocal": float.fromhex("0x1.fc0004p-122")}  # fmt: skip
#: the largest FP32 ``amax`` of :func:`quantize_index_int8` whose FP16 scale is finite, per
#: scale rule (~127 * 65520: ``fp32(amax / 127)`` or ``fp32(1 / f)`` at 65520 or above, FP16's
#: max 65504 plus half an ULP, rounds to inf)
INDEX_INT8_AMAX_MAX = {"amax/127": 8321039.5, "reciprocal": 8321040.0}
#: FP32 value of every FP8 E4M3FN bit pattern (ml_dtypes' own widening, NaNs included): a table
#: look-up gives the same bits as ``astype(float32)`` about 10x faster
with np.errstate(invalid="ignore"):
    _E4M3_TO_FP32 = np.arange(256, dtype=np.uint8).view(FP8_E4M3).astype(np.float32)
_E4M3_TO_FP32.flags.writeable = False


def _groups(x, name: str) -> np.ndarray:
    """``x [rows, 128*g]`` (BF16 or FP32) -> FP32 view ``[rows, g, 128]``."""
    check_array(x, name, dtype=(BF16, np.float32))
    shp = shape_of(x, name)
    if len(shp) != 2 or shp[1] % QUANT_GROUP or shp[1] == 0:
        raise ValueError(f"{name}: expected shape [rows, 128*g] (e.g. [rows, 512]), got {shp}")
    a = host_data(x, name)
    check_finite(a, name)  # quantizers need finite input
    return a.astype(np.float32).reshape(a.shape[0], a.shape[1] // QUANT_GROUP, QUANT_GROUP)


def _amax(g: np.ndarray) -> np.ndarray:
    return np.abs(g).max(axis=2)  # FP32 [rows, ngroups]


def _ue8m0(s: np.ndarray) -> np.ndarray:
    """The UE8M0 scale of positive FP32 ``s``: the power of two ``2^ceil(log2(s))``, exact.
    ``frexp`` gives ``s = m * 2^e`` with ``m`` in ``[0.5, 1)``, so ``ceil(log2(s)) = e - (m ==
    0.5)``."""
    m, e = np.frexp(s)
    return np.ldexp(np.float32(1.0), e - (m == 0.5)).astype(np.float32)


def e4m3_to_fp32(codes) -> np.ndarray:
    """Exact FP32 value of every FP8 E4M3FN code (or raw ``uint8`` byte read as one), NaN codes
    included (a table look-up: the same bits as ml_dtypes' ``astype(float32)``)."""
    check_array(codes, "e4m3_to_fp32(codes)", dtype=(FP8_E4M3, np.uint8))
    a = host_data(codes, "e4m3_to_fp32(codes)")
    return np.take(_E4M3_TO_FP32, np.ascontiguousarray(a).view(np.uint8))


def _index_vectors(x, name: str) -> np.ndarray:
    """``x [..., 128]`` (BF16 or FP32, finite) -> FP32 copy of the same shape."""
    check_array(x, name, dtype=(BF16, np.float32))
    shp = shape_of(x, name)
    if len(shp) < 1 or shp[-1] != QUANT_GROUP:
        raise ValueError(f"{name}: expected shape [..., 128] (one vector per row), got {shp}")
    a = host_data(x, name)
    check_finite(a, name)
    return a.astype(np.float32)


def _floor(amax_floor, name: str) -> np.float32:
    v = check_float(amax_floor, name, fp32=True)
    if v < 0:
        raise ValueError(f"{name}: expected a value >= 0, got {amax_floor!r}")
    return np.float32(v)


def _int8_floor(amax_floor, rule: str) -> np.float32:
    """``amax_floor`` as FP32: 0 or in ``[INDEX_INT8_AMAX_MIN, INDEX_INT8_AMAX_MAX]``."""
    floor = _floor(amax_floor, "amax_floor")
    lo, hi = np.float32(INDEX_INT8_AMAX_MIN[rule]), np.float32(INDEX_INT8_AMAX_MAX[rule])
    if 0 < floor < lo:
        raise ValueError(
            f"amax_floor: expected 0 or a value >= {lo!s} (the FP32 code factor overflows "
            f"below it, scale_rule={rule!r}), got {amax_floor!r}"
        )
    if floor > hi:
        raise ValueError(
            f"amax_floor: expected a value <= {float(hi)!r} (the FP16 scale overflows above "
            f"it, scale_rule={rule!r}), got {amax_floor!r}"
        )
    return floor


def quantize_index_int8(
    x, *, amax_floor: float = 1e-8, scale_rule: str = "amax/127"
) -> tuple[np.ndarray, np.ndarray]:
    """Indexer INT8 rule per 128-vector: ``(codes int8 [..., 128], scales float16 [...])``.

    ``amax = max(max|x|, amax_floor)`` (FP32); codes ``clip(rint(x * fp32(127 / amax)), -127,
    127)`` (half to even); scale ``fp16(fp32(amax / 127))`` (RNE). ``amax_floor > 0`` keeps an
    all-zero vector finite (its codes are 0); ``0`` is pypto-gym's floor-less rule and then
    needs a non-zero vector. ``scale_rule="reciprocal"`` is pypto-gym's prolog golden as
    torch evaluates it (``127.0 / amax`` is ``reciprocal(amax) * 127`` there): code factor
    ``f = fp32(fp32(1 / amax) * 127)``, codes ``rint(x * f)``, scale ``fp16(fp32(1 / f))``;
    ``f`` can differ from ``fp32(127 / amax)`` by an FP32 ULP, which moves a code sitting
    on a half and, rarely, the FP16 scale.

    Limits (the FP32 code factor and the FP16 scale, per rule): ``amax_floor`` is 0 or in
    ``[INDEX_INT8_AMAX_MIN, INDEX_INT8_AMAX_MAX]`` (about ``[3.7322e-37, 8.3210e6]``); with
    ``amax_floor=0`` every vector's ``max|x|`` must be at least ``INDEX_INT8_AMAX_MIN``
    (``ValueError`` naming the vector). A vector with ``max|x|`` above ``INDEX_INT8_AMAX_MAX``
    gets its rule's codes and the FP16 scale ``inf`` (the overflow the device writes; no
    error, no NumPy warning); below ``127 * 2**-25`` (~3.8e-6) the FP16 scale is 0."""
    check_choice(scale_rule, "scale_rule", INDEX_INT8_SCALE_RULES)
    name = "quantize_index_int8(x)"
    g = _index_vectors(x, name)
    floor = _int8_floor(amax_floor, scale_rule)
    amax = np.maximum(np.abs(g).max(axis=-1), floor)
    if floor == 0:
        lo = np.float32(INDEX_INT8_AMAX_MIN[scale_rule])

        def message(i: int) -> str:
            vector = [int(j) for j in np.unravel_index(i, amax.shape)]
            return (
                f"{name}: expected max|x| >= {lo!s} in every vector with amax_floor=0 (the FP32 "
                f"code factor overflows below it; an all-zero vector needs amax_floor > 0), got "
                f"{amax.flat[i]!s} in vector {vector}"
            )

        raise_at_first((amax < lo).reshape(-1), message)
    if scale_rule == "reciprocal":
        inv = (np.float32(1) / amax) * np.float32(INT8_QMAX)  # two FP32 roundings
    else:
        inv = np.float32(INT8_QMAX) / amax  # FP32 quotient
    codes = np.clip(np.rint(g * inv[..., None]), -127, 127).astype(np.int8)
    scale = np.float32(1) / inv if scale_rule == "reciprocal" else amax / np.float32(INT8_QMAX)
    with np.errstate(over="ignore"):  # max|x| > INDEX_INT8_AMAX_MAX: FP16 inf (docstring)
        return codes, scale.astype(np.float16)


def quantize_index_fp8(
    x, *, ue8m0: bool = False, amax_floor: float = 1e-4
) -> tuple[np.ndarray, np.ndarray]:
    """Indexer FP8 rule per 128-vector: ``(codes e4m3 [..., 128], scales float32 [...])``.

    ``amax = max(max|x|, amax_floor)``; ``s = fp32(amax / 448)``, or with ``ue8m0`` the power
    of two ``2^ceil(log2(amax / 448))`` (exponent from ``frexp``, exact); codes ``e4m3(clamp(x
    / s, -448, 448))`` (RNE). ``amax_floor`` must be at least ``INDEX_FP8_AMAX_FLOOR_MIN =
    225 * 2**-149`` (~3.15e-43; below it ``fp32(amax_floor / 448)`` rounds to 0) (DeepSeek and
    DeepGEMM: 1e-4; vLLM's q path: 1e-10)."""
    check_bool(ue8m0, "ue8m0")
    g = _index_vectors(x, "quantize_index_fp8(x)")
    floor = _floor(amax_floor, "amax_floor")
    lo = np.float32(INDEX_FP8_AMAX_FLOOR_MIN)
    if not floor >= lo:
        raise ValueError(
            f"amax_floor: expected a value >= {lo!s} (the FP32 scale amax_floor / 448 rounds to "
            f"0 below it), got {amax_floor!r}"
        )
    amax = np.maximum(np.abs(g).max(axis=-1), floor)
    scale = amax / np.float32(FP8_E4M3_MAX)
    if ue8m0:
        scale = _ue8m0(scale)
    codes = to_fp8_e4m3(g / scale[..., None], saturate=True)
    return codes, scale.astype(np.float32)


def quantize_latent_fp8(x) -> tuple[np.ndarray, np.ndarray]:
    """Seeds' FP8 rule. Returns ``(q float8_e4m3fn [rows, D], scales float32 [rows, D/128])``."""
    g = _groups(x, "quantize_latent_fp8(x)")
    scale = np.maximum(_amax(g), np.float32(1e-8)) / np.float32(FP8_E4M3_MAX)
    q = to_fp8_e4m3(g / scale[:, :, None], saturate=True)
    return q.reshape(g.shape[0], g.shape[1] * QUANT_GROUP), scale.astype(np.float32)


def quantize_latent_fp8_ue8m0(x) -> tuple[np.ndarray, np.ndarray]:
    """FlashMLA power-of-two (UE8M0) rule. Returns ``(q e4m3 [rows, D], scales fp32)``."""
    g = _groups(x, "quantize_latent_fp8_ue8m0(x)")
    s_inv = np.maximum(_amax(g) / np.float32(FP8_E4M3_MAX), np.float32(1e-4))
    scale = _ue8m0(s_inv)
    q = to_fp8_e4m3(g / scale[:, :, None], saturate=True)
    return q.reshape(g.shape[0], g.shape[1] * QUANT_GROUP), scale


def quantize_latent_int8(x) -> tuple[np.ndarray, np.ndarray]:
    """910B INT8 rule. Returns ``(q int8 [rows, D], scales float32 [rows, D/128])``."""
    g = _groups(x, "quantize_latent_int8(x)")
    scale = np.maximum(_amax(g), np.float32(1e-8)) / np.float32(INT8_QMAX)
    q = np.clip(np.rint(g / scale[:, :, None]), -128, 127).astype(np.int8)
    return q.reshape(g.shape[0], g.shape[1] * QUANT_GROUP), scale.astype(np.float32)


def dequantize_latent(q, scales) -> np.ndarray:
    """``bf16(fp32(q) * scale_g)`` for ``q [rows, D]`` (e4m3 or int8), ``scales [rows, D/128]``."""
    q_name, s_name = "dequantize_latent(q)", "dequantize_latent(scales)"
    check_array(q, q_name, dtype=(FP8_E4M3, np.int8))
    check_array(scales, s_name, dtype=np.float32)
    qs = shape_of(q, q_name)
    if len(qs) != 2 or qs[1] % QUANT_GROUP:
        raise ValueError(f"{q_name}: expected shape [rows, 128*g], got {qs}")
    ng = qs[1] // QUANT_GROUP
    check_array(scales, s_name, shape=(qs[0], ng), layout="[rows, D/128]")
    # scales are not checked for NaN: unread (poisoned) cache rows may hold anything
    qa = host_data(q, q_name)
    sa = host_data(scales, s_name)
    if qa.dtype == FP8_E4M3:
        q32 = np.take(_E4M3_TO_FP32, qa.view(np.uint8))  # exact widening
    else:
        q32 = qa.astype(np.float32)
    deq = q32.reshape(qa.shape[0], ng, QUANT_GROUP) * sa[:, :, None]
    return to_bf16(deq.reshape(qa.shape))


def quant_int8_gym(v, group: int) -> tuple[np.ndarray, np.ndarray]:
    """pypto-gym's per-token INT8 quant over groups of ``group`` values of ``v [R, n]``
    (``s = FP32(FP32(1 / amax) * 127)``, torch's ``127 / amax``; pypto-gym
    models/deepseek_v32_exp golden ``quant``):
    ``(codes int8 [R, n], dequant scales FP32 [R, n // group])``. ``v``: BF16 or FP32,
    non-empty, finite; ``group``: a positive int dividing ``n``. A group whose ``s`` overflows
    (``amax`` 0, or below ~3.7e-37) gets codes 0 and scale 0."""
    check_array(v, "v", dtype=(BF16, np.float32), ndim=2, layout="[R, n]")
    rows, n = shape_of(v, "v")
    if rows == 0 or n == 0:
        raise ValueError(f"v: expected a non-empty [R, n] array, got shape {(rows, n)}")
    group = check_pos_int(group, "group")
    if n % group:
        raise ValueError(f"group: expected a divisor of n = {n}, got {group}")
    a = host_data(v, "v")
    check_finite(a, "v")
    g = np.asarray(a, dtype=np.float32).reshape(rows, -1, group)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # torch's ``127 / t`` is ``t.reciprocal() * 127``: two FP32 roundings (inf for amax 0)
        s = (np.float32(1) / amax) * np.float32(INT8_QMAX)
        y = g * s
    y = np.where(
        np.isfinite(s), y, np.float32(0)
    )  # all-zero group: codes 0 (x86 torch gives 0 too)
    codes = np.rint(y).astype(np.int32).astype(np.float16)  # round half even, int32, fp16
    codes = np.clip(np.trunc(codes), -128, 127).astype(np.int8)  # trunc, int8 (saturating)
    return codes.reshape(rows, n), (np.float32(1) / s).reshape(rows, -1).astype(np.float32)
