"""The cost-model report fixture: metrics, the merge rule, and where it writes (build/perf/,
never the tracked docs/perf/cost_model.md)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest


@pytest.fixture
def SimReport(sim_report):  # noqa: N802 -- the class of the session fixture (tests/device/conftest.py)
    return type(sim_report)


def _bf16(x):
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16)


def test_metrics_bf16_one_ulp_off(SimReport):
    g = _bf16([1.0, 2.0, -3.0, 0.0])
    a = g.copy()
    # next BF16 above 2.0 is 2.015625 (7 mantissa bits)
    a[1] = _bf16([2.015625])[0]
    m = SimReport.metrics(a, g)
    assert m == {"bit_exact": 0.75, "max_ulp": 1, "max_abs": 0.015625}


def test_metrics_signed_zero_is_not_bit_exact_but_zero_ulp(SimReport):
    g = _bf16([0.0, 1.0])
    a = _bf16([-0.0, 1.0])
    m = SimReport.metrics(a, g)
    assert m["bit_exact"] == 0.5 and m["max_ulp"] == 0 and m["max_abs"] == 0.0


def test_metrics_rejects_dtype_mismatch(SimReport):
    with pytest.raises(TypeError, match="dtypes differ"):
        SimReport.metrics(np.zeros(3, np.float32), _bf16([0, 0, 0]))


def test_write_merges_by_kernel_soc_case(SimReport, tmp_path):
    path = tmp_path / "perf" / "cost_model.md"
    r1 = SimReport(path, base=None)
    r1.add(kernel="a", soc="950", case="x", bit_exact=1, max_ulp=0, max_abs=0.0, us=1.5)
    r1.add(kernel="b", soc="910b", case="y", bit_exact=0.5, max_ulp=1, max_abs=0.1, us=2.0)
    r1.write()
    # a later session re-runs (b, 910b, y) and adds (b, 910b, z): "a" is kept, y is replaced
    r2 = SimReport(path, base=None)
    r2.add(kernel="b", soc="910b", case="y", bit_exact=1, max_ulp=0, max_abs=0.0, us=3.0)
    r2.add(
        kernel="b",
        soc="910b",
        case="z",
        bit_exact=1,
        max_ulp=0,
        max_abs=0.0,
        us=4.0,
        extra={"HBM-bound µs": 0.25},
    )
    r2.write()
    rows = json.loads(path.with_suffix(".json").read_text())["rows"]
    assert [(r["kernel"], r["case"], r["us"]) for r in rows] == [
        ("a", "x", 1.5),
        ("b", "y", 3.0),
        ("b", "z", 4.0),
    ]
    text = path.read_text()
    head = "| kernel | SoC | case | bit-exact fraction | max ULP | max abs error | cost-model µs |"
    assert head + " HBM-bound µs |" in text
    assert "| b | 910b | z | 1 | 0 | 0 | 4 | 0.25 |" in text
    assert "| b | 910b | y | 1 | 0 | 0 | 3 | — |" in text
    assert "| a | 950 | x | 1 | 0 | 0 | 1.5 | — |" in text


def test_nothing_written_without_rows(SimReport, tmp_path):
    assert SimReport(tmp_path / "r.md").write() is None
    assert not (tmp_path / "r.md").exists()


def test_the_report_goes_to_the_build_folder(sim_report):
    """The session's report is build/perf/cost_model.md (git-ignored); docs/perf/ is only
    written by `nox -s sim` copying it there."""
    import os
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    if not os.environ.get("TILESIM_PERF_REPORT"):
        assert sim_report.path == repo / "build" / "perf" / "cost_model.md"
    assert sim_report.path.resolve().parent != (repo / "docs" / "perf").resolve()
    assert sim_report.base == repo / "docs" / "perf" / "cost_model.md"


def test_a_first_run_keeps_the_published_rows_without_touching_them(SimReport, tmp_path):
    pub = tmp_path / "docs" / "cost_model.md"
    p0 = SimReport(pub, base=None)
    p0.add(kernel="a", soc="910b", case="x", bit_exact=1, max_ulp=0, max_abs=0.0, us=1.0)
    p0.add(kernel="b", soc="910b", case="y", bit_exact=1, max_ulp=0, max_abs=0.0, us=2.0)
    p0.write()
    published = pub.read_bytes(), pub.with_suffix(".json").read_bytes()
    out = tmp_path / "build" / "cost_model.md"
    r = SimReport(out, base=pub)
    r.add(kernel="b", soc="910b", case="y", bit_exact=0.5, max_ulp=3, max_abs=0.5, us=9.0)
    r.write()
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [(x["kernel"], x["us"]) for x in rows] == [("a", 1.0), ("b", 9.0)]
    assert (pub.read_bytes(), pub.with_suffix(".json").read_bytes()) == published


def _row(SimReport, rep, kernel, soc, case, us):
    rep.add(kernel=kernel, soc=soc, case=case, bit_exact=1, max_ulp=0, max_abs=0.0, us=us)


def test_worker_parts_merge_once_without_losing_or_doubling_a_row(SimReport, tmp_path):
    """pytest-xdist: two workers' parts + the published table -> every row once."""
    pub = tmp_path / "docs" / "cost_model.md"
    p0 = SimReport(pub, base=None)
    for kernel, us in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        _row(SimReport, p0, kernel, "910b", "x", us)
    p0.write()
    out = tmp_path / "build" / "cost_model.md"
    parts = SimReport.parts_dir(out)
    w0, w1 = SimReport(out, base=pub), SimReport(out, base=pub)
    _row(SimReport, w0, "a", "910b", "x", 10.0)  # re-runs a published row
    _row(SimReport, w0, "d", "950", "x", 4.0)  # a new row
    _row(SimReport, w1, "b", "910b", "x", 20.0)
    _row(SimReport, w1, "b", "950", "x", 21.0)
    assert w0.write_part(parts, "gw0") and w1.write_part(parts, "gw1")
    assert SimReport(out, base=pub).write_part(parts, "gw2") is None  # no rows, no part
    assert not out.exists()  # the workers write parts only
    SimReport.merge_parts(SimReport(out, base=pub), parts)
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    got = sorted((r["kernel"], r["soc"], r["us"]) for r in rows)
    assert got == [
        ("a", "910b", 10.0),
        ("b", "910b", 20.0),
        ("b", "950", 21.0),
        ("c", "910b", 3.0),  # kept from the published table, not re-run
        ("d", "950", 4.0),
    ]
    assert not parts.exists()  # merged once: the parts are gone
    assert out.read_text().count("| b | 950 | x |") == 1


def test_the_same_row_from_two_workers_is_a_test_bug(SimReport, tmp_path):
    out = tmp_path / "cost_model.md"
    parts = SimReport.parts_dir(out)
    for worker in ("gw0", "gw1"):
        rep = SimReport(out, base=None)
        _row(SimReport, rep, "a", "910b", "x", 1.0)
        rep.write_part(parts, worker)
    with pytest.raises(ValueError, match=r"reported by workers gw0 and gw1"):
        SimReport.merge_parts(SimReport(out, base=None), parts)


def test_a_row_added_twice_in_one_process_is_written_once(SimReport, tmp_path):
    rep = SimReport(tmp_path / "r.md", base=None)
    _row(SimReport, rep, "a", "910b", "x", 1.0)
    _row(SimReport, rep, "a", "910b", "x", 2.0)
    rep.write()
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [(r["kernel"], r["us"]) for r in rows] == [("a", 2.0)]
