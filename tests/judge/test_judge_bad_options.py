"""Bad options of the judge and of ``compare``: golden scores of another row layout, 64-bit
integers beyond float64's exact range, ``precision`` and ``row_shape`` values that are not a
dtype or a shape; and verdict numbers that do not depend on the memory layout of the pair."""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.reference import compare, judge

TOL = {"atol": 1e-3, "rtol": 1e-3, "ratio": 0.0, "mode": "compare"}
SET = {"atol": None, "rtol": None, "ratio": 0.0, "mode": "set"}
#: the largest magnitude float64 holds for every integer up to it
EXACT = 2**53


# ----------------------------------------------------------------------------- scores
def _ids_case():
    """Golden ids ``[2, 1]`` with scores ``[2, 3]``; row 0 of the actual picks candidate 1,
    whose golden score (1) is far below the golden's pick (5): a wrong id, no tie."""
    s = np.array([[5.0, 1.0, 0.0], [5.0, 2.0, 3.0]], np.float32)
    g = np.array([[0], [0]], np.int32)
    a = np.array([[1], [0]], np.int32)
    return a, g, s


def test_scores_of_the_right_shape_judge_the_wrong_id():
    """The scores in the golden's row layout: the wrong id of row 0 fails the id sets (the
    baseline the refusals below protect)."""
    a, g, s = _ids_case()
    v = judge(a, g, SET, scores=s)
    assert not v.passed and v.failed == ["id sets"]
    assert [r.index for r in v.ids.wrong] == [0]


@pytest.mark.parametrize(
    "shape_of", [lambda s: s.T.copy(), lambda s: s.reshape(1, -1), lambda s: s.reshape(-1)],
    ids=["transposed", "one_row", "flat"],
)  # fmt: skip
def test_scores_whose_rows_are_not_the_golden_rows_are_refused(shape_of):
    """Scores ``[3, 2]`` (candidates by rows), ``[1, 6]`` or ``[6]`` for 2 id rows: each holds a
    multiple of the row count, yet its leading shape is not the golden ids' rows, so it is
    refused naming ``scores``, the expected and the actual shapes (a reshape by size would read
    wrong scores; the transposed one turns the wrong id into a tie and a pass)."""
    a, g, s = _ids_case()
    bad = shape_of(s)
    got = str(list(bad.shape)).replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(ValueError, match=rf"^scores: expected .*\[2, candidates\].*got {got}"):
        judge(a, g, SET, scores=bad)


def test_scores_with_the_golden_leading_axes_or_them_flattened():
    """Golden ids ``[2, 3, 1]``: scores ``[2, 3, C]`` and ``[6, C]`` (the same rows in C order)
    give the same verdict; ``[3, 2, C]`` (the axes swapped) is refused naming ``scores``."""
    rng = np.random.default_rng(1)
    s = rng.permutation(24).astype(np.float32).reshape(2, 3, 4)
    g = np.argmax(s, axis=-1)[..., None].astype(np.int32)
    a = g.copy()
    a[1, 2, 0] = np.argmin(s[1, 2])  # a wrong id on the last row
    full = judge(a, g, SET, scores=s)
    flat = judge(a, g, SET, scores=s.reshape(6, 4))
    assert not full.passed and [r.index for r in full.ids.wrong] == [5]
    assert flat.summary() == full.summary()
    with pytest.raises(ValueError, match=r"^scores: expected .*\[2, 3, candidates\]"):
        judge(a, g, SET, scores=s.reshape(3, 2, 4))


def test_scores_without_candidates_are_refused():
    """Scores ``[2, 0]`` (no candidate per row) are refused naming ``scores``."""
    a, g, _ = _ids_case()
    with pytest.raises(ValueError, match=r"^scores: expected .*candidates >= 1.*got \[2, 0\]"):
        judge(a, g, SET, scores=np.zeros((2, 0), np.float32))


# ----------------------------------------------------------------------------- compare, int64
@pytest.mark.parametrize(
    "big",
    [np.array([EXACT + 1], np.int64), np.array([-EXACT - 1], np.int64),
     np.array([np.iinfo(np.int64).min], np.int64), np.array([2**64 - 1], np.uint64)],
    ids=["int64_above", "int64_below", "int64_min", "uint64_max"],
)  # fmt: skip
def test_compare_refuses_64_bit_integers_beyond_2_53(big):
    """A 64-bit integer of magnitude above 2^53 is not exact in float64 (2^53 + 1 would compare
    equal to 2^53 at atol = rtol = 0): refused naming the argument that holds it, on either
    side, with the value; int64 min is caught without an overflowing ``abs``."""
    ok = np.zeros_like(big)
    with pytest.raises(ValueError, match=rf"^actual: expected .*2\^53.*got {big[0]}"):
        compare(big, ok, atol=0.0, rtol=0.0)
    with pytest.raises(ValueError, match=rf"^golden: expected .*2\^53.*got {big[0]}"):
        compare(ok, big, atol=0.0, rtol=0.0)


def test_compare_judges_64_bit_integers_up_to_2_53_exactly():
    """At the edge of the exact range (+-2^53) a difference of one unit fails at atol = rtol =
    0 and equal values pass; int32 values (always exact) are not refused."""
    g = np.array([EXACT, -EXACT], np.int64)
    a = g - np.array([1, -1], np.int64)
    r = compare(a, g, atol=0.0, rtol=0.0, ratio=0.0)
    assert not r.passed and r.n_fail == 2 and r.max_abs_err == 1.0
    assert compare(g.copy(), g, atol=0.0, rtol=0.0, ratio=0.0).passed
    u = np.array([EXACT], np.uint64)
    assert compare(u - np.uint64(1), u, atol=0.0, rtol=0.0, ratio=0.0).n_fail == 1
    i32 = np.array([np.iinfo(np.int32).max], np.int32)
    assert compare(i32, i32 - np.int32(1), atol=0.0, rtol=0.0, ratio=0.0).n_fail == 1


