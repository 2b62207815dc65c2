"""The compare report's error distribution (percentiles of |err| and ULP, relative L2) and the
tie-aware judging of block-id selections (:func:`tilesim.reference.judge`, ids as sets)."""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest
from test_cli_compare import compare_with_rule
from tilesim.cli.distribution import distribution
from tilesim.reference import judge

BF16 = ml_dtypes.bfloat16


def _inverted_cdf(x, q):
    """The smallest value with at least q% of the elements <= it (written from the definition)."""
    s = sorted(x)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def test_distribution_on_known_ulp_steps():
    """Positive BF16 values moved by k bit steps: ULP distance k by construction."""
    rng = np.random.default_rng(1)
    g = rng.uniform(1, 2, size=1000).astype(BF16)
    steps = rng.integers(0, 6, size=1000)
    steps[:3] = [40, 0, 17]
    a = (g.view(np.uint16) + steps.astype(np.uint16)).view(BF16)
    d = distribution(a, g)
    for q in (50, 90, 99):
        assert d["ulp"][f"p{q}"] == _inverted_cdf(steps.tolist(), q)
    assert d["ulp"]["max"] == 40
    err = [abs(float(x) - float(y)) for x, y in zip(a, g, strict=True)]
    for q in (50, 90, 99):
        assert d["abs_err"][f"p{q}"] == _inverted_cdf(err, q)
    assert d["abs_err"]["max"] == max(err)
    want = math.sqrt(sum(e * e for e in err)) / math.sqrt(sum(float(y) ** 2 for y in g))
    assert d["rel_l2"] == pytest.approx(want, rel=1e-12)


def test_distribution_skips_nan_and_handles_integers():
    g = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    a = np.array([1.0, np.nan, 3.5, 4.0], np.float32)
    d = distribution(a, g)
    assert d["n_finite"] == 3 and d["abs_err"]["max"] == 0.5
    ids = np.array([[1, 2, 3]], np.int32)
    d = distribution(ids, ids)
    assert d["ulp"] is None and d["rel_l2"] == 0.0


def test_compare_prints_the_distribution(capsys, tmp_path):
    g = np.ones(100, np.float32)
    a = g.copy()
    a[:10] = np.nextafter(np.float32(1), np.float32(2))  # 10 elements 1 ULP up
    a[0] = 1.5
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "g.npy", g)
    argv = [tmp_path / "a.npy", tmp_path / "g.npy", "--atol", "1", "--rtol", "0"]
    code, out, _ = compare_with_rule(capsys, "seeds", *argv)
    assert code == 0
    assert "ULP p50 0 p90 0 p99 1 max 4194304" in out  # 1.5 is 2**22 ULP above 1.0
    rel = 0.5 / 10  # ||err|| is dominated by the 0.5; ||g|| = 10
    code, out, _ = compare_with_rule(capsys, "seeds", *argv, "--json")
    dist = json.loads(out)["distribution"]
    assert dist["rel_l2"] == pytest.approx(rel, rel=1e-6) and dist["abs_err"]["max"] == 0.5


# ---------------------------------------------------------------------------------------------
# ties, on crafted scores


SET = {"atol": None, "rtol": None, "ratio": 0.0, "mode": "set"}


def tie_check(actual, golden, scores):
    """The id verdict of one row: (passed, IdReport)."""
    v = judge(actual, golden, SET, scores=scores)
    return v.passed, v.ids


def _scores(values):
    return np.asarray([values], dtype=np.float32)


def _ulp_up(x, n=1):
    x = np.float32(x)
    for _ in range(n):
        x = np.nextafter(x, np.float32(np.inf))
    return x


def _case(nb=20, k=16):
    """Scores: non-local block b scores 100 - b, except a 1-ULP tie at the boundary."""
    s = [100.0 - b for b in range(nb)]
    golden = list(range(k - 1)) + [nb - 1]  # blocks 0..14 + local 19
    return s, golden


