"""One verdict whichever way a layer-step dump is asked about: judged as
a stage (`compare DUMPDIR GOLDENDIR`), as `NAME.npy` against `GOLDEN:NAME`, or as a bare file pair
with the golden's manifest given (`--manifest`), one dump gets the op's calibrated bound and the
same verdict; `--png` draws one picture per judged output, named by stage; the report says what
was dumped, leads with a hard failure and names cache rows by slot.

The "device" dump is the golden's `attn_out` with one head of one token scaled by 1.01 (made here
in float64 and rounded once to BF16), the smallest fault the attention's calibration separates.
The written cache slots are found from the bytes: the rows where the golden cache differs from the
cache given (every other row keeps the given bytes)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from tilesim.__main__ import main
from tilesim.cli.tensorio import read_npz

CASE = "dsa_attention_step_short_int8"
#: the attention's calibrated relative-L2 multiple (docs/numerics.md, "Calibration": 1.4u) and
#: the dtype's rule for a row of an uncalibrated output (8u), u = 2^-8 for BF16
CALIBRATED = 1.4 * 2.0**-8
DTYPE_ROW = 8 * 2.0**-8
#: the head scaled: token 1, head 5
TOKEN, HEAD = 1, 5


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """``(root, golden dir, golden arrays, inputs)``, and ``dev/attn_out.npy`` (one head x1.01)
    plus the golden's ``attn_out`` alone as a bare ``.npy`` (BF16 saved by ``np.save``: |V2)."""
    r = tmp_path_factory.mktemp("one_verdict")
    assert main(["golden", CASE, "-o", str(r / "golden")]) == 0
    gdir = r / "golden" / CASE
    g, inputs = read_npz(gdir / "golden.npz"), read_npz(gdir / "inputs.npz")
    att = g["attn_out"].astype(np.float64)
    att[TOKEN, HEAD] *= 1.01
    (r / "dev").mkdir()
    np.save(r / "dev" / "attn_out.npy", att.astype(ml_dtypes.bfloat16))
    np.save(r / "attn_out_golden.npy", g["attn_out"])
    return r, gdir, g, inputs


def _worst_row(checks: list) -> dict:
    return next(c for c in checks if c["name"] == "relative L2 (worst row)")


def _stage_check(out: str) -> tuple[bool, dict]:
    rep = json.loads(out)
    att = next(s for s in rep["stages"] if s["stage"] == "sparse_attention")
    return rep["passed"], _worst_row(att["outputs"][0]["verdicts"][0]["checks"])


def test_three_ways_of_asking_give_one_verdict_and_one_bound(step, cli):
    r, gdir, _, _ = step
    dev = r / "dev" / "attn_out.npy"
    asked = {
        "stage": (r / "dev", gdir),
        "NAME.npy GOLDEN:NAME": (dev, f"{gdir}:attn_out"),
        "bare pair --manifest DIR": (dev, r / "attn_out_golden.npy", "--manifest", gdir),
        "bare pair --manifest manifest.json:NAME": (
            dev, r / "attn_out_golden.npy", "--manifest", f"{gdir / 'manifest.json'}:attn_out"),
    }  # fmt: skip
    for how, argv in asked.items():
        code, out, err = cli("compare", *argv, "--json")
        assert code == 1, (how, err)
        passed, worst = _stage_check(out)
        assert not passed and not worst["passed"], how
        assert worst["bound"] == pytest.approx(CALIBRATED, rel=1e-12), how
        assert worst["where"] == f"token {TOKEN}, head {HEAD}", how
        code, text, _ = cli("compare", *argv)
        assert code == 1 and "first failing stage sparse_attention: attn_out: relative L2" in text


def test_a_bare_pair_without_its_manifest_says_which_rule_and_why(step, cli):
    r, _, _, _ = step
    argv = ("compare", r / "dev" / "attn_out.npy", r / "attn_out_golden.npy", "--golden-dtype",
            "bfloat16", "--atol", "1e-4", "--rtol", "5e-3", "--ratio", "5e-3")  # fmt: skip
    code, out, _ = cli(*argv)
    assert code == 0  # the dtype's looser bound: the reason --manifest exists
    assert "bounds 4u / 8u per row (the dtype's rule: no op named" in out
    assert "note: GOLDEN is a bare file without a manifest" in out and "--manifest" in out
    code, out, _ = cli(*argv, "--json")
    rep = json.loads(out)
    assert _worst_row(rep["checks"])["bound"] == pytest.approx(DTYPE_ROW, rel=1e-12)
    assert any("--manifest" in n for n in rep["notes"])


