"""The MLA prolog, the indexer prolog and the layer step from the command line: listed, goldens
written with every stage output (caches included, no output a path lacks), replayed, traced,
and `tilesim compare` naming the stage that first fails (``tilesim.reference.judging.stages``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tilesim.__main__ import main
from tilesim.cli.tensorio import write_npz
from tilesim.shared.dsa_attention_step import STEP_FIELDS

STEP = "dsa_attention_step_short_fp8"
MLA = "mla_prolog_int8_pad"


def _ok(*argv) -> None:
    assert main([str(a) for a in argv]) == 0


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Goldens of the step and the MLA prolog, and a "device" run of the step with the
    indexer's pre-fix RoPE (a replay with one switch changed)."""
    r = tmp_path_factory.mktemp("stages")
    _ok("golden", STEP, "-o", r / "golden")
    _ok("golden", MLA, "-o", r / "golden")
    _ok("golden", "--inputs", r / "golden" / STEP, "--params",
        '{"index_rope_pairing": "interleaved"}', "-o", r / "dev")  # fmt: skip
    return r


def test_the_families_are_listed(cli):
    """Each family lists exactly the cases of its module's CASE_INFO table."""
    import importlib

    for fam in ("mla_prolog", "dsa_attention_step"):
        table = importlib.import_module(f"tilesim.reference.cases.{fam}").CASE_INFO
        code, out, _ = cli("cases", "--family", fam, "--json")
        assert code == 0
        assert sorted(c["name"] for c in json.loads(out)) == sorted(table) and len(table) >= 7


def test_the_golden_holds_every_stage_output(root):
    m = json.loads((root / "golden" / STEP / "manifest.json").read_text())
    names = [t["name"] for t in m["tensors"] if t["role"] == "golden"]
    # FP8, packed latent rows: no q_norm_scale, kr_cache, kv_scale_cache
    absent = ("q_norm_scale", "kr_cache", "kv_scale_cache")
    assert names == [n for n in STEP_FIELDS if n not in absent]
    assert all(t["dtype"] != "object" for t in m["tensors"])


def test_replay_reproduces_the_golden_bit_for_bit(root, cli):
    code, _, err = cli("golden", "--inputs", root / "golden" / MLA, "-o", root / "replay")
    assert code == 0, err
    a = np.load(root / "golden" / MLA / "golden.npz")
    b = np.load(root / "replay" / MLA / "golden.npz")
    assert sorted(a.files) == sorted(b.files)
    assert all(a[k].tobytes() == b[k].tobytes() for k in a.files)  # NaN-poisoned rows too


def test_trace_runs_the_step(root, cli):
    code, out, err = cli("trace", root / "golden" / STEP)
    assert code == 0, err
    assert "dsa_attention_step ran" in out


def test_the_golden_against_itself_passes_every_stage(root, cli):
    g = root / "golden" / STEP
    code, out, err = cli("compare", g, g)
    assert code == 0, err
    assert "PASS dsa_attention_step_short_fp8: every dumped stage passes" in out
    for stage in ("mla_prolog", "dsa_indexer_prolog", "dsa_indexer", "sparse_attention"):
        assert f"stage {stage}: PASS" in out


def test_the_first_failing_stage_is_named(root, cli):
    code, out, _ = cli("compare", root / "dev" / STEP, root / "golden" / STEP)
    assert code == 1
    assert "stage mla_prolog: PASS" in out
    assert "stage dsa_indexer_prolog: FAIL" in out
    # no golden is recomputed from the failed index queries and keys: the indexer is judged
    # against the stored golden; the ids pass (the attention is recomputed from them)
    assert (
        "stage dsa_indexer: FAIL (against the stored golden: the device's index_q, "
        "index_q_scale, index_weights, k_cache, k_scale failed at dsa_indexer_prolog"
    ) in out
    assert ("stage sparse_attention: PASS (against the golden recomputed from the device's "
            "topk_indices (each passed its own stage))") in out  # fmt: skip
    assert "first failing stage dsa_indexer_prolog: index_q" in out
    code, out, _ = cli("compare", root / "dev" / STEP, root / "golden" / STEP, "--json")
    rep = json.loads(out)
    assert code == 1 and rep["first_failing_stage"] == "dsa_indexer_prolog"
    assert [s["passed"] for s in rep["stages"]] == [True, False, False, True]


def test_a_subset_dump_is_judged(root, cli, tmp_path):
    """An npz with two outputs; a single ``NAME.npy`` file answers its output."""
    g = np.load(root / "dev" / STEP / "golden.npz")
    from tilesim.cli.loading import load_from_manifest
    from tilesim.cli.manifest import read_manifest

    mpath = root / "dev" / STEP / "manifest.json"
    m = read_manifest(mpath)
    arrays = {e["name"]: load_from_manifest(mpath, e) for e in m["tensors"]
              if e["role"] == "golden" and e["name"] in ("attn_out", "query_nope")}  # fmt: skip
    write_npz(tmp_path / "dump.npz", arrays)
    code, out, _ = cli("compare", tmp_path / "dump.npz", root / "golden" / STEP)
    assert code == 0, out
    assert "stage dsa_indexer_prolog: not dumped" in out
    np.save(tmp_path / "index_weights.npy", g["index_weights"])
    code, out, _ = cli("compare", tmp_path / "index_weights.npy", root / "golden" / STEP)
    assert code == 1 and "first failing stage dsa_indexer_prolog: index_weights" in out


def test_the_mla_prolog_alone(root, cli):
    g = root / "golden" / MLA
    code, out, err = cli("compare", g, g)
    assert code == 0, err
    assert "stage mla_prolog: PASS" in out and "rows not written" in out
