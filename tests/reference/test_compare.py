"""The comparison utility on crafted inputs whose verdict and statistics are known by hand."""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
from tilesim.reference import CompareReport, compare, to_bf16

BF16 = np.dtype(ml_dtypes.bfloat16)


def bf(values) -> np.ndarray:
    return to_bf16(np.asarray(values, dtype=np.float32))


def test_identical_tensors_pass_with_perfect_statistics():
    g = bf(np.linspace(-2, 2, 64).reshape(8, 8))
    r = compare(g.copy(), g, atol=0, rtol=0, ratio=0)
    assert isinstance(r, CompareReport) and r.passed and bool(r)
    assert (r.n_fail, r.threshold, r.n_nonfinite) == (0, 0, 0)
    assert r.max_abs_err == 0.0 and r.max_ulp == 0 and r.bit_exact_fraction == 1.0
    assert r.cosine == pytest.approx(1.0, abs=1e-15)
    assert r.shape == (8, 8) and r.dtype == "bfloat16" and r.numel == 64
    assert r.summary().startswith("PASS output")


@pytest.mark.parametrize("bad", [np.nan, -np.nan, np.inf, -np.inf])
def test_nonfinite_actual_is_a_hard_failure_even_within_ratio(bad):
    g = np.ones(1000, np.float32)
    a = g.copy()
    a[17] = bad
    # one bad element of 1000 is within round(0.005 * 1000) = 5, yet the verdict is FAIL
    r = compare(a, g, atol=1e-3, rtol=1e-3, ratio=0.005)
    assert not r.passed
    assert r.n_nonfinite == 1 and r.threshold == 5
    assert "NaN/Inf" in r.reason and "hard failure" in r.reason


def test_inf_in_actual_fails_even_when_golden_has_the_same_inf():
    g = np.array([1.0, np.inf], np.float32)
    r = compare(g.copy(), g, atol=0, rtol=0, ratio=1.0)
    assert not r.passed and r.n_nonfinite == 1


def test_nan_in_golden_only_is_not_a_failing_element():
    # seeds' rule in IEEE arithmetic: |a - NaN| > tol is False, so the element does not count;
    # the report still flags the golden
    g = np.ones(10, np.float32)
    g[3] = np.nan
    a = np.ones(10, np.float32)
    r = compare(a, g, atol=0, rtol=0, ratio=0)
    assert r.passed and r.n_fail == 0
    assert r.n_golden_nonfinite == 1 and r.n_nonfinite == 0
    assert "warning: 1 NaN/Inf elements in the golden" in r.summary()
    assert r.bit_exact_fraction == pytest.approx(0.9)  # the NaN position is not bit-exact


def test_infinite_golden_never_counts_as_failing():
    g = np.array([np.inf, 1.0], np.float32)
    a = np.array([5.0, 1.0], np.float32)
    # rtol > 0: tol = inf and inf > inf is False; rtol = 0: tol = atol + 0 * inf = NaN
    for rtol in (1e-3, 0.0):
        for arithmetic in ("float64", "native"):
            r = compare(a, g, atol=1e-3, rtol=rtol, ratio=0, arithmetic=arithmetic)
            assert r.passed and r.n_fail == 0 and r.n_golden_nonfinite == 1


@pytest.mark.parametrize(
    ("ratio", "numel", "threshold"),
    [
        (0.125, 4, 0),  # 0.5 -> 0 (half to even)
        (0.125, 12, 2),  # 1.5 -> 2
        (0.125, 20, 2),  # 2.5 -> 2
        (0.125, 28, 4),  # 3.5 -> 4
        (0.005, 100, 0),  # 0.5 (the float product is exact) -> 0
        (0.005, 300, 2),  # 1.5 -> 2
        (0.005, 500, 2),  # 2.5 -> 2
        (0.005, 4 * 2 * 128 * 512, 2621),  # the seeds' DeepSeek budget, (4,2,128,512)
        (0.0, 1000, 0),
        (1.0, 7, 7),
    ],
)
def test_threshold_rounds_half_to_even_and_is_inclusive(ratio, numel, threshold):
    g = np.zeros(numel, np.float32)
    a = g.copy()
    a[:threshold] = 1.0
    r = compare(a, g, atol=0.5, rtol=0, ratio=ratio)
    assert r.threshold == threshold
    assert r.n_fail == threshold and r.passed  # failures == threshold passes (<=)
    if threshold < numel:
        a[threshold] = 1.0
        r2 = compare(a, g, atol=0.5, rtol=0, ratio=ratio)
        assert r2.n_fail == threshold + 1 and not r2.passed
        assert "failing elements > allowed" in r2.reason


