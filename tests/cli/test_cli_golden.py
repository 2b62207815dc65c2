"""`tilesim golden`: files written, re-read and checked against a fresh reference run and an
independent float64 oracle; the bin layout re-read with np.fromfile from the manifest alone."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
from tilesim.cli.registry import get_case
from tilesim.cli.runner import build_case, run_reference

CASE = "m3_case_smoke_edge"  # E 4, H 256, I 128, swigluoai; tiny


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def _swigluoai_oracle(x, w13_flat, w2_flat, cumsum, e, h, i, alpha=1.702, limit=7.0):
    """float64 per-expert MLP written from the weight layout's definition (docs/ops/moe.md)."""
    x = x.astype(np.float64)
    out = np.zeros((x.shape[0], h))
    for k in range(e):
        rows = slice(int(cumsum[k]), int(cumsum[k + 1]))
        gu = x[rows] @ w13_flat[k * h : (k + 1) * h].astype(np.float64)
        gate = np.minimum(gu[:, :i], limit)
        up = np.clip(gu[:, i:], -limit, limit)
        act = (up + 1.0) * gate / (1.0 + np.exp(-alpha * gate))
        out[rows] = act @ w2_flat[k * i : (k + 1) * i].astype(np.float64)
    return out


def test_npz_golden_round_trip(cli, tmp_path):
    code, out, err = cli("golden", CASE, "-o", tmp_path)
    assert code == 0, err
    d = tmp_path / CASE
    m = _manifest(d)
    assert m["case"] == CASE and m["op"] == "moe_grouped_gemm" and m["seed"] == 99
    assert m["tolerance"]["atol"] == 0.5 and m["tolerance"]["rtol"] == 0.015
    assert m["tiling"]["unroll"] == [4, 2, 1]  # the case's own unroll list, normalised
    import tilesim

    assert m["tilesim_version"] == tilesim.__version__
    with np.load(d / "inputs.npz") as z:
        dtypes = json.loads(str(z["__tilesim_dtypes__"]))
        x = z["sorted_tokens"].view(ml_dtypes.bfloat16)
        w13 = z["w13_flat"].view(ml_dtypes.bfloat16)
        w2 = z["w2_flat"].view(ml_dtypes.bfloat16)
        cs = z["expert_cumsum"]
    assert dtypes["sorted_tokens"] == "bfloat16" and dtypes["expert_cumsum"] == "int32"
    with np.load(d / "golden.npz") as z:
        golden = z["out"].view(ml_dtypes.bfloat16)
    entries = {t["name"]: t for t in m["tensors"]}
    assert entries["out"]["shape"] == [8, 256] and entries["out"]["role"] == "golden"
    assert entries["w13_flat"]["nbytes"] == w13.nbytes

    # 1) the golden is exactly what a fresh reference run on the written inputs gives
    from tilesim.reference import moe_grouped_gemm

    built = build_case(get_case(CASE))
    fresh = moe_grouped_gemm(
        x, (w13, w2), cs, built.op_args["dims"], tiling=built.op_args["tiling"]
    )
    assert np.array_equal(fresh.view(np.uint16), golden.view(np.uint16))
    # 2) and agrees with an independent float64 oracle within the case's tolerance
    ref = _swigluoai_oracle(x, w13, w2, cs, 4, 256, 128)
    g = golden.astype(np.float64)
    assert np.all(np.abs(g - ref) <= 0.5 + 0.015 * np.abs(ref))
    assert np.corrcoef(g.ravel(), ref.ravel())[0, 1] > 0.999
    assert "inputs.npz" in out and "golden.npz" in out


def test_bin_golden_is_readable_from_the_manifest_alone(cli, tmp_path):
    assert cli("golden", CASE, "-o", tmp_path / "npz")[0] == 0
    code, _, err = cli("golden", CASE, "-o", tmp_path / "bin", "--format", "bin")
    assert code == 0, err
    d = tmp_path / "bin" / CASE
    m = _manifest(d)
    assert m["format"] == "bin"
    with (
        np.load(tmp_path / "npz" / CASE / "inputs.npz") as zi,
        np.load(tmp_path / "npz" / CASE / "golden.npz") as zg,
    ):
        ref = {k: zi[k] for k in zi.files} | {k: zg[k] for k in zg.files}
    on_disk = sorted(p.name for p in d.iterdir())
    assert on_disk == sorted([t["file"] for t in m["tensors"]] + ["manifest.json"])
    dt = {"bfloat16": np.uint16, "int32": np.int32}  # read as raw little-endian words
    for t in m["tensors"]:
        raw = (d / t["file"]).read_bytes()
        assert len(raw) == t["nbytes"] == int(np.prod(t["shape"])) * t["itemsize"]
        a = np.fromfile(d / t["file"], dtype=np.dtype(dt[t["dtype"]]).newbyteorder("<"))
        a = a.reshape(t["shape"])
        assert np.array_equal(a, ref[t["name"]].view(a.dtype)), t["name"]
        assert t["byte_order"] == "little"
    # the two formats hold identical goldens; cumsum values as the case defines them
    cs = np.fromfile(d / "input_expert_cumsum.bin", dtype="<i4")
    assert cs.tolist() == [0, 1, 1, 4, 8]