def test_tie_within_one_ulp_is_accepted_and_reported():
    s, golden = _case()
    s[15] = float(_ulp_up(s[14]))  # block 15 1 ULP above block 14: should have won
    s[14], s[15] = s[15], s[14]  # golden picked 14 (the higher); 15 is 1 ULP below
    actual = [b for b in golden if b != 14] + [15]
    ok, r = tie_check(np.array([actual]), np.array([golden]), _scores(s))
    assert ok and r.wrong == []
    (t,) = r.tied
    assert t.row == (0,) and [x[:2] for x in t.ties] == [(15, 14)]


def test_two_ulps_is_not_a_tie():
    s, golden = _case()
    s[15] = float(np.float32(s[14]))
    s[14] = float(_ulp_up(s[14], 2))
    actual = [b for b in golden if b != 14] + [15]
    ok, r = tie_check(np.array([actual]), np.array([golden]), _scores(s))
    assert not ok and r.tied == [] and r.wrong[0].missing == [14] and r.wrong[0].extra == [15]


def test_swapping_a_block_above_the_boundary_is_refused():
    s, golden = _case()
    s[15] = s[14]  # an exact tie at the boundary ...
    actual = [b for b in golden if b != 3] + [15]  # ... but block 3 (score 97) was dropped
    ok, r = tie_check(np.array([actual]), np.array([golden]), _scores(s))
    assert not ok and r.wrong[0].missing == [3] and r.wrong[0].extra == [15]


@pytest.mark.parametrize(
    ("actual", "named"),
    [
        (list(range(14)) + [15, 15, 19], "duplicates"),
        (list(range(14)) + [15, 25], "out_of_range"),
        (list(range(14)) + [15, -1], "missing"),  # -1 = an empty slot: an id is missing
        (list(range(15)) + [15], "missing"),  # the local block missing
    ],
)
def test_malformed_selections_are_refused(actual, named):
    s, golden = _case()
    s[15] = s[14]
    actual = (actual + [19])[:16]
    ok, r = tie_check(np.array([actual]), np.array([golden]), _scores(s))
    assert not ok and getattr(r.wrong[0], named)


def test_nan_scores_never_tie():
    s, golden = _case()
    s[15] = float("nan")
    actual = [b for b in golden if b != 14] + [15]
    ok, r = tie_check(np.array([actual]), np.array([golden]), _scores(s))
    assert not ok and r.tied == []


# ---------------------------------------------------------------------------------------------
# ties end to end: an indexer input with two identical key blocks at the boundary


def test_cli_accepts_a_tied_selection(cli, tmp_path):
    rng = np.random.default_rng(5)
    nb = 20
    q = (rng.standard_normal((4, 128)) * 0.1).astype(BF16)
    k = (rng.standard_normal((nb * 128, 128)) * 0.1).astype(BF16)
    # float64 oracle of the block scores, to find the boundary
    s = (q.astype(np.float64) @ k.astype(np.float64).T).reshape(4, nb, 128).max(2).max(0)
    order = sorted(range(nb - 1), key=lambda b: -s[b])
    last_in, first_out = order[14], order[15]
    k.reshape(nb, 128, 128)[first_out] = k.reshape(nb, 128, 128)[last_in]  # identical blocks
    from tilesim.cli.tensorio import write_npz

    write_npz(tmp_path / "cap.npz", {"idx_q": q, "idx_k": k})
    code, _, err = cli(
        "golden", "--inputs", tmp_path / "cap.npz", "--op", "msa_indexer",
        "--params", json.dumps({"nb": nb}), "-o", tmp_path,
    )  # fmt: skip
    assert code == 0, err
    d = tmp_path / "cap"
    with np.load(d / "golden.npz") as z:
        ids = z["out"]
    lo, hi = sorted((last_in, first_out))
    assert lo in ids[0] and hi not in ids[0]  # equal scores: the lower id wins
    other = ids.copy()
    other[0, list(ids[0]).index(lo)] = hi  # the device took the other tied block
    np.save(tmp_path / "dev.npy", other)
    code, out, err = cli("compare", tmp_path / "dev.npy", d)
    assert code == 0, out + err
    assert f"id {hi} replaces {lo}: golden scores tie" in out and "accepted by score ties" in out
    other[0, list(other[0]).index(order[0])] = lo  # and now a block above the boundary lost
    np.save(tmp_path / "dev2.npy", other)
    code, out, _ = cli("compare", tmp_path / "dev2.npy", d)
    assert code == 1 and "FAIL" in out