def test_strict_greater_boundary():
    # tol = 0.25 + 0.25 * 2 = 0.75 exactly; diff 0.75 is allowed, one FP32 ULP more is not
    g = np.array([2.0, 2.0], np.float32)
    edge = np.float32(2.75)
    a = np.array([edge, np.nextafter(edge, np.float32(3))], np.float32)
    r = compare(a, g, atol=0.25, rtol=0.25, ratio=0)
    assert r.n_fail == 1 and not r.passed
    assert r.worst[0][0] == (1,)
    idx, av, gv, d, tol = r.worst[0]
    assert (av, gv, tol) == (float(a[1]), 2.0, 0.75) and d > 0.75
    # negative goldens use |golden|
    r = compare(-a[:1], -g[:1], atol=0.25, rtol=0.25, ratio=0)
    assert r.passed and r.n_fail == 0


def test_ulp_cosine_and_max_error_by_hand():
    # BF16 spacing is 2^-7 in [1, 2) and 2^-6 in [2, 4): 1 + 2*2^-7 is 2 ULP above 1.0,
    # 4 - 2^-5 is 2 ULP below 4.0 (and the largest error, 2^-5)
    g = bf([1.0, 4.0, -2.0, 0.5])
    a = bf([1.0 + 2 * 2**-7, 4.0 - 2**-5, -2.0, 0.5])
    r = compare(a, g, atol=1, rtol=0)
    assert r.max_ulp == 2 and r.bit_exact_fraction == 0.5
    assert r.max_abs_err == 2**-5 and r.max_abs_pos == (1,)
    a = bf([1.0 + 3 * 2**-7, 4.0, -2.0, 0.5])
    assert compare(a, g, atol=1, rtol=0).max_ulp == 3
    ga, aa = np.array([1.0, 4.0, -2.0, 0.5]), np.array([1.0 + 2**-6, 4.0 - 2**-5, -2.0, 0.5])
    cos = float(ga @ aa) / (math.sqrt(ga @ ga) * math.sqrt(aa @ aa))
    assert r.cosine == pytest.approx(cos, rel=1e-15) and r.cosine < 1 - 1e-6

    r = compare(np.array([3.0, 4.0], np.float32), np.array([4.0, 3.0], np.float32), atol=9, rtol=0)
    assert r.cosine == pytest.approx(24 / 25, rel=1e-15)
    r = compare(np.array([1.0, 0.0], np.float32), np.array([0.0, 1.0], np.float32), atol=9, rtol=0)
    assert r.cosine == 0.0
    z = np.zeros(3, np.float32)
    assert compare(z, z, atol=0, rtol=0).cosine == 1.0


def test_worst_positions_ordered_by_error():
    g = np.zeros((3, 4), np.float32)
    a = g.copy()
    a[0, 1], a[2, 3], a[1, 0] = 0.3, 0.9, 0.6
    r = compare(a, g, atol=0.1, rtol=0, ratio=0, n_worst=2)
    assert [w[0] for w in r.worst] == [(2, 3), (1, 0)]
    assert r.max_abs_pos == (2, 3) and r.max_abs_err == pytest.approx(0.9)
    assert r.n_fail == 3


def test_golden_of_another_dtype_is_rounded_for_ulp_statistics():
    a = bf([1.0, 1.0, 1.0])
    # 1 + 2^-9 rounds to 1.0 in BF16 (0 ULP); 1.01 rounds to 1.0078125 (1 ULP); 1.02 -> 1.0234375
    g = np.array([1.0 + 2**-9, 1.01, 1.02], np.float32)
    with pytest.raises(TypeError, match="golden.*dtype"):
        compare(a, g, atol=0, rtol=0)
    r = compare(a, g, atol=0.05, rtol=0, check_dtype=False)
    assert r.passed and r.max_ulp == 3 and r.bit_exact_fraction == pytest.approx(1 / 3)