def test_manifest_refuses_a_file_that_is_not_its_golden(step, cli, tmp_path):
    r, gdir, g, _ = step
    other = g["attn_out"].copy()
    other[0, 0, 0] = -other[0, 0, 0] if other[0, 0, 0] != 0 else 1
    np.save(tmp_path / "attn_out.npy", other)
    code, _, err = cli("compare", r / "dev" / "attn_out.npy", tmp_path / "attn_out.npy",
                       "--manifest", gdir)  # fmt: skip
    assert code == 2 and "it is not that call's golden" in err
    code, _, err = cli("compare", r / "dev" / "attn_out.npy", gdir, "--manifest", gdir)
    assert code == 2 and "leave --manifest out" in err


def test_png_draws_one_picture_per_judged_output_named_by_stage(step, cli, tmp_path):
    r, gdir, g, _ = step
    dump = tmp_path / "dump"
    dump.mkdir()
    np.save(dump / "attn_out.npy", np.load(r / "dev" / "attn_out.npy", allow_pickle=False))
    np.save(dump / "topk_indices.npy", g["topk_indices"])
    np.save(dump / "kv_cache.npy", g["kv_cache"])
    png = tmp_path / "err.png"
    code, out, err = cli("compare", dump, gdir, "--png", png)
    assert code == 1, err
    want = ["err.mla_prolog.kv_cache.codes.png", "err.dsa_indexer.topk_indices.png",
            "err.sparse_attention.attn_out.png"]  # fmt: skip
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(want)
    for name in want:
        w, h = cli.png_size(tmp_path / name)
        assert w > 100 and h > 100
        assert f"wrote {tmp_path / name}" in out
    code, _, err = cli("compare", dump, gdir, "--png", png)
    assert code == 2 and "already exist" in err


def test_the_against_text_says_what_was_dumped(step, cli, tmp_path):
    r, gdir, g, _ = step
    code, out, _ = cli("compare", r / "dev", gdir)
    assert "the golden's" not in out.split("first failing stage")[0]
    assert "stage sparse_attention: FAIL (against the stored golden: no upstream output dumped" in (
        out)  # fmt: skip
    dump = tmp_path / "dump"
    dump.mkdir()
    np.save(dump / "attn_out.npy", np.load(r / "dev" / "attn_out.npy", allow_pickle=False))
    np.save(dump / "topk_indices.npy", g["topk_indices"])
    code, out, _ = cli("compare", dump, gdir)
    line = next(ln for ln in out.splitlines() if ln.startswith("stage sparse_attention"))
    assert "the device's topk_indices equals the golden's" in line, line
    assert "query_nope, query_rope, kv_cache, kr_cache, kv_scale_cache not dumped" in line, line


def test_a_hard_failure_leads_and_cache_rows_are_slots(step, cli, tmp_path):
    r, gdir, g, inputs = step
    given, want = inputs["kv_scale_cache"], g["kv_scale_cache"]
    written = np.flatnonzero(np.any(given.view(np.uint32) != want.view(np.uint32), axis=1))
    assert written.size == 4  # B 2 x s1 2 new tokens
    slot = int(written[2])
    bad = want.copy()
    bad[slot, 1] = np.nan
    np.save(tmp_path / "kv_scale_cache.npy", bad)
    code, out, _ = cli("compare", tmp_path / "kv_scale_cache.npy", gdir)
    assert code == 1
    last = out.strip().splitlines()[-1]
    assert last.startswith(
        f"FAIL {CASE}: first failing stage mla_prolog: kv_scale_cache: scales 1 NaN/Inf in "
        f"actual (hard failure) at ({slot}, 1)"
    ), last
    assert f"1 NaN/Inf in actual at ({slot}, 1) = nan" in out


def test_raw_bf16_bits_read_the_same_from_npy_and_npz(step, cli, tmp_path):
    r, gdir, _, _ = step
    att = np.load(r / "dev" / "attn_out.npy", allow_pickle=False)
    assert att.dtype.kind == "V"  # np.save of a bfloat16 array
    np.savez(tmp_path / "dump.npz", attn_out=att)
    _, from_npy, _ = cli("compare", r / "dev" / "attn_out.npy", gdir, "--json")
    code, from_npz, err = cli("compare", tmp_path / "dump.npz", gdir, "--json")
    assert code == 1, err
    assert _stage_check(from_npz) == _stage_check(from_npy)


def test_cases_takes_the_family_as_written_on_the_op_pages(cli):
    code, positional, _ = cli("cases", "dsa_attention_step", "--json")
    assert code == 0
    _, flag, _ = cli("cases", "--family", "dsa_attention_step", "--json")
    listed = json.loads(flag)
    assert json.loads(positional) == listed and listed
    assert {c["family"] for c in listed} == {"dsa_attention_step"}
    code, _, err = cli("cases", "moe", "--family", "dsa")
    assert code == 2 and "two families given" in err
