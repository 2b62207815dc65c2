"""The judge's contract on crafted data: NaN/Inf positions, ULPs in the golden's dtype, the
reshape rule, row-ULP budgets, id sets (-1 padding, int32/int64, ties by the golden's scores,
the DeepSeek indexer's ``[T, 2048]`` layout) and bad arguments."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from tilesim.reference import judge

BF16 = ml_dtypes.bfloat16
TOL = {"atol": 1e-3, "rtol": 1e-3, "ratio": 0.0, "mode": "compare"}
SET = {"atol": None, "rtol": None, "ratio": 0.0, "mode": "set"}
#: what the report calls each kind of wrong id
LABELS = {"duplicates": "duplicate", "missing": "missing", "extra": "extra",
          "out_of_range": "out-of-range"}  # fmt: skip


def _golden(shape=(8, 256), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(BF16)


def test_nan_and_inf_positions_in_text_and_json():
    g = _golden()
    a = g.copy()
    a[2, 7], a[5, 0] = np.nan, -np.inf
    v = judge(a, g, TOL)
    assert not v.passed and v.n_nonfinite == 2
    assert [i for i, _ in v.nonfinite] == [(2, 7), (5, 0)]
    assert "(2, 7) = nan" in v.summary() and "(5, 0) = -inf" in v.summary()
    d = json.loads(json.dumps(v.as_dict()))
    assert d["nonfinite"] == [{"index": [2, 7], "value": "nan"}, {"index": [5, 0], "value": "-inf"}]


def test_ulps_in_the_golden_dtype_when_the_dump_is_wider():
    """An FP32 dump 3 BF16 steps above a BF16 golden: 3 ULPs in BF16, 3 * 2^16 in FP32."""
    g = np.array([1.0, 1.5, 2.0, 3.0], BF16)
    a = (g.view(np.uint16) + np.uint16(3)).view(BF16).astype(np.float32)
    v = judge(a, g, {"atol": 1.0, "rtol": 0.0, "ratio": 0.0, "mode": "compare"}, rule="seeds")
    assert v.max_ulp_golden == 3 and v.max_ulp == 3 * 2**16
    assert "max ULP 3 in the golden's bfloat16 (196608 in the dump's float32)" in v.summary()


def test_reshape_when_the_element_count_matches_else_the_expected_shape():
    g = _golden()
    for shape in ((2048,), (1, 8, 256)):
        v = judge(g.reshape(shape), g, TOL)
        assert (
            v.passed
            and v.reshape == f"actual {list(shape)} reshaped to the golden's [8, 256] (C order)"
        )
        assert v.reshape in v.summary()
    with pytest.raises(ValueError, match=r"expected the golden's shape \[8, 256\]"):
        judge(g[:4], g, TOL)


def test_row_ulp_budget_counts_in_ulps_of_each_rows_largest_value():
    g = np.zeros((2, 4), np.float32)
    g[0] = [1.0, 0.5, 0.25, -1.0]  # row max 1.0: one BF16 ULP = 2^-7
    g[1] = [8.0, 1.0, 2.0, 3.0]  # row max 8: one ULP = 2^-4
    gb = g.astype(BF16)
    a = g.astype(np.float64)
    a[0, 2] += 2.0**-7  # 1 ULP of row 0 (4 ULPs of the element itself)
    a[1, 1] += 2 * 2.0**-4  # 2 ULPs of row 1
    ab = a.astype(np.float32).astype(BF16)
    v = judge(ab, gb, {"mode": "ulp", "row_ulp": 2.0})
    (c,) = [c for c in v.checks if c.name == "row ULP budget"]
    assert c.passed and c.value == 2.0 and c.where == (1,)
    v = judge(ab, gb, {"mode": "ulp", "row_ulp": 1.0})
    assert "row ULP budget" in v.failed
    assert v.seeds is None and (v.n_fail, v.threshold, v.max_abs_err) == (0, 0, 0.0)


def test_bad_arguments_are_refused_before_any_work():
    g = _golden()
    with pytest.raises(TypeError, match="tolerance"):
        judge(g, g, None)
    with pytest.raises(ValueError, match="tolerance.atol"):
        judge(g, g, {"mode": "compare", "atol": None, "rtol": 0.0})
    with pytest.raises(ValueError, match="rule"):
        judge(g, g, TOL, rule="loose")
    with pytest.raises(ValueError, match="mode: 'ulp'"):
        judge(g, g, {"mode": "ulp"}, rule="seeds")
    with pytest.raises(TypeError, match="integer dtype"):
        judge(g, g, SET)
    before = g.copy()
    judge(g, g, TOL)
    assert np.array_equal(before.view(np.uint16), g.view(np.uint16))


# ---------------------------------------------------------------------------------------------
# id sets in the DeepSeek indexer layout: [T, 2048] int32, -1 padded, FP32 scores [T, S]


def _indexer(t=3, s=3000, k=2048, seed=1):
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((t, s)).astype(np.float32)
    ids = np.full((t, k), -1, np.int32)
    for r in range(t):
        n = min(k, 1000 + 900 * r)  # row r sees 1000 + 900 r keys (causal)
        visible = scores[r, :n]
        top = np.argsort(-visible, kind="stable")[: min(k, n)]
        ids[r, : top.size] = top
    return ids, scores


def test_indexer_layout_golden_passes_in_any_order_and_int64():
    ids, scores = _indexer()
    shuffled = ids.copy()
    np.random.default_rng(2).shuffle(shuffled, axis=1)  # -1 padding moves too: sets, not order
    for a in (ids, shuffled, ids.astype(np.int64)):
        v = judge(a, ids, SET, scores=scores, kind="dsa_indexer")
        assert v.passed, v.summary()


def test_indexer_tie_accepted_only_within_the_score_rounding():
    ids, scores = _indexer()
    r = 2
    sel = set(ids[r][ids[r] >= 0].tolist())
    low = min(sel, key=lambda i: scores[r, i])
    out = next(c for c in range(2800) if c not in sel)
    for ulps, ok in ((1, True), (2, False)):
        s = scores.copy()
        s[r, out] = s[r, low]
        for _ in range(ulps):
            s[r, out] = np.nextafter(s[r, out], np.float32(-np.inf))
        a = ids.copy()
        a[r, list(a[r]).index(low)] = out
        v = judge(a, ids, SET, scores=s, kind="dsa_indexer")
        assert v.passed is ok, v.summary()
        if ok:
            (row,) = v.ids.tied
            assert row.row == "token 2" and row.ties[0][:2] == (out, low)
            assert f"id {out} replaces {low}: golden scores tie" in v.summary()
        else:
            (row,) = v.ids.wrong
            assert row.missing == [low] and row.extra == [out]


def test_indexer_wrong_duplicate_missing_and_extra_ids_are_named():
    ids, scores = _indexer()
    cases = {}
    a = ids.copy()
    a[0, 5] = a[0, 6]
    cases["duplicates"] = a
    a = ids.copy()
    a[0, 7] = -1
    cases["missing"] = a
    a = ids.copy()
    a[0, 1500] = 2999  # a padding slot filled: an id the golden does not have
    cases["extra"] = a
    a = ids.copy()
    a[1, 0] = 5000
    cases["out_of_range"] = a
    for what, x in cases.items():
        v = judge(x, ids, SET, scores=scores, kind="dsa_indexer")
        assert not v.passed and v.failed == ["id sets"], what
        assert getattr(v.ids.wrong[0], what), (what, v.summary())
        assert LABELS[what] + " ids" in v.summary()


def test_ids_without_scores_are_exact_sets_and_the_seeds_rule_sorts_rows():
    ids, _ = _indexer()
    a = ids.copy()
    a[0, [0, 1]] = a[0, [1, 0]]
    assert judge(a, ids, SET).passed
    assert judge(a, ids, SET, rule="seeds").passed
    a[0, 0] = 2999
    v = judge(a, ids, SET)
    assert not v.passed and any("ties cannot be recognised" in w for w in v.warnings)
    assert not judge(a, ids, SET, rule="seeds").passed


@pytest.mark.parametrize("seed", range(6))
def test_the_seeds_rule_is_compare_exactly(seed):
    """``rule="seeds"`` gives :func:`tilesim.reference.compare`'s verdict and counts, on
    perturbations around the ratio budget (the float64 and the native arithmetic)."""
    from tilesim.reference import compare

    rng = np.random.default_rng(seed)
    g = rng.standard_normal((16, 64)).astype(BF16)
    a = g.astype(np.float32)
    n_bad = int(rng.integers(0, 12))
    a.reshape(-1)[rng.choice(a.size, n_bad, replace=False)] += 0.5
    a = a.astype(BF16)
    tol = {"atol": 1e-2, "rtol": 1e-2, "ratio": 0.005, "mode": "compare"}  # allows 5 of 1024
    for arithmetic in ("float64", "native"):
        v = judge(a, g, tol, rule="seeds", arithmetic=arithmetic)
        rep = compare(a, g, atol=1e-2, rtol=1e-2, ratio=0.005, arithmetic=arithmetic)
        assert v.passed == rep.passed == (n_bad <= 5)
        assert (v.n_fail, v.threshold) == (rep.n_fail, rep.threshold) == (n_bad, 5)
        assert [c.name for c in v.checks] == ["seeds element rule"]


def test_a_zero_golden_row_is_judged_against_the_typical_row_norm():
    """A golden row of zeros (a query that sees no key) has no direction: a few tiny values
    there pass (relative L2 against 1/16 of the typical row norm), garbage of the typical size
    fails."""
    g = _golden()
    g[3] = 0
    tiny = g.copy()
    tiny[3, :4] = 1e-6
    v = judge(tiny, g, {"mode": "ulp"})
    assert v.passed, v.summary()
    junk = g.copy()
    junk[3] = g[4]
    v = judge(junk, g, {"mode": "ulp"})
    (row,) = [c for c in v.checks if c.name == "relative L2 (worst row)"]
    assert not row.passed and row.where == (3,) and row.value > 10
    assert "cosine (worst row)" not in v.failed  # a zero golden row has no angle to judge


def test_every_tolerance_the_case_schema_makes_the_judge_takes_and_back():
    """The case schema and the judge accept the same modes and keys: a row-ULP budget in any
    mode goes through ``make_case``, and the judge takes each dict as the schema makes it."""
    from tilesim.shared.registry import case_schema as cs
    from tilesim.shared.registry.tolerance import check_tolerance

    g = _golden()
    ids = np.arange(12, dtype=np.int32).reshape(3, 4)
    for mode in cs.TOLERANCE_MODES:
        nums = (1e-3, 1e-3) if mode == "compare" else (None, None)
        tol = cs.tolerance(*nums, mode=mode, row_ulp=None if mode == "set" else 2.0)
        case = cs.make_case(name=None, op="op", inputs={}, params={}, tolerance=tol, meta={})
        assert case["tolerance"] is tol
        a, b = (ids, ids) if mode == "set" else (g, g)
        assert judge(a, b, tol).passed, mode
    with pytest.raises(ValueError, match="row_ulp"):
        cs.tolerance(mode="ulp", row_ulp=-1)
    with pytest.raises(ValueError, match="optionally row_ulp"):
        check_tolerance(
            {"mode": "ulp", "atol": None, "rtol": None, "ratio": 0, "x": 1}, form="case"
        )
