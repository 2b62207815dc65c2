"""The one slot rule (tilesim.shared.layouts.slots): a caller's ``slot_mapping`` and the block-table
host rule, each edge behaviour once (``-1`` skipped; everything else out of range, a row given
twice, a mapping of the wrong length and an unallocated block refused); and
``validate.raise_at_first``, which the rule reports through."""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.shared.layouts.slots import (
    NO_SLOT,
    check_slot_mapping,
    check_slot_mapping_meta,
    slots_from_block_table,
)
from tilesim.shared.validate import raise_at_first


def test_raise_at_first_names_the_first_bad_index():
    raise_at_first(np.zeros(4, dtype=bool), lambda i: f"never {i}")
    with pytest.raises(ValueError, match=r"^x\[2\]: expected 0, got 7$"):
        raise_at_first(
            np.array([[False, False], [True, True]]), lambda i: f"x[{i}]: expected 0, got 7"
        )


# ----------------------------------------------------------------------------- slot_mapping
def test_slot_mapping_is_returned_as_a_host_int64_copy():
    given = np.array([3, -1, 0], dtype=np.int32)
    got = check_slot_mapping(given, tokens=3, rows=4, rows_of="rows of c")
    assert got.dtype == np.int64 and got.tolist() == [3, -1, 0]
    got[0] = 1
    assert given.tolist() == [3, -1, 0]
    assert NO_SLOT == -1


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
        ([True, False], TypeError, r"slot_mapping: expected an integer dtype, got bool"),
    ],
)
def test_bad_slot_mapping_names_the_entry(slots, exc, match):
    with pytest.raises(exc, match=match):
        check_slot_mapping(np.array(slots), tokens=len(slots), rows=4, rows_of="rows of c")


@pytest.mark.parametrize("length", [2, 4])
def test_a_mapping_shorter_or_longer_than_the_tokens_is_refused(length):
    slots = np.arange(length)
    with pytest.raises(ValueError, match=r"^slot_mapping: expected shape") as e:
        check_slot_mapping(slots, tokens=3, rows=8, rows_of="rows of c")
    assert f"({length},)" in str(e.value) and "3" in str(e.value)
    with pytest.raises(ValueError, match=r"^slot_mapping: expected shape"):
        check_slot_mapping_meta(slots, 3)


def test_the_metadata_check_reads_no_value():
    torch = pytest.importorskip("torch")
    check_slot_mapping_meta(torch.empty(5, dtype=torch.int64, device="meta"), 5)
    with pytest.raises(TypeError, match=r"slot_mapping: expected an integer dtype"):
        check_slot_mapping_meta(torch.empty(5, dtype=torch.float32, device="meta"), 5)


# ----------------------------------------------------------------------------- block table
def _slots_by_hand(table, lens, q_lens, bs):
    """The rule written as a per-token loop: token j of batch b is position lens[b] - q + j."""
    out = []
    for row, n, q in zip(table.tolist(), lens.tolist(), q_lens.tolist(), strict=True):
        for p in range(n - q, n):
            out.append(row[p // bs] * bs + p % bs)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_slots_follow_the_block_table(seed):
    rng = np.random.default_rng(seed)
    bs = int(rng.choice([1, 16, 64, 128]))
    lens = rng.integers(0, 700, size=int(rng.integers(1, 6)))
    q_lens = np.array([int(rng.integers(0, n + 1)) for n in lens])
    width = int(-(-lens.max() // bs)) + int(rng.integers(0, 3))
    table = np.full((lens.size, max(width, 1)), -1, np.int32)
    perm = rng.permutation(table.size)
    for b, n in enumerate(lens):
        used = -(-int(n) // bs)
        table[b, :used] = perm[b * table.shape[1] : b * table.shape[1] + used]
    got = slots_from_block_table(table, lens, q_lens=q_lens, block_size=bs)
    assert got.dtype == np.int64
    assert got.tolist() == _slots_by_hand(table, lens, q_lens, bs)


def test_decode_is_one_new_token_per_batch():
    table = np.array([[3, 1, -1], [0, 2, -1]])
    got = slots_from_block_table(table, np.array([130, 2]), block_size=128)
    assert got.tolist() == [1 * 128 + 1, 0 * 128 + 1]
    got = slots_from_block_table(table, np.array([130, 2]), q_lens=np.array([3, 2]))
    assert got.tolist() == [3 * 128 + 127, 1 * 128 + 0, 1 * 128 + 1, 0, 1]


@pytest.mark.parametrize(
    ("lens", "q_lens", "match"),
    [
        ([257, 2], None, r"block_table\[0, 2\]: expected an allocated block \(>= 0\) for "
         r"position 256 of batch 0, got -1"),
        ([130, 400], None, r"block_table\[1, 3\]: .*position 399 of batch 1, got past the table"),
        ([5, 2], [1, 3], r"q_lens\[1\]: expected a value in \[0, seq_lens\[1\] = 2\], got 3"),
        ([5, 2], [-1, 1], r"q_lens\[0\]: expected a value in \[0, seq_lens\[0\] = 5\], got -1"),
        ([5, -2], [1, 0], r"seq_lens\[1\]: expected a value in \[0, inf\], got -2"),
    ],
)  # fmt: skip
def test_a_position_the_table_does_not_hold_is_refused(lens, q_lens, match):
    table = np.array([[3, 1, -1], [0, 2, 4]])
    ql = None if q_lens is None else np.array(q_lens)
    with pytest.raises(ValueError, match=match):
        slots_from_block_table(table, np.array(lens), q_lens=ql, block_size=128)


def test_block_table_arguments_are_checked_by_name():
    with pytest.raises(ValueError, match=r"^seq_lens: expected shape"):
        slots_from_block_table(np.zeros((2, 1), np.int32), np.array([1]))
    with pytest.raises(TypeError, match=r"^block_table: expected an integer dtype"):
        slots_from_block_table(np.zeros((1, 1)), np.array([1]))
    with pytest.raises(ValueError, match=r"^block_size: expected"):
        slots_from_block_table(np.zeros((1, 1), np.int32), np.array([1]), block_size=0)
    empty = slots_from_block_table(np.zeros((1, 0), np.int32), np.array([0]), q_lens=np.array([0]))
    assert empty.dtype == np.int64 and empty.size == 0