def test_integer_outputs():
    a = np.array([1, -3, 127], np.int8)
    g = np.array([1, -1, 127], np.int8)
    r = compare(a, g, atol=1, rtol=0, ratio=0)
    assert not r.passed and r.n_fail == 1 and r.max_ulp == 2 and r.max_abs_err == 2.0


def test_empty_tensors():
    e = np.zeros((0, 4), np.float32)
    r = compare(e, e, atol=0, rtol=0)
    assert r.passed and r.numel == 0 and r.max_abs_pos is None


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        ({"atol": -1.0, "rtol": 0.0}, ValueError, "atol"),
        ({"atol": 0.0, "rtol": float("nan")}, ValueError, "rtol"),
        ({"atol": 0.0, "rtol": 0.0, "ratio": 1.5}, ValueError, "ratio"),
        ({"atol": "0", "rtol": 0.0}, TypeError, "atol"),
        ({"atol": 0.0, "rtol": 0.0, "arithmetic": "bf16"}, ValueError, "arithmetic"),
        ({"atol": 0.0, "rtol": 0.0, "n_worst": -1}, ValueError, "n_worst"),
    ],
)
def test_bad_arguments_are_named(kwargs, exc, pattern):
    x = np.ones(3, np.float32)
    with pytest.raises(exc, match=pattern):
        compare(x, x, **kwargs)


def test_shape_and_dtype_mismatch():
    with pytest.raises(ValueError, match=r"golden: expected the shape of actual \(3,\)"):
        compare(np.ones(3, np.float32), np.ones(4, np.float32), atol=0, rtol=0)
    with pytest.raises(TypeError, match="golden: expected the dtype of actual float32"):
        compare(np.ones(3, np.float32), np.ones(3), atol=0, rtol=0)


def test_numpy_scalar_tolerances_accepted():
    x = np.ones(3, np.float32)
    assert compare(x, x, atol=np.float32(1e-3), rtol=np.float64(0.0), ratio=np.float32(0)).passed


def test_native_arithmetic_rounds_the_way_bf16_tensors_do():
    # actual 1.0078125 vs golden 1.0: diff = 2^-7 (one BF16 ULP at 1.0); atol 1e-4, rtol 0.00771.
    # float64: tol = 0.00781 < 2^-7 -> the element fails.
    # native: rtol*|g| -> bf16(0.00771) = 253 * 2^-15 (0.00771 * 2^15 = 252.6); atol ->
    # bf16(1e-4) = 210 * 2^-21 (1e-4 * 2^21 = 209.7); sum = 16402 * 2^-21 = 256.28 * 2^-15 ->
    # bf16 = 256 * 2^-15 = 2^-7 = diff -> not failing under the strict '>'.
    a, g = bf([1.0078125]), bf([1.0])
    assert not compare(a, g, atol=1e-4, rtol=0.00771, ratio=0).passed
    r = compare(a, g, atol=1e-4, rtol=0.00771, ratio=0, arithmetic="native")
    assert r.passed and r.n_fail == 0
    # one step lower rtol: bf16(0.0077) = 252 * 2^-15, sum rounds to 255 * 2^-15 < 2^-7 -> fails
    r = compare(a, g, atol=1e-4, rtol=0.0077, ratio=0, arithmetic="native")
    assert r.n_fail == 1 and r.worst[0][4] == 255 * 2**-15


def test_inputs_not_modified():
    rng = np.random.default_rng(0)
    g = bf(rng.standard_normal((16, 16)))
    a = bf(g.astype(np.float32) + np.float32(0.01))
    a[0, 0] = np.nan
    ga, aa = g.copy(), a.copy()
    compare(a, g, atol=1e-3, rtol=1e-3, arithmetic="native")
    compare(a, g, atol=1e-3, rtol=1e-3)
    assert np.array_equal(g.view(np.uint16), ga.view(np.uint16))
    assert np.array_equal(a.view(np.uint16), aa.view(np.uint16))


