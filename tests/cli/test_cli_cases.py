"""`tilesim cases` and the registry (tilesim/cases.json) against the builders."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
from tilesim.cli.registry import get_case, list_cases, load_registry
from tilesim.cli.runner import build_case

SMALL = [c.name for c in load_registry().values() if c.size == "small"]


def _builder_table(spec):
    mod = importlib.import_module(spec.builder["module"])
    tables = [v for k, v in vars(mod).items() if k.endswith("_CASES") and isinstance(v, dict)]
    return tables[0] if tables else None


def test_registry_covers_every_family_of_the_issue():
    reg = load_registry()
    names = set(reg)
    assert {"m27_case_001", "m3_case_smoke_edge"} <= names
    assert {"sfa_bf16_b4_s2_seq64K_total_fp8_d", "sfa_bf16_b4_s2_seq64K_total_int8_d"} <= names
    kinds = {c.kind for c in reg.values() if c.family == "msa"}
    assert kinds == {"indexer", "decode", "main_branch"}
    for c in reg.values():
        assert c.tolerance["atol"] >= 0 and c.tolerance["rtol"] >= 0
        assert 0 <= c.tolerance["ratio"] <= 1
        assert c.status == "runs" or c.status.startswith(("skip", "tilesim"))
        assert all(s in ("910B", "950") for s in c.soc)


def test_cases_table_lists_every_case(cli):
    code, out, _ = cli("cases")
    assert code == 0
    for name in load_registry():
        assert name in out
    code, out, _ = cli("cases", "--family", "moe")
    assert code == 0
    assert "m3_case_smoke_edge" in out and "sfa_bf16" not in out and "msa_" not in out


def test_cases_json_and_kind_filter(cli):
    code, out, _ = cli("cases", "--family", "main_branch", "--json")
    assert code == 0
    rows = json.loads(out)
    assert rows and all(r["kind"] == "main_branch" for r in rows)
    n4096 = next(r for r in rows if r["name"] == "msa_main_aligned_4096")
    assert n4096["output"] == {"shape": [4096, 64, 128], "dtype": "float32"}
    assert n4096["tolerance"]["atol"] == 1e-3


def test_unknown_family_and_case_are_clear_errors(cli):
    code, _, err = cli("cases", "--family", "gpt")
    assert code == 2 and "unknown family 'gpt'" in err
    code, _, err = cli("golden", "m3_case_smoke_edg", "-o", "x")
    assert code == 2 and "unknown case 'm3_case_smoke_edg'" in err
    assert "did you mean m3_case_smoke_edge" in err


@pytest.mark.parametrize("name", [c.name for c in load_registry().values()])
def test_registry_agrees_with_the_builders_table(name):
    """Each registry entry names a case the builder knows, with the same seed and tolerance."""
    spec = get_case(name)
    table = _builder_table(spec)
    assert table is not None, f"{spec.builder['module']} exports no *_CASES table"
    if spec.builder.get("case") is None:  # an ad-hoc builder call (tilesim's extra cases)
        assert spec.status.startswith("tilesim extra")
        return
    assert spec.builder["case"] in table
    entry = table[spec.builder["case"]]

    def field(k):
        return entry.get(k) if isinstance(entry, dict) else getattr(entry, k, None)

    if field("seed") is not None:
        assert field("seed") == spec.seed
    for k in ("atol", "rtol", "ratio"):
        if field(k) is not None:
            assert field(k) == pytest.approx(spec.tolerance[k])
    tol = field("tolerance")
    if isinstance(tol, dict):
        for k, v in tol.items():
            if k == "compare":  # a non-elementwise rule, e.g. set equality of block ids
                assert spec.tolerance.get("mode") == v
            else:
                assert v == pytest.approx(spec.tolerance[k]), k
    if field("status") is not None:
        assert field("status") == spec.status
    if field("soc") is not None:
        assert {s.upper() for s in field("soc")} == set(spec.soc)


@pytest.mark.parametrize("name", SMALL)
def test_declared_shapes_match_what_the_builder_makes(name):
    spec = get_case(name)
    built = build_case(spec)
    assert set(built.inputs) == set(spec.inputs)
    for k, decl in spec.inputs.items():
        a = built.inputs[k]
        assert list(a.shape) == decl["shape"], k
        assert a.dtype.name == decl["dtype"], k
    assert built.seed == spec.seed
    assert all(isinstance(a, np.ndarray) for a in built.inputs.values())


def test_list_cases_filters_by_family():
    assert {c.family for c in list_cases("dsa")} == {"dsa"}
    assert len(list_cases()) == len(load_registry())


def test_registry_ships_with_the_package():
    """cases.json is package data of `tilesim` and tilesim.cli is a listed package (a wheel
    built from pyproject.toml carries both; checked by hand with `pip wheel .`)."""
    import re
    from importlib import resources
    from pathlib import Path

    assert resources.files("tilesim").joinpath("cases.json").is_file()
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()  # no tomllib on 3.10
    packages = re.search(r"^packages = \[(.*?)\]", text, re.M | re.S).group(1)
    assert '"tilesim.cli"' in packages
    assert re.search(r'^"\*" = \[.*"\*\.json"', text, re.M)
