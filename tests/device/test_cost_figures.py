"""The committed cost figures (``tests/device/cost_figures.json``) that the sim session guards.

PyPTO's cost model is deterministic (the interpreter is pinned, ``docs/device.md``), so a
kernel's cost at a fixed shape is a figure, not a measurement with noise: every
``sim_report.add`` of a row with a committed figure asserts its µs within 2 % of it
(``CostFigures.check`` in tests/device/conftest.py) and so fails the test that produced the
row. A regression fails; an improvement updates the figure in the same commit.

Checked here, without the simulator:

* the table is well formed, and each figure agrees with its row of the published table
  (``docs/perf/cost_model.json``, which ``nox -s sim`` writes from the same runs);
* every kernel of the published table has a figure on each SoC it has rows for, produced by a
  test of the CI sim run (``-m "sim and not slow"``, collected in a subprocess: no kernel
  runs), and every ``slow`` figure by a test of the slow set;
* the guard itself: 2 % either way passes, more fails with a message that says how to update;
  a row that misses a target its figure reaches fails; an unguarded row is not checked.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIGURES = Path(__file__).with_name("cost_figures.json")
PUBLISHED = REPO / "docs" / "perf" / "cost_model.json"
KEY = ("kernel", "soc", "case")


@pytest.fixture
def report(sim_report):
    """The module of the ``sim_report`` fixture (tests/device/conftest.py)."""
    return sys.modules[type(sim_report).__module__]


def _figures() -> dict:
    return json.loads(FIGURES.read_text())


def _published() -> dict:
    return {tuple(r[k] for k in KEY): r for r in json.loads(PUBLISHED.read_text())["rows"]}


def test_the_table_is_well_formed():
    data = _figures()
    assert data["tolerance"] == 0.02
    keys = [tuple(e[k] for k in KEY) for e in data["figures"]]
    assert len(keys) == len(set(keys)), "one figure per (kernel, SoC, case)"
    for e in data["figures"]:
        assert set(e) <= {*KEY, "us", "test", "run", "targets"}, e
        assert e["soc"] in ("910b", "950") and e["run"] in ("CI", "slow"), e
        assert isinstance(e["us"], float) and math.isfinite(e["us"]) and e["us"] > 0, e
        assert e["test"].startswith("tests/device/test_") and "::" in e["test"], e
        for t in e.get("targets", []):
            assert set(t) == {"us", "source"} and t["us"] > 0 and t["source"].strip(), t


def test_each_figure_is_its_published_row():
    """The figures and docs/perf/cost_model.json come from the same runs: within 2 %."""
    rows = _published()
    for e in _figures()["figures"]:
        key = tuple(e[k] for k in KEY)
        assert key in rows, f"{key}: no row in {PUBLISHED.name}"
        assert abs(rows[key]["us"] - e["us"]) <= 0.02 * e["us"], (key, rows[key]["us"], e["us"])


def test_every_kernel_has_a_ci_figure_on_each_soc():
    ci = {(e["kernel"], e["soc"]) for e in _figures()["figures"] if e["run"] == "CI"}
    published = {(k, soc) for k, soc, _ in _published()}
    assert published <= ci, f"kernels without a CI figure: {sorted(published - ci)}"


def _collected(marker: str, files: set[str]) -> set[str]:
    """The node ids ``pytest --collect-only -m marker`` selects in ``files`` (no kernel runs)."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
           "-p", "no:cacheprovider", "-m", marker, *sorted(files)]  # fmt: skip
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {line.strip() for line in out.stdout.splitlines() if "::" in line}


@pytest.mark.torch
def test_each_figure_comes_from_a_test_of_its_run():
    """A ``CI`` figure's test is in the CI sim run (``nox -s sim`` under ``CI``: ``sim and not
    slow``), a ``slow`` figure's in the slow set: each guard runs where the table says."""
    figs = _figures()["figures"]
    files = {e["test"].split("::")[0] for e in figs}
    want = {"CI": _collected("sim and not slow", files), "slow": _collected("sim and slow", files)}
    missing = [(e["run"], e["test"]) for e in figs if e["test"] not in want[e["run"]]]
    assert not missing, missing


def _guarded(report, tmp_path, us: float, targets=()):
    fig = tmp_path / "figures.json"
    entry = {"kernel": "k", "soc": "910b", "case": "c", "us": 100.0, "test": "t::t", "run": "CI"}
    fig.write_text(json.dumps({"tolerance": 0.02, "figures": [{**entry, "targets": targets}]}))
    rep = report.SimReport(tmp_path / "r.md", base=None, figures=fig)
    rep.add(kernel="k", soc="910b", case="c", bit_exact=None, max_ulp=None, max_abs=None, us=us)
    return rep


@pytest.mark.parametrize("us", [100.0, 98.01, 101.99])
def test_within_two_percent_passes(report, tmp_path, us):
    assert [r["us"] for r in _guarded(report, tmp_path, us).rows] == [us]


@pytest.mark.parametrize("us", [97.9, 102.1, 200.0])
def test_more_than_two_percent_either_way_fails_and_says_how_to_update(report, tmp_path, us):
    with pytest.raises(AssertionError, match=r"committed figure 100\.0 .*tolerance ±2 %") as e:
        _guarded(report, tmp_path, us)
    assert 'updates "us" of this entry' in str(e.value) and "figures.json" in str(e.value)


def test_a_guarded_row_without_a_cost_fails(report, tmp_path):
    with pytest.raises(AssertionError, match="committed figure"):
        _guarded(report, tmp_path, None)


def test_a_reached_target_must_stay_reached(report, tmp_path):
    reached = [{"us": 101.0, "source": "page"}]
    _guarded(report, tmp_path, 100.9, reached)
    with pytest.raises(AssertionError, match=r"above the target 101\.0 \(page\)"):
        _guarded(report, tmp_path, 101.5, reached)  # within 2 % of the figure, above target
    _guarded(report, tmp_path, 101.5, [{"us": 50.0, "source": "page"}])  # not reached: guard


def test_an_unguarded_row_is_not_checked(report, tmp_path):
    rep = report.SimReport(tmp_path / "r.md", base=None, figures=tmp_path / "none.json")
    rep.add(kernel="k", soc="910b", case="c", bit_exact=None, max_ulp=None, max_abs=None, us=1e9)
    assert rep.rows[0]["us"] == 1e9