@pytest.mark.torch
def test_torch_tensors_accepted_and_give_the_same_report():
    import torch

    rng = np.random.default_rng(1)
    g = bf(rng.standard_normal((4, 32)))
    a = bf(g.astype(np.float32) * np.float32(1.004))
    tg = torch.from_numpy(g.view(np.int16).copy()).view(torch.bfloat16)
    ta = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    r_np = compare(a, g, atol=1e-4, rtol=5e-3)
    r_t = compare(ta, tg, atol=1e-4, rtol=5e-3)
    assert r_t == r_np
    ta32 = ta.float().requires_grad_(True)
    assert compare(ta32, tg.float(), atol=0.05, rtol=0).passed


@pytest.mark.torch
@pytest.mark.parametrize("seed", [0, 1])
def test_native_arithmetic_counts_match_torch(seed):
    import torch

    rng = np.random.default_rng(seed)
    n = 100_000
    g32 = rng.standard_normal(n).astype(np.float32) * np.float32(10) ** rng.uniform(-3, 3, n)
    g = bf(g32.astype(np.float32))
    noise = rng.standard_normal(n).astype(np.float32)
    a = bf(g.astype(np.float32) * (1 + noise * np.float32(5e-3)) + noise * np.float32(1e-4))
    tg = torch.from_numpy(g.view(np.int16).copy()).view(torch.bfloat16)
    ta = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    for atol, rtol in [(1e-4, 5e-3), (1e-3, 1e-2), (3e-5, 0.0)]:
        want = int((torch.abs(ta - tg) > atol + rtol * torch.abs(tg)).sum())
        got = compare(a, g, atol=atol, rtol=rtol, arithmetic="native")
        assert got.n_fail == want


# ---------------------------------------------------------------------------------------------
# input policy (shared/validate.py): one grid per class of bad input, naming the argument
# ---------------------------------------------------------------------------------------------
def _pair():
    rng = np.random.default_rng(15)
    g = bf(rng.standard_normal((4, 8)))
    a = bf(g.astype(np.float32) * np.float32(1.01))
    return a, g


def _report_image(r: CompareReport) -> str:
    return repr(r)  # every field, NaN-safe (nan != nan would defeat ==)


@pytest.mark.parametrize("bad", [None, [1.0, 2.0], (1.0,), "x", 1.5, {"a": 1}], ids=repr)
@pytest.mark.parametrize("which", ["actual", "golden"])
def test_policy_non_arrays_are_refused(which, bad):
    a, g = _pair()
    kw = {"actual": a, "golden": g, which: bad}
    with pytest.raises(
        TypeError,
        match=rf"^{which}: expected a numpy array or a torch tensor, got {type(bad).__name__}",
    ):
        compare(**kw, atol=0, rtol=0)


@pytest.mark.parametrize("check_dtype", [True, False])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128, "U1", object, "datetime64[s]"])
@pytest.mark.parametrize("which", ["actual", "golden"])
def test_policy_complex_and_non_numeric_dtypes_are_refused(which, dtype, check_dtype):
    # a complex golden 1+1j against a real 1: float64 conversion would drop the 1j and pass
    x = np.ones(3, np.complex128) + 1j if np.dtype(dtype).kind == "c" else np.zeros(3, dtype)
    x = x.astype(dtype)
    other = np.ones(3, np.float32)
    kw = {"actual": other, "golden": other, which: x}
    dt = re.escape(str(np.dtype(dtype)))
    with pytest.raises(TypeError, match=rf"^{which}: expected a real .*dtype, got {dt}$"):
        compare(**kw, atol=0, rtol=0, check_dtype=check_dtype)


@pytest.mark.torch
@pytest.mark.parametrize("which", ["actual", "golden"])
def test_policy_complex_and_meta_tensors_are_refused(which):
    import torch

    one = torch.ones(3)
    with pytest.raises(TypeError, match=rf"^{which}: expected a real .*complex64"):
        compare(**{"actual": one, "golden": one, which: one.to(torch.complex64)}, atol=0, rtol=0)
    meta = torch.empty(3, device="meta")
    with pytest.raises(ValueError, match=rf"^{which}: expected a tensor holding data"):
        compare(**{"actual": one, "golden": one, which: meta}, atol=0, rtol=0)


