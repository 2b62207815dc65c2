"""`tilesim compare` on the lightning indexer's and the decode step's goldens: ids by the
score-aware set rule, scores as floats (optional on the device side), and the step's attention
judged against the golden recomputed with the device's ids when those differ only by ties."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from tilesim.__main__ import main

STEP = "dsa_step_b2_s2_int8"  # B 2, s1 2, lengths 300 / 2100: rows 2, 3 choose 2048 of 2099+
INDEXER = "dsa_indexer_short_int8"
#: the all-tie step: batch 0's index keys all equal (every score of rows 0, 1 ties)
TIE_CASE = dict(op="dsa_decode_step", all_tie=True, seq_lens=(200, 100), topk=64,
                attn_quant="int8", layout="kv_split")  # fmt: skip


def _golden_cli(*argv) -> None:
    assert main([str(a) for a in argv]) == 0


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    """{"step", "indexer", "tie"}: golden directories (the tie one replayed from its inputs)."""
    from tilesim.cli.runner import jsonable
    from tilesim.cli.tensorio import write_npz
    from tilesim.reference.cases.dsa_attention_step import dsa_attention_step_make_case

    root = tmp_path_factory.mktemp("dsa_goldens")
    _golden_cli("golden", STEP, "-o", root)
    _golden_cli("golden", INDEXER, "-o", root)
    case = dsa_attention_step_make_case(None, **TIE_CASE)
    write_npz(root / "tie_inputs.npz", case["inputs"])
    (root / "tie_params.json").write_text(json.dumps(jsonable(case["params"])))
    _golden_cli("golden", "--inputs", root / "tie_inputs.npz", "--op", "dsa_decode_step",
                "--params", root / "tie_params.json", "--like", STEP, "--name", "tie",
                "-o", root)  # fmt: skip
    return {"step": root / STEP, "indexer": root / INDEXER, "tie": root / "tie", "case": case}


def _load(d) -> dict:
    with np.load(d / "golden.npz") as z:
        out = {k: z[k] for k in z.files if not k.startswith("__")}
    if "out" in out:
        out["out"] = out["out"].view(ml_dtypes.bfloat16)
    return out


def _dump(tmp_path, name: str, **arrays):
    d = tmp_path / name
    d.mkdir()
    for k, v in arrays.items():
        np.save(d / f"{k}.npy", v)
    return d


def _compare(cli, actual, golden):
    code, out, err = cli("compare", actual, golden, "--json")
    rep = json.loads(out) if out.strip() else None
    by = {o["name"].rsplit(":", 1)[1]: o for o in rep["outputs"]} if rep else {}
    return code, by, err


def _seeds_failures(actual, golden, atol=1e-4, rtol=5e-3) -> int:
    """The seeds' element rule written out in float64: elements beyond atol + rtol*|g|."""
    a, g = np.asarray(actual, np.float64), np.asarray(golden, np.float64)
    return int((np.abs(a - g) > atol + rtol * np.abs(g)).sum())


def _attention(case, ids):
    """The step's attention with ``ids``: the kv_split golden called directly."""
    from tilesim.reference import sparse_attention_antiquant_kv_split

    i, p = case["inputs"], case["params"]
    out = sparse_attention_antiquant_kv_split(
        i["query_nope"], i["query_rope"], i["kn_quant"], i["kr"], i["kn_scales"], ids,
        i["block_table"], i["seq_lens"], nq=p["nq"], softmax_scale=p["softmax_scale"],
        topk=p["topk"], block_size=p["block_size"], tiling=p["tiling"], progress=False,
    )  # fmt: skip
    return np.asarray(out)


# ------------------------------------------------------------------------- the decode step


def test_step_golden_passes_itself_and_permuted_ids(cli, goldens, tmp_path):
    g = _load(goldens["step"])
    code, by, err = _compare(cli, goldens["step"], goldens["step"])  # (a)
    assert code == 0, err
    assert set(by) == {"topk_indices", "scores", "out"} and all(o["passed"] for o in by.values())
    assert "the ids are the golden's" in by["out"]["judged_against"]
    ids = g["topk_indices"].copy()
    rng = np.random.default_rng(1)
    ids[2] = rng.permutation(ids[2])  # (b) a full row (2048 valid ids), order free
    ids[3, :2048] = ids[3, :2048][::-1]
    assert not np.array_equal(ids, g["topk_indices"])
    d = _dump(tmp_path, "perm", topk_indices=ids, out=g["out"])  # no scores: optional
    code, by, err = _compare(cli, d, goldens["step"])
    assert code == 0, err
    assert "scores" not in by and by["topk_indices"]["ids"]["wrong_rows"] == []
    assert by["topk_indices"]["ids"]["tied_rows"] == []  # same sets: nothing to tie
    assert "recomputed" in by["out"]["judged_against"]


