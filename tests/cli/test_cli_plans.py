"""`tilesim compare` only reads files and calls the judge: on the same arrays it gives the verdict
of a direct :func:`tilesim.reference.judging.plans.judge_outputs` call (every check, its value,
and the golden each output was judged against), for a plain op, the lightning indexer and the
decode step with its attention recomputed from the device's ids."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from tilesim.__main__ import main
from tilesim.cli.runner import jsonable
from tilesim.cli.tensorio import read_npz, write_npz
from tilesim.reference import dsa_attention_step_make_case, moe_make_case
from tilesim.reference.judging.plans import judge_outputs

#: the all-tie decode step: batch 0's index keys all equal (every score of rows 0, 1 ties)
TIE_CASE = dict(op="dsa_decode_step", all_tie=True, seq_lens=(200, 100), topk=64,
                attn_quant="int8", layout="kv_split")  # fmt: skip


def _ok(*argv) -> None:
    assert main([str(a) for a in argv]) == 0


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """The all-tie step's case and its golden directory, replayed from its inputs."""
    root = tmp_path_factory.mktemp("plans")
    case = dsa_attention_step_make_case(None, **TIE_CASE)
    write_npz(root / "inputs.npz", case["inputs"])
    (root / "params.json").write_text(json.dumps(jsonable(case["params"])))
    _ok("golden", "--inputs", root / "inputs.npz", "--op", "dsa_decode_step", "--params",
        root / "params.json", "--like", "dsa_step_b2_s2_int8", "--name", "tie",
        "-o", root)  # fmt: skip
    return case, root / "tie"


def _cli(cli, dump, golden) -> dict:
    code, out, err = cli("compare", dump, golden, "--json")
    assert code in (0, 1), err
    rep = json.loads(out)
    outs = rep.get("outputs", [rep])
    return {o["name"].rsplit(":", 1)[-1]: o for o in outs}


def _same(cli_rep: dict, direct) -> None:
    """The CLI's JSON report of each output and the direct verdicts agree check by check."""
    assert sorted(cli_rep) == sorted(ov.verdict.name.rsplit(":", 1)[-1] for ov in direct)
    for ov in direct:
        c, v = cli_rep[ov.verdict.name.rsplit(":", 1)[-1]], ov.verdict
        assert c["passed"] == v.passed and c["failed"] == v.failed, ov.output
        assert [(k["name"], k["value"], k["passed"]) for k in c["checks"]] == [
            (k.name, k.value, k.passed) for k in v.checks
        ], ov.output
        assert c.get("judged_against") == ov.against, ov.output


def _dump(tmp_path, **arrays):
    d = tmp_path / "dump"
    d.mkdir()
    for k, v in arrays.items():
        np.save(d / f"{k}.npy", v)
    return d


def test_the_decode_step_verdicts_agree(cli, step, tmp_path):
    """Ids tie-swapped across the top-k boundary, the golden's own attention output: the ids
    pass, the attention fails against the golden recomputed with the device's ids."""
    case, gdir = step
    golden = read_npz(gdir / "golden.npz")
    ids = golden["topk_indices"].copy()
    ids[0, :32] = np.arange(100, 132)  # equal golden scores: ties
    actual = {"topk_indices": ids, "scores": golden["scores"], "out": golden["out"]}
    direct = judge_outputs("dsa_decode_step", actual, golden, tolerance=case["tolerance"],
                           scores=golden["scores"], inputs=case["inputs"],
                           params=case["params"], name="tie")  # fmt: skip
    assert [ov.passed for ov in direct] == [True, True, False]
    assert "recomputed" in direct[2].against
    _same(_cli(cli, _dump(tmp_path, **actual), gdir), direct)


def test_the_indexer_verdicts_agree(cli, tmp_path):
    assert cli("golden", "dsa_indexer_short_int8", "-o", tmp_path)[0] == 0
    gdir = tmp_path / "dsa_indexer_short_int8"
    golden = read_npz(gdir / "golden.npz")
    scores = golden["scores"].copy()
    scores[0, 0] = np.nextafter(scores[0, 0], np.float32(np.inf))
    actual = {"topk_indices": golden["topk_indices"].astype(np.int64), "scores": scores}
    tol = json.loads((gdir / "manifest.json").read_text())["tolerance"]
    tol.pop("rule")
    direct = judge_outputs("dsa_indexer", actual, golden, tolerance=tol,
                           scores=golden["scores"], name="dsa_indexer_short_int8")  # fmt: skip
    assert all(ov.passed for ov in direct)
    _same(_cli(cli, _dump(tmp_path, **actual), gdir), direct)


def test_a_plain_op_verdict_agrees(cli, tmp_path):
    assert cli("golden", "m3_case_smoke_edge", "-o", tmp_path)[0] == 0
    gdir = tmp_path / "m3_case_smoke_edge"
    golden = read_npz(gdir / "golden.npz")
    out = golden["out"].astype(np.float32)
    out[5] *= 1.1
    actual = {"out": out.astype(ml_dtypes.bfloat16)}
    tol = moe_make_case("m3_case_smoke_edge")["tolerance"]
    direct = judge_outputs("moe_grouped_gemm", actual, golden, tolerance=tol,
                           name="m3_case_smoke_edge")  # fmt: skip
    assert not direct[0].passed
    np.save(tmp_path / "out.npy", actual["out"])
    _same(_cli(cli, tmp_path / "out.npy", gdir), direct)
