"""shared.validate: raise_at_first and vLLM's slot_mapping rule (check_slot_mapping)."""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.shared.validate import check_slot_mapping, raise_at_first


def test_raise_at_first_names_the_first_bad_index():
    raise_at_first(np.zeros(4, dtype=bool), lambda i: f"never {i}")
    with pytest.raises(ValueError, match=r"^x\[2\]: expected 0, got 7$"):
        raise_at_first(
            np.array([[False, False], [True, True]]), lambda i: f"x[{i}]: expected 0, got 7"
        )


def test_slot_mapping_is_returned_as_host_int64():
    got = check_slot_mapping(np.array([3, -1, 0], dtype=np.int32), 4, "rows of c")
    assert got.dtype == np.int64 and got.tolist() == [3, -1, 0]


@pytest.mark.parametrize(
    ("slots", "exc", "match"),
    [
        (
            [0, 4],
            ValueError,
            r"slot_mapping\[1\]: expected -1 \(skip\) or a cache row in \[0, 4\) "
            r"\(rows of c\), got 4",
        ),
        ([-2, 0], ValueError, r"slot_mapping\[0\]: expected -1 .*got -2"),
        (
            [1, -1, 1, 1],
            ValueError,
            r"slot_mapping\[2\]: expected a row no other token writes, got 1 "
            r"\(each cache row at most once; tokens \[0, 2, 3\] write it",
        ),
        ([0.0, 1.0], TypeError, r"slot_mapping: expected an integer dtype"),
    ],
)
def test_bad_slot_mapping_names_the_entry(slots, exc, match):
    with pytest.raises(exc, match=match):
        check_slot_mapping(np.array(slots), 4, "rows of c")
