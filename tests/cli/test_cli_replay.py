"""`tilesim golden --inputs FILE --op OP --params JSON`: a golden from captured inputs in each
accepted format equals the named case's golden bit for bit, and its manifest records the op,
the params and sha256 digests of the inputs."""

from __future__ import annotations

import hashlib
import json

import ml_dtypes
import numpy as np
import pytest

CASE = "m3_case_smoke_edge"  # MoE: bf16 sorted_tokens/w13_flat/w2_flat, int32 expert_cumsum


@pytest.fixture(scope="module")
def case_dir(tmp_path_factory):
    from tilesim.__main__ import main

    root = tmp_path_factory.mktemp("case")
    assert main(["golden", CASE, "-o", str(root), "--format", "bin"]) == 0
    return root / CASE


def _manifest(d):
    return json.loads((d / "manifest.json").read_text())


def _inputs(case_dir) -> dict:
    """The case's inputs read back with nothing but np.fromfile and the manifest."""
    out = {}
    for t in _manifest(case_dir)["tensors"]:
        if t["role"] == "input":
            dt = ml_dtypes.bfloat16 if t["dtype"] == "bfloat16" else np.dtype(t["dtype"])
            out[t["name"]] = np.fromfile(case_dir / t["file"], dtype=dt).reshape(t["shape"])
    return out


def _npz(case_dir, tmp_path):
    from tilesim.cli.tensorio import write_npz

    p = tmp_path / "captured.npz"
    write_npz(p, _inputs(case_dir))
    return p


def _npy_dir(case_dir, tmp_path):
    """A directory of .npy files; BF16 saved as its uint16 bits, dtypes in a plain manifest."""
    d = tmp_path / "captured"
    d.mkdir()
    desc = {}
    for k, a in _inputs(case_dir).items():
        bits = a.view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a
        np.save(d / f"{k}.npy", bits)
        desc[k] = {"file": f"{k}.npy", "dtype": a.dtype.name, "shape": list(a.shape)}
    (d / "manifest.json").write_text(json.dumps(desc))
    return d


def _bin_manifest(case_dir, tmp_path):
    return case_dir / "manifest.json"  # the golden's own manifest: its role "input" tensors


