"""shared/quant.py under the argument policy of :mod:`tilesim.shared.validate`:
``quant_int8_gym`` checks ``v`` and ``group`` (kind, dtype, shape, finite values) and reads
torch tensors; the indexer quantizers refuse an ``amax_floor`` (or, with no floor, a vector)
whose FP32 scale or code factor would be 0 or inf, at the exact limits the rules' arithmetic
sets, and an FP16 scale overflow on ``x`` gives the documented inf without a NumPy warning."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from tilesim.shared.casts import to_bf16
from tilesim.shared.quant import (
    INDEX_FP8_AMAX_FLOOR_MIN,
    INDEX_INT8_AMAX_MAX,
    INDEX_INT8_AMAX_MIN,
    quant_int8_gym,
    quantize_index_fp8,
    quantize_index_int8,
)

F32 = np.float32
RULES = ["amax/127", "reciprocal"]


def _below(v: float) -> float:
    """The FP32 value just below FP32 ``v``."""
    return float(np.nextafter(F32(v), F32(0)))


def _above(v: float) -> float:
    """The FP32 value just above FP32 ``v``."""
    return float(np.nextafter(F32(v), F32(np.inf)))


def _factor(amax: float, rule: str) -> F32:
    """The FP32 code factor of ``quantize_index_int8``'s ``rule`` (its docstring)."""
    a = F32(amax)
    return (F32(1) / a) * F32(127) if rule == "reciprocal" else F32(127) / a


def _scale16(amax: float, rule: str) -> np.float16:
    """The FP16 scale of ``quantize_index_int8``'s ``rule`` (its docstring)."""
    s = F32(1) / _factor(amax, rule) if rule == "reciprocal" else F32(amax) / F32(127)
    return np.float16(s)


# ----------------------------------------------------------------------------- quant_int8_gym
@pytest.mark.parametrize("v, group, exc, pattern", [
    ([[1.0, 2.0, 3.0, 4.0]], 2, TypeError, r"^v: expected a numpy array or a torch tensor"),
    (np.ones((2, 4)), 4, TypeError, r"^v: expected dtype bfloat16 or float32, got float64"),
    (np.ones(4, F32), 4, ValueError, r"^v: expected a 2-D array \[R, n\], got shape \(4,\)"),
    (np.ones((0, 4), F32), 4, ValueError, r"^v: expected a non-empty \[R, n\] array"),
    (np.ones((2, 4), F32), 0, ValueError, r"^group: expected an int in \[1, inf\], got 0"),
    (np.ones((2, 4), F32), 3, ValueError, r"^group: expected a divisor of n = 4, got 3"),
    (np.ones((2, 4), F32), True, TypeError, r"^group: expected an int, got bool"),
])  # fmt: skip
def test_quant_int8_gym_checks_v_and_group(v, group, exc, pattern):
    """Lists, float64, a wrong rank, an empty ``v``, and a ``group`` that is not a positive
    int dividing the row are TypeError / ValueError naming ``v`` or ``group``."""
    with pytest.raises(exc, match=pattern):
        quant_int8_gym(v, group)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_quant_int8_gym_refuses_non_finite_values_naming_the_index(bad):
    """A NaN (codes 0, scale NaN) or an inf (code -128, scale inf) is a ValueError naming
    ``v`` and the first bad index."""
    v = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, bad, 2.0, 3.0]], F32)
    with pytest.raises(ValueError, match=r"^v: expected finite values, got .* at index \[1, 1\]"):
        quant_int8_gym(v, 2)


@pytest.mark.torch
def test_quant_int8_gym_reads_bf16_and_requires_grad_tensors_like_their_numpy_data(rng):
    """A BF16 tensor and a ``requires_grad`` FP32 tensor give the NumPy data's codes and
    scales bit for bit; the tensors are not written."""
    torch = pytest.importorskip("torch")
    from tilesim.shared.interop import to_torch

    a = to_bf16(rng.standard_normal((3, 8)).astype(F32))
    t = to_torch(a)
    before = t.clone()
    codes, scale = quant_int8_gym(t, 4)
    want_codes, want_scale = quant_int8_gym(a, 4)
    assert np.array_equal(codes, want_codes)
    assert np.array_equal(scale.view(np.uint32), want_scale.view(np.uint32))
    assert torch.equal(t, before)
    g = torch.tensor(a.astype(F32), requires_grad=True)
    assert np.array_equal(quant_int8_gym(g, 8)[0], quant_int8_gym(a.astype(F32), 8)[0])


