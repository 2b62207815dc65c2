"""``require_array`` (the one policy, ``shared/validate.py``): ndarray subclasses and dtypes
whose data an op would misread are refused by name; legitimate subclasses still pass.

The cross-op grid (``tests/badinput``) checks the same classes through every public op; this
file pins the policy function itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.shared import validate
from tilesim.shared.casts import to_bf16


def _refused(x, match: str):
    with pytest.raises(TypeError, match=match):
        validate.require_array(x, "arg")


def test_masked_array_is_refused_even_without_a_mask():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    _refused(np.ma.masked_array(x, mask=[[0, 1, 0], [0, 0, 0]]), r"arg: .*MaskedArray.*mask")
    _refused(np.ma.masked_array(x), r"arg: .*MaskedArray")  # nomask: still a masked array


def test_matrix_and_object_dtype_are_refused():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    _refused(x.view(np.matrix), r"arg: .*matrix")
    _refused(x.astype(object), r"arg: expected a real \(numeric\) dtype, got object")
    rec = np.zeros(2, dtype=[("a", object)])
    _refused(rec, r"arg: expected a real \(numeric\) dtype")


def test_plain_subclasses_and_views_still_pass(tmp_path):
    mm = np.memmap(tmp_path / "x.bin", dtype=np.float32, mode="w+", shape=(2, 3))
    validate.require_array(mm, "arg")
    validate.require_array(np.zeros((4, 4), np.float32)[::2, ::2], "arg")
    validate.require_array(np.zeros(3, dtype=[("a", np.int32)]), "arg")  # refused later by dtype


def test_int_sequence_refuses_a_masked_array():
    v = np.ma.masked_array(np.array([1, 2, 3]), mask=[0, 1, 0])
    with pytest.raises(TypeError, match="counts: .*MaskedArray"):
        validate.check_int_sequence(v, "counts")
    assert validate.check_int_sequence(np.array([1, 2, 3]), "counts") == (1, 2, 3)


def test_a_masked_input_to_a_cast_names_the_argument_and_is_not_written():
    x = np.ma.masked_array(np.array([1.5, np.nan, 3.0], np.float32), mask=[0, 1, 0])
    data, mask = x.data.copy(), x.mask.copy()
    with pytest.raises(TypeError, match=r"to_bf16\(x\): .*MaskedArray"):
        to_bf16(x)
    assert np.array_equal(x.data, data, equal_nan=True) and np.array_equal(x.mask, mask)