def test_never_overwrites_without_force(cli, tmp_path):
    assert cli("golden", CASE, "-o", tmp_path)[0] == 0
    before = (tmp_path / CASE / "golden.npz").read_bytes()
    code, _, err = cli("golden", CASE, "-o", tmp_path, "--seed", "5")
    assert code == 2 and "--force" in err
    assert (tmp_path / CASE / "golden.npz").read_bytes() == before
    code, _, err = cli("golden", CASE, "-o", tmp_path, "--seed", "5", "--force")
    assert code == 0, err
    assert _manifest(tmp_path / CASE)["seed"] == 5
    assert (tmp_path / CASE / "golden.npz").read_bytes() != before  # new data


def test_seed_override_is_deterministic(cli, tmp_path):
    for sub in ("a", "b"):
        assert cli("golden", CASE, "-o", tmp_path / sub, "--seed", "7")[0] == 0
    a = (tmp_path / "a" / CASE / "golden.npz").read_bytes()
    b = (tmp_path / "b" / CASE / "golden.npz").read_bytes()
    assert a == b
    m = _manifest(tmp_path / "a" / CASE)
    out = (tmp_path / "a").resolve()
    assert m["seed"] == 7 and m["reproduce"] == f"tilesim golden {CASE} -o {out} --seed 7"


def test_unwritable_output_is_a_clear_error(cli, tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    code, _, err = cli("golden", CASE, "-o", blocker / "sub")
    assert code == 2 and "cannot create output directory" in err
    assert not (blocker.parent / "sub").exists()


def test_golden_runs_the_same_op_as_the_library(tmp_path):
    """The runner hands the builder's arguments to the op unchanged."""
    built = build_case(get_case(CASE))
    g1 = run_reference(built)["out"]
    g2 = run_reference(built)["out"]
    assert np.array_equal(g1.view(np.uint16), g2.view(np.uint16))
    assert np.count_nonzero(g1.astype(np.float32)) > 0.9 * g1.size


def test_subprocess_golden_and_compare(cli, tmp_path):
    """The installed entry point end to end: golden (bin), then compare it with itself."""
    p = cli.sub(["golden", CASE, "-o", tmp_path, "--format", "bin"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "tilesim:" not in p.stderr  # no progress noise without a terminal
    d = tmp_path / CASE
    p = cli.sub(["compare", d / "golden_out.bin", d], cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("PASS") == 1


def test_progress_only_when_asked_or_on_a_terminal(cli, tmp_path):
    code, _, err = cli("golden", CASE, "-o", tmp_path / "quiet")
    assert code == 0 and err == ""  # captured stderr is not a TTY: no bar, no stage lines
    code, _, err = cli("golden", CASE, "-o", tmp_path / "loud", "--progress")
    assert code == 0
    assert "tilesim: building inputs of m3_case_smoke_edge" in err
    assert "tilesim: writing npz files" in err


def test_msa_main_branch_golden_against_dense_attention(cli, tmp_path):
    """n = 64 (one partial block): the written golden equals float64 softmax attention over
    the written keys with the written additive mask, within the seeds' 1e-3 + 1e-3|e| rule."""
    case = "msa_main_unaligned_64"
    assert cli("golden", case, "-o", tmp_path)[0] == 0
    d = tmp_path / case
    with np.load(d / "inputs.npz") as z:
        q, k, v, mask = (z[n] for n in ("query", "key_blocks", "value_blocks", "block_mask"))
    with np.load(d / "golden.npz") as z:
        golden = z["out"]
    assert golden.dtype == np.float32 and golden.shape == (64, 64, 128)
    n, hq, dh = q.shape
    nbk, topk, bk, _ = mask.shape
    mask2d = mask.transpose(0, 2, 1, 3).reshape(nbk * bk, topk * bk)[:n].astype(np.float64)
    ref = np.empty((n, hq, dh))
    for h in range(hq):
        s = q[:, h].astype(np.float64) @ k[:, h // 16].astype(np.float64).T / np.sqrt(dh)
        s += mask2d
        p = np.exp(s - s.max(axis=1, keepdims=True))
        ref[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, h // 16].astype(np.float64)
    assert np.all(np.abs(golden - ref) <= 1e-3 + 1e-3 * np.abs(ref))
    assert np.abs(golden - ref).max() < 1e-4  # FP32 emulation is far inside the seeds' rule


def test_force_replaces_the_previous_files(cli, tmp_path):
    assert cli("golden", CASE, "-o", tmp_path, "--format", "bin")[0] == 0
    assert (tmp_path / CASE / "golden_out.bin").exists()
    (tmp_path / CASE / "notes.txt").write_text("mine")  # not ours: must survive
    assert cli("golden", CASE, "-o", tmp_path, "--force")[0] == 0
    names = sorted(p.name for p in (tmp_path / CASE).iterdir())
    assert names == ["golden.npz", "inputs.npz", "manifest.json", "notes.txt"]


def test_npz_inside_a_golden_dir_uses_its_manifest(cli, tmp_path):
    assert cli("golden", CASE, "-o", tmp_path)[0] == 0
    g = tmp_path / CASE / "golden.npz"
    code, out, err = cli("compare", g, g)  # tolerance from the manifest beside the file
    assert code == 0, err
    assert "atol 0.5, rtol 0.015" in out