def test_step_wrong_id_fails_and_keeps_the_stored_golden(cli, goldens, tmp_path):
    g = _load(goldens["step"])
    ids, s = g["topk_indices"].copy(), g["scores"][3].astype(np.float64)
    chosen = ids[3][ids[3] >= 0]
    top = int(chosen[np.argmax(s[chosen])])
    unchosen = np.setdiff1d(np.flatnonzero(np.isfinite(s)), chosen)
    low = int(unchosen[np.argmin(s[unchosen])])
    assert s[top] - s[low] > 1e-3 * abs(s[top])  # far from a tie in FP32
    ids[3][ids[3] == top] = low  # (d)
    d = _dump(tmp_path, "wrong", topk_indices=ids, out=g["out"])
    code, by, err = _compare(cli, d, goldens["step"])
    assert code == 1, err
    v = by["topk_indices"]
    assert not v["passed"] and "id sets" in v["failed"]
    (row,) = v["ids"]["wrong_rows"]
    assert row["missing"] == [top] and row["extra"] == [low]
    assert by["out"]["passed"] and "beyond ties" in by["out"]["judged_against"]


def test_step_wrong_attention_fails(cli, goldens, tmp_path):
    g = _load(goldens["step"])
    out = g["out"].astype(np.float32)
    out[7] *= 1.5  # (e) one token*head row
    assert np.abs(g["out"][7].astype(np.float32)).max() > 0  # the scaling changes the row
    d = _dump(tmp_path, "attn", topk_indices=g["topk_indices"],
              out=out.astype(ml_dtypes.bfloat16))  # fmt: skip
    code, by, err = _compare(cli, d, goldens["step"])
    assert code == 1, err
    assert by["topk_indices"]["passed"] and not by["out"]["passed"]
    assert "relative L2 (worst row)" in by["out"]["failed"]
    assert "stored golden" in by["out"]["judged_against"]


# ------------------------------------------------------------------------- score ties


def _tie_swap(goldens):
    """Row 0 of the all-tie step: its 64 chosen ids (0..63 by the lower-position rule) with
    the first 32 replaced by unchosen positions 100..131, whose golden scores are equal."""
    g = _load(goldens["tie"])
    ids = g["topk_indices"].copy()
    s0 = g["scores"][0]
    assert np.array_equal(ids[0], np.arange(64))  # the documented tie rule
    assert np.all(s0[100:132] == s0[0])  # exact ties across the top-k boundary
    ids[0, :32] = np.arange(100, 132)
    return g, ids


def test_tie_swap_is_judged_against_the_recomputed_golden(cli, goldens, tmp_path):
    g, ids = _tie_swap(goldens)  # (c)
    recomputed = _attention(goldens["case"], ids)
    d = _dump(tmp_path, "tie", topk_indices=ids, out=recomputed, scores=g["scores"])
    code, by, err = _compare(cli, d, goldens["tie"])
    assert code == 0, err
    v = by["topk_indices"]
    assert v["passed"] and v["ids"]["wrong_rows"] == []
    (row,) = v["ids"]["tied_rows"]
    assert sorted(t[0] for t in row["ties"]) == list(range(100, 132))
    against = by["out"]["judged_against"]
    assert "recomputed" in against and "score ties" in against
    assert by["out"]["passed"] and by["out"]["max_ulp"] == 0  # bit-exact to the recomputation


def test_tie_swap_with_the_original_attention_fails(cli, goldens, tmp_path):
    g, ids = _tie_swap(goldens)  # (f): the out of the golden's own ids
    recomputed = _attention(goldens["case"], ids)
    n_bad = _seeds_failures(g["out"], recomputed)
    assert n_bad > round(0.005 * recomputed.size)  # the two goldens differ beyond the tolerance
    d = _dump(tmp_path, "orig", topk_indices=ids, out=g["out"])
    code, by, err = _compare(cli, d, goldens["tie"])
    assert code == 1, err
    assert by["topk_indices"]["passed"] and not by["out"]["passed"]
    assert by["out"]["n_fail"] == n_bad  # counted against the recomputed golden
    assert "recomputed" in by["out"]["judged_against"]


# ------------------------------------------------------------------------- the indexer alone


def test_indexer_ids_and_optional_scores(cli, goldens, tmp_path):
    g = _load(goldens["indexer"])
    np.save(tmp_path / "ids.npy", g["topk_indices"].astype(np.int64))  # ids only, int64
    code, out, err = cli("compare", tmp_path / "ids.npy", goldens["indexer"])
    assert code == 0, err
    assert "no dump of optional output 'scores'" in out and "tie-aware" in out
    s = g["scores"].copy()
    s[0, 0] += np.float32(abs(s[0, 0]) * 1e-7)  # an FP32 reduction-order difference
    d = _dump(tmp_path, "both", topk_indices=g["topk_indices"], scores=s)
    code, by, err = _compare(cli, d, goldens["indexer"])
    assert code == 0 and by["scores"]["passed"], err
    hidden = np.argwhere(np.isneginf(g["scores"]))[0]
    s[tuple(hidden)] = 0.0  # a position the row does not see
    d = _dump(tmp_path, "mask", topk_indices=g["topk_indices"], scores=s)
    code, by, err = _compare(cli, d, goldens["indexer"])
    assert code == 1 and by["topk_indices"]["passed"], err
    assert "visibility (-inf)" in by["scores"]["failed"]
    d = _dump(tmp_path, "noids", scores=g["scores"])
    code, _, err = cli("compare", d, goldens["indexer"])
    assert code == 2 and "topk_indices" in err and "required" in err
