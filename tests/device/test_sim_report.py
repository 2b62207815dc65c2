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
    assert head + " flop | bytes | HBM-bound µs | bound µs | bound by | kernel / bound |" in text
    # z stated its HBM bound (0.25 µs at 1.6 TB/s): its bytes are recovered, 400 000
    assert "| b | 910b | z | 1 | 0 | 0 | 4 | — | 400000 | 0.25 | 0.25 | HBM | 16 |" in text
    assert "| b | 910b | y | 1 | 0 | 0 | 3 | — | — | — | — | — | — |" in text
    assert "| a | 950 | x | 1 | 0 | 0 | 1.5 | — | — | — | — | — | — |" in text


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


# ----------------------------------------------------------------------------- the yardstick
@pytest.fixture
def report(sim_report):
    """The module of the ``sim_report`` fixture (tests/device/conftest.py)."""
    import sys

    return sys.modules[type(sim_report).__module__]


def test_the_bound_is_the_largest_of_hbm_cube_and_floor(report):
    """By hand from the SoC sheet (shared/soc.py's table): the 910B moves 1.6e6 B per µs and
    does 24 cores x 16^3 MACs x 2 x 1.8 GHz = 353.89 TFLOP/s of BF16."""
    peak = 24 * 16**3 * 2 * 1.8e9  # FLOP/s
    cost = {"bytes": 3_200_000, "flop": int(peak * 1e-6)}  # 2 µs of HBM, 1 µs of cube
    y = report.yardstick("910b", 10.0, cost, {"floor µs": 1.5, "probe µs": 4.0})
    assert y["HBM-bound µs"] == pytest.approx(2.0) and y["cube-peak µs"] == pytest.approx(1.0)
    assert (y["bound by"], y["bound µs"]) == ("HBM", pytest.approx(2.0))
    assert y["kernel / bound"] == pytest.approx(5.0) and y["kernel / probe"] == 2.5
    assert y["kernel / floor"] == pytest.approx(10 / 1.5)
    y = report.yardstick("910b", 10.0, cost, {"floor µs": 2.5})  # the floor above both
    assert (y["bound by"], y["bound µs"], y["kernel / bound"]) == ("floor", 2.5, 4.0)
    y = report.yardstick("910b", 10.0, {"flop": int(peak * 3e-6)}, {})
    assert (y["bound by"], y["bound µs"]) == ("cube", pytest.approx(3.0))
    assert "HBM-bound µs" not in y and "floor µs" not in y


def test_the_950_rows_carry_the_950dt_bound_and_fp8_halves_the_cube_bound(report):
    y = report.yardstick("950", 1.0, {"bytes": 4_000_000, "flop": 10**9}, {})
    assert y["HBM-bound µs"] == pytest.approx(2.5) and y["HBM-bound µs 950DT"] == pytest.approx(1)
    y8 = report.yardstick("950", 1.0, {"flop": 10**9, "cube": "fp8"}, {})
    assert y8["cube-peak µs"] == pytest.approx(y["cube-peak µs"] / 2)
    assert "HBM-bound µs 950DT" not in report.yardstick("910b", 1.0, {"bytes": 8}, {})


def test_nothing_is_derived_without_inputs(report):
    assert report.yardstick("910b", 5.0, None, {}) == {}


def test_a_row_that_states_its_bounds_keeps_its_cost(report):
    """The inverse of SocSpec's two formulas gives back the contract's integers, and the
    derived columns never stay in a stored row."""
    from tilesim.shared.soc import get_soc

    spec, nbytes, flop = get_soc("950"), 368_279_552, 72_988_082_176
    extra = {"HBM-bound µs": spec.hbm_bound_us(nbytes), "cube-peak µs": spec.cube_bound_us(flop),
             "kernel / max bound": 3.0, "floor µs": 9.5, "note": "x"}  # fmt: skip
    row = {"kernel": "k", "soc": "950", "case": "c", "us": 1.0, "extra": extra}
    got = report.normalised_row(row)
    assert got["cost"] == {"bytes": nbytes, "flop": flop}
    assert got["extra"] == {"floor µs": 9.5, "note": "x"}
    assert report.normalised_row({**row, "cost": {"bytes": 7}})["cost"] == {
        "bytes": 7,
        "flop": flop,
    }


@pytest.mark.parametrize(
    "bad", [{"flops": 1}, {"flop": -1}, {"bytes": 1.5}, {"bytes": True}, {"cube": "fp8"},
            {"flop": 1, "cube": "int8"}, [("flop", 1)]],
)  # fmt: skip
def test_add_refuses_a_bad_cost(SimReport, tmp_path, bad):
    rep = SimReport(tmp_path / "r.md", base=None)
    with pytest.raises(ValueError, match=r"^cost"):
        rep.add(kernel="k", soc="910b", case="c", bit_exact=None, max_ulp=None, max_abs=None,
                us=1.0, cost=bad)  # fmt: skip


def test_the_report_puts_each_kernels_yardstick_on_top(SimReport, tmp_path):
    path = tmp_path / "cost_model.md"
    rep = SimReport(path, base=None, figures=None)
    rep.add(kernel="k", soc="910b", case="big", bit_exact=None, max_ulp=None, max_abs=None,
            us=8.0, cost={"bytes": 3_200_000, "flop": 0}, extra={"floor µs": 1.0})  # fmt: skip
    rep.add(kernel="k", soc="910b", case="small", bit_exact=1, max_ulp=0, max_abs=0.0, us=2.0)
    rep.write()
    text = path.read_text()
    top, full = text.split("## Every row")
    assert "### k" in top and "| 910b | big | 8 | 2 | HBM | 4 | — | 1 | — | — | — |" in top
    assert "small" not in top and "| k | 910b | small |" in full  # no bound: the full table
    row = json.loads(path.with_suffix(".json").read_text())["rows"][0]
    assert row["cost"] == {"bytes": 3_200_000, "flop": 0}
    assert row["yardstick"]["kernel / bound"] == 4.0 and "bound µs" not in row["extra"]


def test_the_published_table_is_this_generator_on_its_rows(SimReport, tmp_path):
    """docs/perf/cost_model.md is what the generator writes from docs/perf/cost_model.json."""
    import shutil
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs" / "perf"
    shutil.copy(docs / "cost_model.json", tmp_path / "cost_model.json")
    SimReport(tmp_path / "cost_model.md", base=None).write(rebuild=True)
    assert (tmp_path / "cost_model.md").read_text() == (docs / "cost_model.md").read_text()
    assert (tmp_path / "cost_model.json").read_text() == (docs / "cost_model.json").read_text()