def _pt(case_dir, tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / "captured.pt"
    ts = {}
    for k, a in _inputs(case_dir).items():
        if a.dtype == ml_dtypes.bfloat16:  # rebuilt from the bits, not via tilesim.interop
            ts[k] = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        else:
            ts[k] = torch.from_numpy(a.copy())
    torch.save(ts, p)
    return p


FORMATS = {"npz": _npz, "npy dir": _npy_dir, "bin + manifest": _bin_manifest, "pt": _pt}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_replay_equals_the_case_golden(cli, case_dir, tmp_path, fmt):
    src = FORMATS[fmt](case_dir, tmp_path)
    params = case_dir / "manifest.json"  # the params (MoeDims, MoeTiling) of the case
    code, out, err = cli(
        "golden", "--inputs", src, "--op", "moe_grouped_gemm", "--params", params,
        "-o", tmp_path / "out", "--name", "replay", "--format", "bin",
    )  # fmt: skip
    assert code == 0, err
    d = tmp_path / "out" / "replay"
    assert (d / "golden_out.bin").read_bytes() == (case_dir / "golden_out.bin").read_bytes()
    m = _manifest(d)
    assert m["op"] == "moe_grouped_gemm"
    assert m["params"]["dims"]["hidden_size"] == 256
    assert m["tolerance"]["atol"] == 0.5  # taken from the manifest the params came from
    files = {t["name"]: t["file"] for t in _manifest(case_dir)["tensors"]}
    for rec in m["inputs"]:  # digests of the bytes a raw .bin of each input holds
        want = hashlib.sha256((case_dir / files[rec["name"]]).read_bytes()).hexdigest()
        assert rec["sha256"] == want, rec["name"]
    assert sorted(r["name"] for r in m["inputs"]) == sorted(_inputs(case_dir))
    assert [t["role"] for t in m["tensors"]] == ["golden"]  # no copy of the inputs
    # and the device stand-in (the case's golden) passes against the replayed golden
    assert cli("compare", case_dir / "golden_out.bin", d)[0] == 0


def test_params_as_json_text(cli, case_dir, tmp_path):
    m = _manifest(case_dir)
    text = json.dumps(m["params"])
    code, out, err = cli(
        "golden", "--inputs", _npz(case_dir, tmp_path), "--op", "moe_grouped_gemm",
        "--params", text, "--like", "m27_case_001", "-o", tmp_path,
    )  # fmt: skip
    assert code == 0, err
    got = json.loads((tmp_path / "captured" / "manifest.json").read_text())
    assert got["tolerance"]["atol"] == 0.008  # --like names the case whose rule applies
    with np.load(tmp_path / "captured" / "golden.npz") as z:
        bits = z["out"]
    assert bits.tobytes() == (case_dir / "golden_out.bin").read_bytes()


@pytest.mark.parametrize(
    "extra, word",
    [
        (["--params", "{not json"], "JSON"),
        (["--params", "[1, 2]"], "neither"),
        (["--params", '{"dims": {"__type__": "Os", "x": 1}}'], "unknown type"),
        (["--params", '{"dims": {"__type__": "MoeDims", "num_experts": -4}}'], "MoeDims"),
        (["--params", '{"trace": 1}'], "no argument 'trace'"),
        (["--params", '{"sorted_tokens": 1}'], "both"),
        ([], "missing a required argument"),
        (["--op", "nope"], "--op"),
        (["--like", "msa_indexer_nb8"], "runs msa_indexer"),
    ],
)
def test_replay_argument_errors(cli, case_dir, tmp_path, extra, word):
    argv = ["golden", "--inputs", _npz(case_dir, tmp_path), "-o", tmp_path / "o"]
    if "--op" not in extra:
        argv += ["--op", "moe_grouped_gemm"]
    code, _, err = cli(*argv, *extra)
    assert code == 2 and word in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_rejected_inputs_are_exit_2(cli, case_dir, tmp_path):
    from tilesim.cli.tensorio import write_npz

    ins = _inputs(case_dir)
    ins["expert_cumsum"] = ins["expert_cumsum"][::-1].copy()  # not a cumulative sum
    write_npz(tmp_path / "bad.npz", ins)
    code, _, err = cli(
        "golden", "--inputs", tmp_path / "bad.npz", "--op", "moe_grouped_gemm",
        "--params", case_dir / "manifest.json", "-o", tmp_path / "o",
    )  # fmt: skip
    assert code == 2 and "rejected the inputs" in err and "expert_cumsum" in err
    assert not (tmp_path / "o").exists()


def test_replay_and_case_are_exclusive(cli, case_dir, tmp_path):
    code, _, err = cli("golden", CASE, "--inputs", case_dir, "-o", tmp_path)
    assert code == 2 and "no CASE" in err
    code, _, err = cli("golden", "-o", tmp_path)
    assert code == 2 and "--inputs" in err
    code, _, err = cli("golden", CASE, "--op", "moe_grouped_gemm", "-o", tmp_path)
    assert code == 2 and "go with --inputs" in err


def test_replay_of_an_indexer_writes_block_scores(cli, tmp_path):
    """The replayed indexer golden stores FP32 block scores = float64 dot products rounded
    once to FP32, max over each block's keys, then over the 4 index heads."""
    assert cli("golden", "msa_indexer_nb17", "-o", tmp_path)[0] == 0
    src = tmp_path / "msa_indexer_nb17" / "inputs.npz"
    code, _, err = cli(
        "golden", "--inputs", src, "--op", "msa_indexer", "--params", '{"nb": 17}',
        "-o", tmp_path / "r",
    )  # fmt: skip
    assert code == 0, err
    with np.load(tmp_path / "r" / "inputs" / "golden.npz") as z:
        scores, ids = z["block_scores"], z["out"]
    with np.load(src) as z:
        q = z["idx_q"].view(ml_dtypes.bfloat16).astype(np.float64)
        k = z["idx_k"].view(ml_dtypes.bfloat16).astype(np.float64)
    s = (q @ k.T).astype(np.float32)  # exact products, one rounding (K = 128)
    want = s.reshape(4, 17, 128).max(axis=2).max(axis=0)
    assert scores.shape == (1, 17) and np.array_equal(scores[0], want)
    order = sorted(range(16), key=lambda b: (-want[b], b))[:15] + [16]
    assert ids[0].tolist() == order
