"""`tilesim cases` and the registry (the families' CASE_INFO tables) against the builders."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
from tilesim.cli.registry import (
    _merge,
    builder_path,
    case_module,
    family_builder,
    get_case,
    list_cases,
    load_registry,
    tolerance_text,
)
from tilesim.cli.runner import build_case
from tilesim.shared.registry import ops
from tilesim.shared.registry.case_schema import CASE_KEYS, TOLERANCE_MODES, CaseInfo, tolerance

SMALL = [c.name for c in load_registry().values() if c.size == "small"]


def test_registry_covers_every_family_of_the_issue():
    reg = load_registry()
    names = set(reg)
    assert {"m27_case_001", "m3_case_smoke_edge"} <= names
    assert {"sfa_bf16_b4_s2_seq64K_total_fp8_d", "sfa_bf16_b4_s2_seq64K_total_int8_d"} <= names
    kinds = {c.kind for c in reg.values() if c.family == "msa"}
    assert kinds == {"indexer", "decode", "main_branch"}
    for c in reg.values():
        assert isinstance(c, CaseInfo)
        t = c.tolerance
        assert set(t) == {"atol", "rtol", "ratio", "mode"} and t["mode"] in TOLERANCE_MODES
        if t["mode"] == "compare":
            assert t["atol"] >= 0 and t["rtol"] >= 0
        assert 0 <= t["ratio"] <= 1
        assert c.status == "runs" or c.status.startswith(("skip", "tilesim"))
        assert all(s.upper() in ("910B", "950") for s in c.soc)
        assert ":" in c.builder


def test_registry_is_the_union_of_the_family_tables():
    """One source: each family module's CASE_INFO, nothing added or dropped."""
    reg = load_registry()
    for family in ops.families():
        module, builder = ops.case_builder(family)
        mod = importlib.import_module(module)
        assert case_module(family) is mod and family_builder(family) is getattr(mod, builder)
        table = mod.CASE_INFO
        assert {n for n, c in reg.items() if c.family == family} == set(table)
        assert all(reg[n] is table[n] for n in table)
        assert {c.builder for c in table.values()} == {f"{module}:{builder}"}


def test_merge_rejects_duplicates_and_misfiled_entries():
    def info(name, family, builder=None):
        builder = builder or builder_path(family_builder(family))
        return CaseInfo(name=name, family=family, op="op", model="m", summary="s", seed=0,
                        size="small", tolerance=tolerance(0.0, 0.0), builder=builder)  # fmt: skip

    with pytest.raises(ValueError, match="duplicate case name 'a'"):
        _merge({"moe": {"a": info("a", "moe")}, "msa": {"a": info("a", "msa")}})
    with pytest.raises(ValueError, match="family 'moe'"):
        _merge({"moe": {"a": info("a", "dsa")}})
    with pytest.raises(ValueError, match="name 'b'"):
        _merge({"moe": {"b": info("a", "moe")}})
    with pytest.raises(ValueError, match="builder 'tilesim.reference.cases.moe:moe_make_case'"):
        _merge({"moe": {"a": info("a", "moe", "tilesim.reference.moe_cases:moe_make_case")}})


def test_cases_table_lists_every_case(cli):
    code, out, _ = cli("cases")
    assert code == 0
    for name in load_registry():
        assert name in out
    assert "set equality" in out and "0.5/0.015/0" in out
    code, out, _ = cli("cases", "--family", "moe")
    assert code == 0
    assert "m3_case_smoke_edge" in out and "sfa_bf16" not in out and "msa_" not in out
    code, out, _ = cli("cases", "--family", "moe", "-v")
    assert code == 0 and "builder: tilesim.reference.cases.moe:moe_make_case" in out


def test_cases_json_and_kind_filter(cli):
    code, out, _ = cli("cases", "--family", "main_branch", "--json")
    assert code == 0
    rows = json.loads(out)
    assert rows and all(r["kind"] == "main_branch" for r in rows)
    n4096 = next(r for r in rows if r["name"] == "msa_main_aligned_4096")
    assert n4096["tolerance"] == {"atol": 1e-3, "rtol": 1e-3, "ratio": 0.0, "mode": "compare"}
    assert "output" not in n4096  # shapes are not declared: `tilesim golden` reports them


def test_tolerance_text():
    assert tolerance_text(tolerance(mode="set")) == "set equality"
    assert tolerance_text(tolerance(mode="ulp")) == "ulp budget"
    assert tolerance_text(tolerance(1e-4, 5e-3, 5e-3)) == "0.0001/0.005/0.005"


def test_unknown_family_and_case_are_clear_errors(cli):
    code, _, err = cli("cases", "--family", "gpt")
    assert code == 2 and "unknown family 'gpt'" in err
    code, _, err = cli("golden", "m3_case_smoke_edg", "-o", "x")
    assert code == 2 and "unknown case 'm3_case_smoke_edg'" in err
    assert "did you mean m3_case_smoke_edge" in err


@pytest.mark.parametrize("name", SMALL)
def test_small_cases_build_the_case_schema_the_registry_describes(name):
    """The builder's case dict follows tilesim.shared.registry.case_schema and agrees with the
    entry."""
    info = get_case(name)
    built = build_case(info)
    case = built.case
    assert tuple(case) == CASE_KEYS or set(case) == set(CASE_KEYS)
    assert case["op"] == info.op
    assert case["tolerance"] == info.tolerance
    assert built.seed == info.seed
    assert built.inputs and all(isinstance(a, np.ndarray) for a in built.inputs.values())
    assert built.op_args == {**case["inputs"], **case["params"], **(
        {"progress": False} if "progress" in built.op_args else {})}  # fmt: skip


def test_list_cases_filters_by_family():
    assert {c.family for c in list_cases("dsa")} == {"dsa"}
    assert {c.kind for c in list_cases("decode")} == {"decode"}
    assert len(list_cases()) == len(load_registry())


def test_no_second_case_table_ships():
    """cases.json is gone: the registry is built from the Python tables alone."""
    from importlib import resources

    assert not resources.files("tilesim").joinpath("cases.json").is_file()
