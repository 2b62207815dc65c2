"""`tilesim trace` on a golden directory, a named case's or a replayed one: it reruns the call
the manifest records and emits exactly the records of `tilesim trace CASE`; --actual is judged
with the manifest's tolerance (exit 1 on FAIL)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tilesim.cli import tensorio as tio


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """{case: (golden dir, replayed dir, records of `trace CASE`)}"""
    from tilesim.__main__ import main

    root = tmp_path_factory.mktemp("t")
    out = {}
    for case in ("msa_decode_partial_nb17", "msa_indexer_nb17"):
        assert main(["golden", case, "-o", str(root / "g"), "--no-progress"]) == 0
        g = root / "g" / case
        assert main(["golden", "--inputs", str(g), "-o", str(root / "r"), "--no-progress"]) == 0
        rec = root / f"{case}.jsonl"
        assert main(["trace", case, "--records", str(rec), "--no-progress"]) == 0
        out[case] = (g, root / "r" / case, rec.read_text())
    return out


@pytest.mark.parametrize("case", ["msa_decode_partial_nb17", "msa_indexer_nb17"])
@pytest.mark.parametrize("which", [0, 1], ids=["case dir", "replayed dir"])
def test_trace_of_a_golden_dir_is_the_case_trace(cli, dirs, tmp_path, case, which):
    target, want = dirs[case][which], dirs[case][2]
    rec = tmp_path / "r.jsonl"
    png = ["--png", tmp_path / "t.png"] if which else []  # the drawing reads the same records
    code, out, err = cli("trace", target, "--records", rec, *png)
    assert code == 0, err
    assert rec.read_text() == want and want.count("\n") > 1
    assert out.startswith(f"{case}: ")
    if png:
        assert cli.png_size(tmp_path / "t.png")[0] > 0
    code, out, err = cli("trace", target / "manifest.json", "--records", tmp_path / "m.jsonl")
    assert code == 0 and (tmp_path / "m.jsonl").read_text() == want, err


def test_trace_actual_on_a_replayed_dir(cli, dirs, tmp_path):
    g, r, _ = dirs["msa_decode_partial_nb17"]
    good = g / "golden.npz"
    assert cli("trace", r, "--actual", f"{good}:out")[0] == 0
    bad = tio.read_npz(good)["out"].astype(np.float64)
    bad[0, 16:32] = bad[0, 16:32] * 2.0 + 1.0  # +1 per element: 20x the case's atol 5e-2
    np.save(tmp_path / "bad.npy", bad.astype(np.float32))
    code, out, err = cli("trace", r, "--actual", tmp_path / "bad.npy")
    assert code == 1 and "FAIL" in out, err


def test_trace_refuses_what_is_no_golden(cli, dirs, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = cli("trace", tmp_path / "empty")
    assert code == 2 and "not a golden directory" in err
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "manifest.json").write_text(json.dumps({"x": {"file": "x.npy"}}))
    code, _, err = cli("trace", tmp_path / "plain")
    assert code == 2 and "not a golden directory" in err
    code, _, err = cli("trace", dirs["msa_indexer_nb17"][0], "--seed", "3")
    assert code == 2 and "--seed" in err
