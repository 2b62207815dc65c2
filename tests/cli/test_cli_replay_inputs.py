"""Inputs saved the natural way replay: `np.savez` of ml_dtypes arrays and a folder of `np.save`
files store BF16 / FP8 as opaque void (`|V2`, `|V1`); the replay takes each dtype from what the
op's metadata check accepts and reproduces the case's golden bit for bit. Where no type fits,
the hint names a way that exists (a manifest.json naming the dtypes), never a compare flag."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from tilesim.cli import tensorio as tio
from tilesim.cli.replay import digest

DSA = "sfa_bf16_b4_s2_seq64K_total_fp8_d"  # BF16 queries, FP8 packed cache, int32 ids
MOE = "m3_case_smoke_edge"  # BF16 tokens and weights, int32 cumsum


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    from tilesim.__main__ import main

    root = tmp_path_factory.mktemp("g")
    for case in (DSA, MOE):
        assert main(["golden", case, "-o", str(root), "--no-progress"]) == 0
    return root


def _inputs(d) -> dict:
    return tio.read_npz(d / "inputs.npz")


def _golden_digest(d) -> str:
    return digest(tio.read_npz(d / "golden.npz")["out"])


def test_savez_of_ml_dtypes_arrays(cli, goldens, tmp_path):
    ins = _inputs(goldens / DSA)
    kinds = {ins[k].dtype for k in ("query_nope", "nope_cache")}
    assert kinds == {np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn)}
    np.savez(tmp_path / "captured.npz", **ins)  # the natural way: no dtype member
    with np.load(tmp_path / "captured.npz") as z:  # what numpy itself stored
        assert z["query_nope"].dtype.str == "|V2" and z["nope_cache"].dtype.str == "|V1"
    code, out, err = cli(
        "golden", "--inputs", tmp_path / "captured.npz", "--op", "sparse_attention_antiquant",
        "--like", DSA, "-o", tmp_path / "r",
    )  # fmt: skip
    assert code == 0, err
    assert _golden_digest(tmp_path / "r" / "captured") == _golden_digest(goldens / DSA)
    assert "query_nope: opaque |V2 elements read as bfloat16" in out
    assert "nope_cache: opaque |V1 elements read as float8_e4m3fn" in out


def test_folder_of_npy_files(cli, goldens, tmp_path):
    d = tmp_path / "captured"
    d.mkdir()
    for k, a in _inputs(goldens / MOE).items():
        np.save(d / f"{k}.npy", a)  # BF16 -> |V2, int32 stays int32
    assert np.load(d / "sorted_tokens.npy").dtype.str == "|V2"
    code, out, err = cli(
        "golden", "--inputs", d, "--op", "moe_grouped_gemm", "--like", MOE, "-o", tmp_path / "r"
    )
    assert code == 0, err
    assert _golden_digest(tmp_path / "r" / "captured") == _golden_digest(goldens / MOE)
    assert "w13_flat: opaque |V2 elements read as bfloat16" in out


def test_opaque_bytes_no_type_fits(cli, goldens, tmp_path):
    """BF16 tokens saved as 1-byte voids: neither FP8 type is what the op takes."""
    ins = _inputs(goldens / MOE)
    ins["sorted_tokens"] = ins["sorted_tokens"].view(np.uint8).view("V1")
    np.savez(tmp_path / "bad.npz", **ins)
    code, _, err = cli(
        "golden", "--inputs", tmp_path / "bad.npz", "--op", "moe_grouped_gemm", "--like", MOE,
        "-o", tmp_path / "r",
    )  # fmt: skip
    assert code == 2 and err.count("\n") == 1, err
    assert "sorted_tokens" in err and "bfloat16" in err and "manifest.json" in err
    assert "--actual-dtype" not in err and "--golden-dtype" not in err
    assert not (tmp_path / "r").exists()


def test_opaque_of_a_size_no_dtype_has(cli, goldens, tmp_path):
    ins = _inputs(goldens / MOE)
    ins["expert_cumsum"] = ins["expert_cumsum"].view("V4")
    np.savez(tmp_path / "bad.npz", **ins)
    code, _, err = cli(
        "golden", "--inputs", tmp_path / "bad.npz", "--op", "moe_grouped_gemm", "-o", tmp_path
    )
    assert code == 2 and "expert_cumsum" in err and "4-byte" in err and "manifest.json" in err
    assert "--actual-dtype" not in err


def test_the_hinted_manifest_works(cli, goldens, tmp_path):
    """The way the hint names: .npy files of raw bits + a plain manifest naming the dtypes."""
    d = tmp_path / "captured"
    d.mkdir()
    desc = {}
    for k, a in _inputs(goldens / MOE).items():
        np.save(d / f"{k}.npy", a)
        desc[k] = {"file": f"{k}.npy", "dtype": a.dtype.name, "shape": list(a.shape)}
    (d / "manifest.json").write_text(json.dumps(desc))
    code, out, err = cli(
        "golden", "--inputs", d, "--op", "moe_grouped_gemm", "--like", MOE, "-o", tmp_path / "r"
    )
    assert code == 0, err
    assert "opaque" not in out  # the manifest named every dtype
    assert _golden_digest(tmp_path / "r" / "captured") == _golden_digest(goldens / MOE)
