"""`tilesim compare` on the lightning indexer's ids and the decode step: a row's selection is its
first ``min(topk, visible)`` entries (the entries the attention reads), visibility comes from
the lengths and never from a ``-inf`` score, and the id report names what is wrong (an id past
the visible length, the golden scores of missing and extra ids, rows by their axes)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from tilesim.__main__ import main
from tilesim.cli.tensorio import read_npz, write_npz
from tilesim.reference import dsa_indexer_make_case

STEP = "dsa_step_b2_s2_int8"  # lengths 300 / 2100: rows 0, 1 see 299 / 300 positions
INDEXER_FP8 = "dsa_indexer_short_fp8"  # lengths 300 / 1000, FP32 weights


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    root = tmp_path_factory.mktemp("ids")
    assert main(["golden", STEP, "-o", str(root)]) == 0
    return root / STEP


def _dump(tmp_path, name: str, **arrays):
    d = tmp_path / name
    d.mkdir()
    for k, v in arrays.items():
        np.save(d / f"{k}.npy", v)
    return d


def _compare(cli, actual, golden) -> tuple[int, dict, str]:
    code, out, err = cli("compare", actual, golden, "--json")
    rep = json.loads(out) if out.strip() else {"outputs": []}
    return code, {o["name"].rsplit(":", 1)[-1]: o for o in rep["outputs"]}, err


def test_empty_slots_in_front_fail_the_ids_and_not_the_attention(cli, step, tmp_path):
    """Row 0 (299 visible of topk 2048) rotated: 100 ``-1`` slots first, 100 of its ids pushed
    past its first 299 entries, which the attention does not read. The ids fail (missing, and
    unread); the bit-identical attention passes against the stored golden."""
    g = read_npz(step / "golden.npz")
    ids = g["topk_indices"].copy()
    assert (ids[0] >= 0).sum() == 299 and np.all(ids[0, 299:] == -1)
    ids[0] = np.roll(ids[0], 100)
    d = _dump(tmp_path, "front", topk_indices=ids, out=g["out"])
    code, by, err = _compare(cli, d, step)
    assert code == 1, err
    (row,) = by["topk_indices"]["ids"]["wrong_rows"]
    pushed = sorted(g["topk_indices"][0, 199:299].tolist())
    assert row["row"] == "token 0" and row["missing"] == pushed and row["unread"] == pushed
    assert row["used"] == 299 and row["visible"] == 299
    assert by["out"]["passed"] and "beyond ties" in by["out"]["judged_against"]
    code, out, _ = cli("compare", d, step)
    assert "after the row's first 299 entries: not read" in out
    assert "100 of the first 299 entries are -1" in out


def test_order_inside_the_read_entries_is_free(cli, step, tmp_path):
    """Row 0's 299 ids permuted among themselves, the ``-1`` slots kept last: the ids pass and
    the attention is judged against the golden recomputed with them."""
    g = read_npz(step / "golden.npz")
    ids = g["topk_indices"].copy()
    ids[0, :299] = ids[0, :299][::-1]
    d = _dump(tmp_path, "perm", topk_indices=ids, out=g["out"])
    code, by, err = _compare(cli, d, step)
    assert by["topk_indices"]["passed"], err
    assert "order within rows" in by["out"]["judged_against"]


def test_an_invisible_id_is_named_with_the_scores(cli, step, tmp_path):
    g = read_npz(step / "golden.npz")
    ids = g["topk_indices"].copy()
    gone = int(ids[1, 3])
    ids[1, 3] = 1000  # row 1 sees 300 positions: 1000 is in range but not visible
    np.save(tmp_path / "ids.npy", ids)
    code, out, err = cli("compare", tmp_path / "ids.npy", f"{step}:topk_indices")
    assert code == 1, err
    s = float(g["scores"][1, gone])
    assert (
        f"token 1: missing ids [{gone}] (golden scores {s:.9g}); invisible ids [1000] "
        "(at or past the row's visible length 300) (golden scores -inf)"
    ) in out


def test_attention_rows_are_named_by_token_and_head(cli, step, tmp_path):
    g = read_npz(step / "golden.npz")
    out = g["out"].astype(np.float32)
    out[128 + 7] *= 1.5  # token 1, head 7 of [T*128, 512]
    d = _dump(tmp_path, "attn", topk_indices=g["topk_indices"],
              out=out.astype(ml_dtypes.bfloat16))  # fmt: skip
    code, text, err = cli("compare", d, step)
    assert code == 1, err
    assert "relative L2 (worst row)" in text and "at token 1, head 7;" in text
    assert "token*head" not in text


def test_visibility_comes_from_the_lengths_not_from_minus_inf(cli, tmp_path):
    """FP32 weights of -3e38 (finite) drive every visible score of row 0 to -inf: an invisible
    id (also -inf) in place of a visible one is no tie; the scores' -inf pass as they are."""
    case = dsa_indexer_make_case(INDEXER_FP8)
    w = case["inputs"]["weights"].copy()
    w[0] = -3e38
    write_npz(tmp_path / "inputs.npz", {**case["inputs"], "weights": w})
    code, _, err = cli("golden", "--inputs", tmp_path / "inputs.npz", "--op", "dsa_indexer",
                       "--like", INDEXER_FP8, "--name", "neg", "-o", tmp_path)  # fmt: skip
    assert code == 0, err
    g = read_npz(tmp_path / "neg" / "golden.npz")
    assert np.isneginf(g["scores"][0, :299]).all()  # visible, scored -inf
    ids = g["topk_indices"].copy()
    ids[0, 5] = 400  # invisible (row 0 sees 299), its score -inf like the id it replaces
    d = _dump(tmp_path, "dev", topk_indices=ids, scores=g["scores"])
    code, by, err = _compare(cli, d, tmp_path / "neg")
    assert code == 1, err
    (row,) = by["topk_indices"]["ids"]["wrong_rows"]
    assert row["invisible"] == [400] and row["missing"] == [5]
    assert by["topk_indices"]["ids"]["tied_rows"] == []
    assert by["scores"]["passed"]
    s = g["scores"].copy()
    s[0, 7] = 0.0  # a visible position the golden scores -inf
    d = _dump(tmp_path, "dev2", topk_indices=g["topk_indices"], scores=s)
    code, by, err = _compare(cli, d, tmp_path / "neg")
    assert code == 1 and "visibility (-inf)" in by["scores"]["failed"], err