# ----------------------------------------------------------------------------- FP8 floor
def test_fp8_floor_must_keep_the_scale_non_zero_at_the_exact_limit():
    """``fp32(amax_floor / 448)`` rounds to 0 below ``225 * 2**-149`` (an all-zero vector then
    got NaN codes): such a floor is a ValueError naming ``amax_floor``; the limit itself gives
    a positive scale, finite codes and no warning."""
    lo = F32(INDEX_FP8_AMAX_FLOOR_MIN)
    assert lo / F32(448) > 0 and F32(_below(lo)) / F32(448) == 0  # the exact limit
    z = np.zeros((1, 128), F32)
    for floor in (1e-44, _below(INDEX_FP8_AMAX_FLOOR_MIN)):
        with pytest.raises(ValueError, match=r"^amax_floor: expected a value >= 3\.15"):
            quantize_index_fp8(z, amax_floor=floor)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for ue8m0 in (False, True):
            codes, scale = quantize_index_fp8(z, amax_floor=INDEX_FP8_AMAX_FLOOR_MIN, ue8m0=ue8m0)
            assert scale[0] > 0 and not np.isnan(codes.astype(F32)).any()


# ----------------------------------------------------------------------------- INT8 limits
@pytest.mark.parametrize("rule", RULES)
def test_int8_floor_must_keep_the_code_factor_finite_at_the_exact_limit(rule):
    """Below :data:`INDEX_INT8_AMAX_MIN` the FP32 code factor (``127 / amax``, or ``(1 /
    amax) * 127``) overflows to inf (an all-zero vector then got NaN codes): such a floor is
    a ValueError naming ``amax_floor``; the limit gives codes 0 without a warning."""
    lo = INDEX_INT8_AMAX_MIN[rule]
    with np.errstate(over="ignore"):  # the exact limit of the rule's arithmetic
        assert np.isfinite(_factor(lo, rule)) and np.isinf(_factor(_below(lo), rule))
    z = np.zeros((2, 128), F32)
    for floor in (1e-40, _below(lo)):
        with pytest.raises(ValueError, match=r"^amax_floor: expected 0 or a value >= 3\.73"):
            quantize_index_int8(z, amax_floor=floor, scale_rule=rule)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codes, _ = quantize_index_int8(z, amax_floor=lo, scale_rule=rule)
    assert not codes.any()


@pytest.mark.parametrize("rule", RULES)
def test_int8_without_floor_refuses_a_tiny_vector_naming_x_and_the_vector(rule):
    """With ``amax_floor=0`` a vector whose ``max|x|`` is below the same limit (``1e-39``:
    codes 127 and scale 0 before) is a ValueError naming ``x`` and the vector's index; a
    vector at the limit is quantized without a warning."""
    lo = INDEX_INT8_AMAX_MIN[rule]
    x = np.ones((2, 3, 128), F32)
    x[1, 2] = 0
    x[1, 2, 5] = 1e-39
    with pytest.raises(ValueError, match=r"^quantize_index_int8\(x\): expected max\|x\| >= "
                                         r"3\.73.* got 1e-39 in vector \[1, 2\]"):  # fmt: skip
        quantize_index_int8(x, amax_floor=0.0, scale_rule=rule)
    x[1, 2, 5] = lo
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codes, _ = quantize_index_int8(x, amax_floor=0.0, scale_rule=rule)
    assert codes[1, 2, 5] == 127


@pytest.mark.parametrize("rule", RULES)
def test_int8_fp16_scale_limit_floor_refused_x_gives_inf_without_a_warning(rule):
    """The FP16 scale overflows above :data:`INDEX_INT8_AMAX_MAX` (~8.32e6 = 127 * 65520): a
    floor above it (every scale inf) is a ValueError naming ``amax_floor``; a vector of ``x``
    above it gets the documented scale inf (as the device writes it) with the rule's codes and
    no NumPy warning; at the limit the scale is finite."""
    hi = INDEX_INT8_AMAX_MAX[rule]
    with np.errstate(over="ignore"):  # the exact limit of the rule's arithmetic
        assert np.isfinite(_scale16(hi, rule)) and np.isinf(_scale16(_above(hi), rule))
    z = np.zeros((1, 128), F32)
    with pytest.raises(ValueError, match=r"^amax_floor: expected a value <= 83210(39\.5|40\.0) "):
        quantize_index_int8(z, amax_floor=_above(hi), scale_rule=rule)
    x = np.ones((2, 128), F32)
    x[0, 0], x[1, 0] = _above(hi), hi
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codes, scale = quantize_index_int8(x, scale_rule=rule)
    assert np.isinf(scale[0]) and np.isfinite(scale[1])
    assert codes[0, 0] == 127 and codes[1, 0] == 127
