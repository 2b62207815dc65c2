"""shared.validate, shared.trace and shared.case_schema: the one policy, the one schemas."""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.shared import trace, validate
from tilesim.shared.casts import to_bf16
from tilesim.shared.registry import case_schema


@pytest.mark.parametrize("bad", [[1, 2], (1, 2), 3, None, "x"])
def test_arrays_must_be_arrays(bad):
    with pytest.raises(TypeError, match="^q: expected a numpy array or a torch tensor"):
        validate.as_array(bad, "q")


def test_dtype_shape_messages_name_argument_expected_actual():
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError, match=r"^a: expected dtype bfloat16, got float32$"):
        validate.check_dtype(a, "a", to_bf16(a).dtype)
    with pytest.raises(ValueError, match=r"^a: expected shape \(\*, 4\) \[T, D\], got \(2, 3\)$"):
        validate.check_shape(a, "a", (None, 4), "[T, D]")
    with pytest.raises(ValueError, match=r"^a: expected a 3-D array, got shape \(2, 3\)$"):
        validate.check_ndim(a, "a", 3)


def test_host_ints_rejects_floats_bools_and_huge_unsigned():
    with pytest.raises(TypeError, match="ids: expected an integer dtype, got float32"):
        validate.host_ints(np.zeros(2, np.float32), "ids")
    with pytest.raises(TypeError, match="got bool"):
        validate.host_ints(np.zeros(2, bool), "ids")
    with pytest.raises(ValueError, match="ids: expected values <="):
        validate.host_ints(np.array([2**64 - 1], np.uint64), "ids")
    got = validate.host_ints(np.array([1, 2], np.uint32), "ids")
    assert got.dtype == np.int64 and got.tolist() == [1, 2]
    with pytest.raises(ValueError, match=r"ids\[1\]: expected a value in \[0, 4\], got 9"):
        validate.check_range(np.array([0, 9]), "ids", 0, 4)


@pytest.mark.parametrize("bad", [True, 1.5, "3", None, np.float32(2)])
def test_check_int_rejects_non_ints(bad):
    with pytest.raises(TypeError, match="^n: expected an int"):
        validate.check_int(bad, "n")


def test_scalar_checks():
    assert validate.check_int(np.int64(3), "n", lo=1, hi=3) == 3
    with pytest.raises(ValueError, match=r"n: expected an int in \[1, inf\], got 0"):
        validate.check_pos_int(0, "n")
    for bad in (float("nan"), float("inf"), 1e39, 1e-46):
        with pytest.raises(ValueError, match="^scale: expected"):
            validate.check_float(bad, "scale", fp32=True, positive=True)
    with pytest.raises(TypeError, match="scale: expected a real number"):
        validate.check_float(1j, "scale")
    with pytest.raises(TypeError, match="flag: expected a bool, got str"):
        validate.check_bool("False", "flag")
    with pytest.raises(ValueError, match=r"mode: expected one of \('a', 'b'\), got 1"):
        validate.check_choice(1, "mode", ("a", "b"))
    with pytest.raises(TypeError, match="trace: expected a callable or None, got int"):
        validate.check_trace(3)


def test_check_finite_names_the_first_bad_element():
    x = to_bf16(np.array([[1.0, 2.0], [np.inf, 0.0]], np.float32))
    with pytest.raises(
        ValueError, match=r"x: expected finite values, got .*inf.* at index \[1, 0\]"
    ):
        validate.check_finite(x, "x")
    validate.check_finite(np.array([1, 2]), "ints")


@pytest.mark.torch
def test_torch_inputs_are_read_without_a_copy_or_grad_error():
    import torch

    t = torch.ones(4, dtype=torch.bfloat16, requires_grad=True)
    a = validate.as_array(t, "t", dtype=to_bf16(np.zeros(1, np.float32)).dtype, ndim=1)
    assert a.shape == (4,)
    assert validate.dtype_of(torch.zeros(2, dtype=torch.int32), "i") == np.int32
    out = validate.same_kind(np.zeros(2, np.float32), t)
    assert isinstance(out, torch.Tensor)
    assert isinstance(validate.same_kind(np.zeros(2), np.zeros(1)), np.ndarray)


def test_trace_record_schema():
    rec = trace.trace_record("op_x", {"b": 0, "s": 1}, 2, (512, 1024), keys_used=300, flop=10,
                             slot=3)  # fmt: skip
    assert tuple(rec) == trace.TRACE_KEYS
    assert rec["extra"] == {"slot": 3} and rec["keys_used"] == 300
    assert trace.check_record(rec) is rec
    assert trace.lane_label(rec) == "b0 s1" and trace.lane_id(rec) == (("b", 0), ("s", 1))
    bad = dict(rec)
    bad["expert"] = 1
    with pytest.raises(ValueError, match="unknown"):
        trace.check_record(bad)
    with pytest.raises(TypeError, match="step"):
        trace.trace_record("op", {}, True, (0, 1))
    got = []
    trace.emit(got.append, "op", {}, 0, (0, 4))
    trace.emit(None, "op", {}, 0, (0, 4))
    assert len(got) == 1 and got[0]["keys_used"] == 4


def test_case_schema():
    tol = case_schema.tolerance(1e-3, 1e-3, 0.005)
    assert tol == {"atol": 1e-3, "rtol": 1e-3, "ratio": 0.005, "mode": "compare"}
    assert case_schema.tolerance(mode="set")["atol"] is None
    with pytest.raises(ValueError, match="tolerance.mode"):
        case_schema.tolerance(mode="close")
    with pytest.raises(ValueError, match="ratio"):
        case_schema.tolerance(0, 0, 2.0)
    with pytest.raises(ValueError, match="takes no atol"):
        case_schema.tolerance(1e-3, None, mode="set")
    case = case_schema.make_case(name=None, op="op", inputs={}, params={}, tolerance=tol, meta={})
    assert tuple(case) == case_schema.CASE_KEYS
    with pytest.raises(ValueError, match="tolerance"):
        case_schema.make_case(name=None, op="op", inputs={}, params={}, tolerance={}, meta={})