def test_trace_actual_judges_the_indexers_ids(cli, tmp_path):
    """``trace --actual`` answers the run's outputs as ``compare`` does: an ids dump answers
    ``topk_indices`` (not the first output by name), a golden directory is read by its
    manifest (every output), a wrong id fails."""
    case = "dsa_indexer_short_int8"
    assert cli("golden", case, "-o", tmp_path)[0] == 0
    g = read_npz(tmp_path / case / "golden.npz")
    np.save(tmp_path / "ids.npy", g["topk_indices"])
    code, out, err = cli("trace", case, "--actual", tmp_path / "ids.npy")
    assert code == 0, err
    assert "ids.npy vs golden topk_indices: PASS, 0 rows wrong" in out
    assert "no dump of optional output 'scores'" in out
    code, out, err = cli("trace", case, "--actual", tmp_path / case, "--png", tmp_path / "t.png")
    assert code == 0, err
    assert "manifest.json:topk_indices vs golden topk_indices: PASS" in out
    assert "manifest.json:scores vs golden scores: PASS" in out
    wrong = g["topk_indices"].copy()
    wrong[2, 0] = wrong[2, 1]
    np.save(tmp_path / "wrong.npy", wrong)
    code, out, _ = cli("trace", case, "--actual", tmp_path / "wrong.npy")
    assert code == 1 and "FAIL, 1 rows wrong" in out


def test_trace_actual_on_the_decode_step_and_the_layer_step(cli, step, tmp_path):
    g = read_npz(step / "golden.npz")
    d = _dump(tmp_path, "dev", topk_indices=g["topk_indices"], out=g["out"])
    code, out, err = cli("trace", step, "--actual", d)
    assert code == 0, err
    assert "out.npy vs golden out: PASS, 0 failing" in out
    assert cli("golden", "mla_prolog_int8_pad", "-o", tmp_path)[0] == 0
    m = tmp_path / "mla_prolog_int8_pad"
    code, out, err = cli("trace", m, "--actual", m)
    assert code == 0 and "vs golden: PASS mla_prolog_int8_pad: every dumped stage passes" in out


def test_the_manifest_lists_the_outputs_in_the_ops_order(step):
    from tilesim.shared.dsa_attention_step import DECODE_OUTPUTS as STEP_OUTPUTS

    m = json.loads((step / "manifest.json").read_text())
    assert m["golden"] == list(STEP_OUTPUTS) == ["topk_indices", "scores", "out"]
    assert [t["name"] for t in m["tensors"] if t["role"] == "golden"] == list(STEP_OUTPUTS)


def test_compare_png_of_ids_draws_the_selection_per_row(cli, step, tmp_path, monkeypatch):
    """``--png`` of an id output: per row and candidate position, the ids both select, the
    missing, extra, unread and tied ones (no ULP picture of id values)."""
    from tilesim.cli import plot, plot_ids

    g = read_npz(step / "golden.npz")
    ids = g["topk_indices"].copy()
    ids[0] = np.roll(ids[0], 3)  # 3 ids pushed past the 299 entries read
    gone = int(ids[1, 3])
    ids[1, 3] = 1000  # row 1 sees 300 positions: 1000 is invisible
    np.save(tmp_path / "ids.npy", ids)
    drawn = {}
    real = plot.save_ids_png
    monkeypatch.setattr(plot, "save_compare_png", lambda *a, **k: pytest.fail("a ULP picture"))

    def keep(path, **kw):
        drawn.update(kw)
        real(path, **kw)

    monkeypatch.setattr(plot, "save_ids_png", keep)
    code, out, err = cli("compare", tmp_path / "ids.npy", f"{step}:topk_indices", "--png",
                         tmp_path / "ids.png")  # fmt: skip
    assert code == 1 and "wrote" in out, err
    assert cli.png_size(tmp_path / "ids.png")[0] > 0
    grid, marks = drawn["grid"], drawn["marks"]
    names = [n for n, _ in plot_ids.ID_CATEGORIES]
    pushed = g["topk_indices"][0, 296:299]
    assert grid.shape == (4, g["scores"].shape[1])
    assert all(names[grid[0, i]].startswith("missing") for i in pushed)
    assert names[grid[1, gone]].startswith("missing")
    assert names[grid[1, 1000]].startswith("invisible")
    assert {names[c].split(" ")[0] for _, _, c in marks} == {"missing", "unread", "invisible,"}
    assert int((grid == 1).sum()) == int((g["topk_indices"] >= 0).sum()) - 4
    assert "FAIL, 2 of 4 rows wrong" in drawn["title"]