# ----------------------------------------------------------------------------- options
def _floats():
    return np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)


@pytest.mark.parametrize("precision", ["x", 1, True, [1]], ids=["str", "int", "bool", "list"])
def test_precision_that_is_not_a_dtype_is_refused_naming_it(precision):
    """``precision`` values NumPy cannot read as a dtype raise ``TypeError`` naming
    ``precision``, before any work (the arrays are lists, which would fail later)."""
    with pytest.raises(TypeError, match=r"^precision: expected .*got "):
        judge(_floats(), _floats(), TOL, precision=precision)
    with pytest.raises(TypeError, match=r"^precision: "):
        judge([1.0], [1.0], TOL, precision=precision)


def test_precision_of_a_dtype_without_a_unit_roundoff_is_refused():
    """A dtype the judge has no unit roundoff for (int32) is refused naming ``precision``."""
    with pytest.raises(TypeError, match=r"^precision: expected one of .*got "):
        judge(_floats(), _floats(), TOL, precision=np.int32)


@pytest.mark.parametrize(
    ("row_shape", "err", "where"),
    [("x", TypeError, "row_shape"), ("22", TypeError, "row_shape"),
     ((2.7, 2), TypeError, r"row_shape\[0\]"), ((True, 4), TypeError, r"row_shape\[0\]"),
     ((2, np.float64(2.0)), TypeError, r"row_shape\[1\]"), ((4, 0), ValueError, r"row_shape\[1\]"),
     (4, TypeError, "row_shape")],
    ids=["str", "digits", "float", "bool", "np_float", "zero", "scalar"],
)  # fmt: skip
def test_row_shape_that_is_not_a_shape_of_ints_is_refused(row_shape, err, where):
    """``row_shape`` must be a tuple/list of ints >= 1: strings, floats, bools and scalars are
    refused (not truncated or iterated) with the argument and the entry named, before any
    work."""
    with pytest.raises(err, match=rf"^{where}: expected "):
        judge(_floats(), _floats(), TOL, row_shape=row_shape)
    with pytest.raises(err, match=rf"^{where}: expected "):
        judge([1.0], [1.0], TOL, row_shape=row_shape)


def test_row_shape_of_ints_names_the_rows():
    """A valid ``row_shape`` (Python or NumPy ints, a tuple, a list or a 1-D int array) names a
    failing row by its coordinates: row 3 of ``[4, 8]`` is ``(1, 1)`` under ``(2, 2)``."""
    g = _floats()
    a = g.copy()
    a[3] *= np.float32(2.0)
    for rs in ((2, 2), [2, 2], (np.int64(2), np.int32(2)), np.array([2, 2])):
        v = judge(a, g, TOL, row_shape=rs)
        worst = next(c for c in v.checks if c.name == "relative L2 (worst row)")
        assert not worst.passed and worst.where == tuple(np.unravel_index(3, (2, 2)))


# ----------------------------------------------------------------------------- layout
def _numbers(v) -> list:
    """Every number of a verdict, bit for bit (floats as hex)."""

    def bits(x):
        return float(x).hex() if isinstance(x, float | np.floating) else x

    out = [(c.name, bits(c.value), bits(c.bound), c.passed, c.where) for c in v.checks]
    out.append((v.max_ulp, v.max_ulp_golden, v.n_nonfinite))
    if v.seeds is not None:
        s = v.seeds
        out.append((bits(s.max_abs_err), s.max_abs_pos, s.max_ulp, bits(s.cosine), s.n_fail))
    return out


def _layouts(x: np.ndarray) -> dict:
    """The same values in C order, Fortran order and as a view with negative strides."""
    return {"C": np.ascontiguousarray(x), "F": np.asfortranarray(x),
            "reversed": np.ascontiguousarray(x[::-1, ::-1])[::-1, ::-1]}  # fmt: skip


@pytest.mark.parametrize("shape", [(4, 8), (16, 64), (3, 5, 40)])
@pytest.mark.parametrize("rule", ["default", "seeds"])
def test_verdict_numbers_do_not_depend_on_the_memory_layout(shape, rule):
    """``actual`` and ``golden`` in C order, Fortran order or as negative-stride views hold the
    same values, so every check's value and bound, the ULPs and the seeds' report are equal bit
    for bit to those of the C-ordered pair (a reduction in memory order moves the last bit of
    the tensor cosine)."""
    rng = np.random.default_rng(0)
    g = rng.standard_normal(shape).astype(np.float32)
    a = (g * np.float32(1.0001)).astype(np.float32)
    if len(shape) == 3:
        g_l, a_l = {"C": g, "F": np.asfortranarray(g)}, {"C": a, "F": np.asfortranarray(a)}
    else:
        g_l, a_l = _layouts(g), _layouts(a)
    base = _numbers(judge(a, g, TOL, rule=rule))
    for an, av in a_l.items():
        for gn, gv in g_l.items():
            assert np.array_equal(av, a) and np.array_equal(gv, g)
            assert _numbers(judge(av, gv, TOL, rule=rule)) == base, (an, gn)
