"""`tilesim compare` on device dumps: `.pt` files, CANN dump-converter npy names, and
multi-output dumps matched to the golden's outputs by name or index."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from tilesim.cli.dumps import CANN_NPY

CASE = "m3_case_smoke_edge"  # golden out: bfloat16 [8, 256], atol 0.5


@pytest.fixture(scope="module")
def golden_dir(tmp_path_factory):
    from tilesim.__main__ import main

    root = tmp_path_factory.mktemp("g")
    assert main(["golden", CASE, "-o", str(root), "--format", "bin"]) == 0
    return root / CASE


def _golden(d):
    return np.fromfile(d / "golden_out.bin", dtype=ml_dtypes.bfloat16).reshape(8, 256)


def _torch_bf16(a):
    torch = pytest.importorskip("torch")
    return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)


def test_pt_single_tensor_and_dict(cli, golden_dir, tmp_path):
    torch = pytest.importorskip("torch")
    g = _golden(golden_dir)
    torch.save(_torch_bf16(g), tmp_path / "out.pt")
    code, out, err = cli("compare", tmp_path / "out.pt", golden_dir)
    assert code == 0 and "PASS" in out, err
    bad = g.astype(np.float32)
    bad[3, 4] += 50
    torch.save({"out": _torch_bf16(bad.astype(ml_dtypes.bfloat16)), "lse": torch.zeros(3)},
               tmp_path / "two.pt")  # fmt: skip
    code, out, _ = cli("compare", tmp_path / "two.pt", golden_dir)  # picked by name "out"
    assert code == 1 and "(3, 4)" in out


def test_pt_with_code_is_not_executed(cli, golden_dir, tmp_path):
    """weights_only=True: a pickled object is refused, not run."""
    torch = pytest.importorskip("torch")

    class Evil:
        def __reduce__(self):
            return (open, (str(tmp_path / "pwned"), "w"))

    torch.save({"out": Evil()}, tmp_path / "evil.pt")
    code, _, err = cli("compare", tmp_path / "evil.pt", golden_dir)
    assert code == 2 and "cannot read" in err
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "name, ok",
    [
        ("MoeGroupedGemm.moe_gemm_1.12.3.1718000000123456.output.0.npy", True),
        ("Add.layer.0.add.5.0.1718000000.output.2.npy", True),  # dots in the op name
        ("MoeGroupedGemm.moe_gemm_1.12.3.1718000000123456.input.1.npy", True),
        ("MoeGroupedGemm.moe_gemm_1.x.3.17.output.0.npy", False),
        ("out.npy", False),
    ],
)
def test_cann_names(name, ok):
    m = CANN_NPY.match(name)
    assert bool(m) == ok
    if name.startswith("Add."):
        assert m["op_type"] == "Add" and m["op_name"] == "layer.0.add" and m["index"] == "2"


def _cann(d, i, a, io="output", ts=1718000000123456):
    np.save(d / f"MoeGroupedGemm.moe_gemm_1.12.3.{ts}.{io}.{i}.npy", a)


def test_cann_dump_directory(cli, golden_dir, tmp_path):
    g = _golden(golden_dir)
    d = tmp_path / "dump"
    d.mkdir()
    _cann(d, 0, np.zeros((8, 256), np.float32), io="input")  # inputs are ignored
    _cann(d, 0, g.view(np.uint16))
    code, _, err = cli("compare", d, golden_dir)
    assert code == 2 and "uint16" in err  # the raw dtype is reported, not guessed
    code, out, err = cli("compare", d, golden_dir, "--actual-dtype", "bfloat16")
    assert code == 0 and "output.0.npy" in out, err
    _cann(d, 1, np.zeros(4, np.float32))  # an extra device output the golden lacks
    code, out, _ = cli("compare", d, golden_dir, "--actual-dtype", "bfloat16")
    assert code == 0 and "ignored device output" in out
    _cann(d, 0, g.view(np.uint16), ts=1718000000999999)  # a second run in the same dir
    code, _, err = cli("compare", d, golden_dir, "--actual-dtype", "bfloat16")
    assert code == 2 and "2 op runs" in err


def _two_output_golden(tmp_path):
    """A hand-made golden directory with outputs "attn" (bf16) and "lse" (fp32)."""
    from tilesim.cli.manifest import tensor_entry
    from tilesim.cli.tensorio import write_npz

    rng = np.random.default_rng(0)
    attn = rng.normal(size=(4, 8)).astype(ml_dtypes.bfloat16)
    lse = rng.normal(size=4).astype(np.float32)
    d = tmp_path / "two"
    d.mkdir()
    write_npz(d / "golden.npz", {"attn": attn, "lse": lse})
    m = {
        "case": "two",
        "tolerance": {"atol": 0.0, "rtol": 0.0, "ratio": 0.0, "mode": "compare"},
        "tensors": [
            tensor_entry("attn", "golden", attn, "golden.npz", "attn"),
            tensor_entry("lse", "golden", lse, "golden.npz", "lse"),
        ],
    }
    (d / "manifest.json").write_text(json.dumps(m))
    return d, attn, lse


def test_multi_output_by_index_and_name(cli, tmp_path):
    torch = pytest.importorskip("torch")
    d, attn, lse = _two_output_golden(tmp_path)
    dump = tmp_path / "dump"
    dump.mkdir()
    _cann(dump, 0, attn.view(np.uint16))
    bad_lse = lse.copy()
    bad_lse[2] += 1
    _cann(dump, 1, bad_lse)
    code, out, err = cli("compare", dump, d, "--actual-dtype", "bfloat16")
    assert code == 2 and "float32" in err  # --actual-dtype is for every output: lse refuses
    (dump / next(p.name for p in dump.iterdir() if ".output.0." in p.name)).unlink()
    _cann(dump, 0, attn.astype(np.float32))
    code, out, err = cli("compare", dump, d, "--allow-dtype-mismatch")
    assert code == 1, err  # attn passes, lse (output 1) fails
    assert "PASS two:attn" in out and "FAIL two:lse" in out and "(2,)" in out
    # a .pt dict answers by name, in any order; a list by position
    torch.save({"lse": torch.from_numpy(lse), "attn": _torch_bf16(attn)}, tmp_path / "d.pt")
    code, out, err = cli("compare", tmp_path / "d.pt", d)
    assert code == 0 and out.count("PASS") == 2, err
    torch.save([_torch_bf16(attn), torch.from_numpy(bad_lse)], tmp_path / "l.pt")
    code, out, _ = cli("compare", tmp_path / "l.pt", d)
    assert code == 1 and "FAIL two:lse" in out
    # one file against a two-output golden: name the output
    np.save(tmp_path / "lse.npy", lse)
    code, _, err = cli("compare", tmp_path / "lse.npy", d)
    assert code == 2 and "GOLDEN:NAME" in err
    code, out, err = cli("compare", tmp_path / "lse.npy", f"{d}:lse")
    assert code == 0 and "PASS two" in out, err
    code, out, _ = cli("compare", tmp_path / "d.pt", d, "--json")
    rep = json.loads(out)
    assert rep["passed"] is True and [o["name"] for o in rep["outputs"]] == ["two:attn", "two:lse"]


def test_actual_dtypes_per_output_name(cli, tmp_path):
    """An ``.npz`` dump with a BF16 member stored as raw bits (``np.savez``: ``|V2``) beside an
    FP32 one: read as a ``.npy`` of raw bits is, the member takes the golden output's dtype
    (same width); ``--actual-dtype attn=bfloat16`` names the dtype of that output alone; the
    plain form applies to every output (and the FP32 member refuses it)."""
    d, attn, lse = _two_output_golden(tmp_path)
    np.savez(tmp_path / "dump.npz", attn=attn, lse=lse)
    with np.load(tmp_path / "dump.npz") as z:
        assert z["attn"].dtype.kind == "V"
    code, out, err = cli("compare", tmp_path / "dump.npz", d)
    assert code == 0 and out.count("PASS") == 2, err
    np.save(tmp_path / "attn.npy", attn)  # the same raw bits in a .npy: the same verdict
    code, npy_out, err = cli("compare", tmp_path / "attn.npy", f"{d}:attn")
    assert code == 0 and "PASS two" in npy_out, err
    code, _, err = cli("compare", tmp_path / "dump.npz", d, "--actual-dtype", "bfloat16")
    assert code == 2 and "cannot reinterpret float32" in err
    code, out, err = cli("compare", tmp_path / "dump.npz", d, "--actual-dtype", "attn=bfloat16")
    assert code == 0 and out.count("PASS") == 2, err
    np.savez(tmp_path / "bits.npz", attn=attn.view(np.uint16), lse=lse.view(np.uint32))
    code, out, err = cli("compare", tmp_path / "bits.npz", d, "--actual-dtype",
                         "attn=bfloat16, lse=float32")  # fmt: skip
    assert code == 0 and out.count("PASS") == 2, err
    for bad, why in (
        ("out=bfloat16", "not a golden output"),
        ("attn=bf16", "unknown dtype"),
        ("attn", "unknown dtype"),
        ("attn=bfloat16,attn=bfloat16", "NAME=DTYPE"),
    ):
        code, _, err = cli("compare", tmp_path / "dump.npz", d, "--actual-dtype", bad)
        assert code == 2 and why in err, (bad, err)  # fmt: skip