@pytest.mark.torch
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "fp8", "fp32"])
def test_policy_torch_tensors_give_the_numpy_report_and_are_not_written(dtype, grad):
    import torch
    from tilesim.shared.casts import to_fp8_e4m3
    from tilesim.shared.interop import to_numpy, to_torch

    a, g = _pair()
    if dtype == "fp8":
        a, g = to_fp8_e4m3(a.astype(np.float32)), to_fp8_e4m3(g.astype(np.float32))
    elif dtype == "fp32":
        a, g = a.astype(np.float32), g.astype(np.float32)
    want = _report_image(compare(a, g, atol=1e-3, rtol=1e-3, ratio=0.1))
    ta, tg = to_torch(a.copy()), to_torch(g.copy())
    if grad and ta.dtype != torch.float8_e4m3fn:
        ta, tg = ta.requires_grad_(True), tg.requires_grad_(True)
    before = (to_numpy(ta).tobytes(), to_numpy(tg).tobytes())
    got = compare(ta, tg, atol=1e-3, rtol=1e-3, ratio=0.1)
    assert _report_image(got) == want
    assert (to_numpy(ta).tobytes(), to_numpy(tg).tobytes()) == before


@pytest.mark.parametrize("bad", ["yes", "False", 1, 0, None, np.array(True)], ids=repr)
def test_policy_check_dtype_is_a_bool(bad):
    a, g = _pair()
    with pytest.raises(TypeError, match=r"^check_dtype: expected a bool, got "):
        compare(a, g, atol=0, rtol=0, check_dtype=bad)


@pytest.mark.parametrize(
    ("bad", "exc"),
    [
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        (10**400, ValueError),
        (-1e-9, ValueError),
        ("0.1", TypeError),
        (True, TypeError),
        (None, TypeError),
        (1j, TypeError),
        (np.array(0.1), TypeError),
    ],
    ids=repr,
)
@pytest.mark.parametrize("which", ["atol", "rtol", "ratio"])
def test_policy_tolerances_are_real_finite_and_non_negative(which, bad, exc):
    a, g = _pair()
    kw = {"atol": 0.0, "rtol": 0.0, "ratio": 0.0, which: bad}
    with pytest.raises(exc, match=rf"^{which}: expected "):
        compare(a, g, **kw)


@pytest.mark.parametrize(
    ("kw", "exc", "pattern"),
    [
        ({"n_worst": True}, TypeError, r"^n_worst: expected an int, got bool"),
        ({"n_worst": 1.5}, TypeError, r"^n_worst: expected an int, got float"),
        ({"n_worst": "3"}, TypeError, r"^n_worst: expected an int, got str"),
        ({"n_worst": -1}, ValueError, r"^n_worst: expected an int in \[0, inf\], got -1"),
        ({"name": 3}, TypeError, r"^name: expected a str, got int"),
        ({"name": None}, TypeError, r"^name: expected a str, got NoneType"),
        ({"arithmetic": "FLOAT64"}, ValueError, r"^arithmetic: expected one of"),
        ({"arithmetic": None}, ValueError, r"^arithmetic: expected one of"),
    ],
)
def test_policy_options_are_named(kw, exc, pattern):
    a, g = _pair()
    with pytest.raises(exc, match=pattern):
        compare(a, g, atol=0, rtol=0, **kw)


def test_policy_checks_come_before_any_work():
    # a bad option is reported even when the arrays are also bad: nothing was converted
    with pytest.raises(ValueError, match="^atol"):
        compare([1.0], None, atol=math.nan, rtol=0)


def test_policy_read_only_inputs_and_numpy_scalars():
    a, g = _pair()
    want = _report_image(compare(a, g, atol=1e-3, rtol=1e-3))
    ra, rg = a.copy(), g.copy()
    ra.flags.writeable = rg.flags.writeable = False
    assert _report_image(compare(ra, rg, atol=1e-3, rtol=1e-3)) == want
    r = compare(np.float32(1.0), np.float32(1.5), atol=0.1, rtol=0)
    assert not r.passed and r.shape == () and r.max_abs_err == 0.5
