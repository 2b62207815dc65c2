"""The one tolerance validator (:mod:`tilesim.shared.registry.tolerance`): its rules and messages,
the three forms its readers ask for, and the same message from every reader of a tolerance (the
case schema, the judge, the seeds' compare, a golden's manifest on the command line)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tilesim.cli import CliError
from tilesim.cli.manifest import check_tolerance_fields
from tilesim.reference import compare, judge
from tilesim.shared.registry import case_schema
from tilesim.shared.registry.tolerance import FORMS, check_bound, check_tolerance

GOOD = {"atol": 1e-3, "rtol": 2e-3, "ratio": 0.005, "mode": "compare"}


@pytest.mark.parametrize(
    ("value", "fraction", "exc", "message"),
    [
        (-1, False, ValueError, "x: expected a number >= 0, got -1"),
        (-0.5, True, ValueError, "x: expected a fraction in [0, 1], got -0.5"),
        (1.5, True, ValueError, "x: expected a fraction in [0, 1], got 1.5"),
        (math.nan, False, ValueError, "x: expected a finite number, got nan"),
        (math.inf, True, ValueError, "x: expected a finite number, got inf"),
        (True, False, TypeError, "x: expected a real number, got bool True"),
        ("0.5", False, TypeError, "x: expected a real number, got str '0.5'"),
        (None, False, TypeError, "x: expected a real number, got NoneType None"),
    ],
)
def test_a_bound_is_a_real_finite_number_at_least_zero(value, fraction, exc, message):
    with pytest.raises(exc) as e:
        check_bound(value, "x", fraction=fraction)
    assert str(e.value) == message


def test_good_bounds_come_back_as_floats():
    assert check_bound(0, "x") == 0.0 and type(check_bound(3, "x")) is float
    assert check_bound(np.float32(0.25), "x", fraction=True) == 0.25
    assert check_bound(1, "x", fraction=True) == 1.0 and check_bound(7.5, "x") == 7.5


@pytest.mark.parametrize(
    ("tol", "form", "exc", "message"),
    [
        (None, "judged", TypeError, "tolerance: expected a dict with keys atol, rtol, ratio, "
         "mode (optionally row_ulp), got None"),
        ({**GOOD, "slack": 1}, "stated", ValueError, "tolerance: expected a dict with keys "
         "atol, rtol, ratio, mode (optionally row_ulp), got"),
        ({"atol": 1e-3}, "judged", ValueError, "tolerance: expected a dict with keys"),
        ({"mode": "ulp"}, "case", ValueError, "tolerance: expected a dict with keys"),
        ({**GOOD, "mode": "close"}, "judged", ValueError,
         "tolerance.mode: expected one of ('compare', 'set', 'ulp'), got 'close'"),
        ({**GOOD, "atol": -1}, "case", ValueError, "tolerance.atol: expected a number >= 0, "
         "got -1"),
        ({**GOOD, "ratio": 2}, "stated", ValueError, "tolerance.ratio: expected a fraction in "
         "[0, 1], got 2"),
        ({**GOOD, "row_ulp": -2}, "judged", ValueError, "tolerance.row_ulp: expected a number "
         ">= 0, got -2"),
        ({**GOOD, "rtol": None}, "judged", ValueError, "tolerance.rtol: expected a number for "
         "mode 'compare', got None"),
        ({**GOOD, "mode": "set"}, "case", ValueError, "tolerance.atol: mode 'set' takes no "
         "atol/rtol (it publishes no numbers), got 0.001"),
        ({**GOOD, "ratio": None}, "case", TypeError, "tolerance.ratio: expected a real number"),
        ({**GOOD, "atol": "1e-3"}, "stated", TypeError, "tolerance.atol: expected a real "
         "number, got str '1e-3'"),
    ],
)  # fmt: skip
def test_each_rule_has_one_message(tol, form, exc, message):
    before = None if tol is None else dict(tol)
    with pytest.raises(exc) as e:
        check_tolerance(tol, form=form)
    assert str(e.value).startswith(message), str(e.value)
    assert tol == before  # the caller's dict is not modified


def test_the_forms_ask_for_more_or_less():
    """A stated tolerance may leave out anything (the command line completes it); a judged one
    needs a mode and, to compare, the numbers; a case states all four keys and no numbers for
    a mode that publishes none."""
    assert check_tolerance({}, form="stated") == {"atol": None, "rtol": None, "ratio": 0.0,
                                                   "mode": "compare"}  # fmt: skip
    ids = {"atol": 0.0, "rtol": 0.0, "ratio": 0.25, "mode": "set"}
    assert check_tolerance(ids) == ids  # the judge reads no numbers in mode "set"
    with pytest.raises(ValueError, match="takes no atol"):
        check_tolerance(ids, form="case")
    got = check_tolerance({"mode": "ulp", "row_ulp": 2}, form="judged")
    assert got == {"atol": None, "rtol": None, "ratio": 0.0, "mode": "ulp", "row_ulp": 2.0}
    assert type(got["row_ulp"]) is float
    case = check_tolerance({"atol": 1, "rtol": 0, "ratio": 0, "mode": "compare"}, form="case")
    assert case == {"atol": 1.0, "rtol": 0.0, "ratio": 0.0, "mode": "compare"}
    assert all(type(case[k]) is float for k in ("atol", "rtol", "ratio"))
    with pytest.raises(ValueError, match="^form: expected one of"):
        check_tolerance(GOOD, form="loose")
    assert FORMS == ("case", "judged", "stated")


def _message(call) -> str:
    with pytest.raises((TypeError, ValueError, CliError)) as e:
        call()
    return str(e.value)


@pytest.mark.parametrize(
    ("key", "bad", "rule"),
    [
        ("ratio", 2.0, "expected a fraction in [0, 1], got 2.0"),
        ("atol", -1.0, "expected a number >= 0, got -1.0"),
        ("rtol", math.nan, "expected a finite number, got nan"),
    ],
)
def test_every_reader_gives_the_same_message(key, bad, rule):
    """The case schema, the judge and a manifest name the key as ``tolerance.<key>``; the
    seeds' compare takes the numbers as arguments and names the argument; the rule's words are
    the same everywhere."""
    g = np.linspace(-1, 1, 8, dtype=np.float32)
    tol = {**GOOD, key: bad}
    assert _message(lambda: case_schema.tolerance(**tol)) == f"tolerance.{key}: {rule}"
    assert _message(lambda: judge(g, g, tol)) == f"tolerance.{key}: {rule}"
    numbers = {k: tol[k] for k in ("atol", "rtol", "ratio")}
    assert _message(lambda: compare(g, g, **numbers)) == f"{key}: {rule}"
    where = "golden/case/manifest.json"
    got = _message(lambda: check_tolerance_fields(tol, where))
    assert got == f"{where}: tolerance.{key}: {rule}"


def test_a_manifest_passes_its_own_object_back():
    """A manifest's tolerance comes back as it is (the resolver of the command line reads what
    it states and what it leaves out); an absent one is ``{}``."""
    stated = {"mode": "ulp", "row_ulp": 1}
    assert check_tolerance_fields(stated, "m") is stated
    assert check_tolerance_fields(None, "m") == {}
    with pytest.raises(CliError, match=r"^m: tolerance: expected a dict"):
        check_tolerance_fields([0.5], "m")
    worded = {**GOOD, "rule": "every element |a-g| <= atol + rtol*|g|"}  # as a golden writes it
    assert check_tolerance_fields(worded, "m") is worded
    with pytest.raises(CliError, match=r"^m: tolerance.rule: expected a str, got 3"):
        check_tolerance_fields({**GOOD, "rule": 3}, "m")
    with pytest.raises(CliError, match=r"^m: tolerance: expected a dict with keys"):
        check_tolerance_fields({**GOOD, "rules": "x"}, "m")
