"""Replay reproduces: for every named case, `tilesim golden --inputs <its golden dir>` with no
other flag writes the case's golden again bit for bit (sha256 of every golden array), records
the same parameters (tiling and split count included) and names the tiling it ran; the
manifest's `reproduce` command runs and writes the same bytes. The oracle is the golden the
named-case path wrote, compared byte for byte, never a stored number."""

from __future__ import annotations

import inspect
import json
import shlex
import shutil
from pathlib import Path

import pytest
from tilesim.cli import tensorio as tio
from tilesim.cli.loading import load_from_manifest
from tilesim.cli.manifest import MANIFEST
from tilesim.cli.registry import load_registry
from tilesim.cli.replay import digest
from tilesim.cli.runner import op_callable

#: one fast case per op (and per DeepSeek cache layout) for the `reproduce` checks
PER_OP = (
    "m3_case_smoke_edge",
    "msa_indexer_nb17",
    "msa_decode_partial_nb17",
    "msa_main_unaligned_100",
    "sfa_bf16_b4_s2_seq64K_total_fp8_d",
    "sfa_bf16_b4_s2_seq64K_total_fp8_kv_split_d",
)


#: cases left out of the replay check: their golden directory alone is 6.4 GB (the caches of
#: 64 sequences of 16K..112K tokens, as inputs and as updated outputs) and a replay needs a
#: second copy; the b4 s2 64K step cases run the same replay path at the seeds' shape
NOT_REPLAYED = {"dsa_attention_step_b64_s2_uniform_int8", "dsa_attention_step_b64_s2_uniform_fp8"}


def _params():
    """Every named case but :data:`NOT_REPLAYED`; the large ones (goldens of up to ~25 s here)
    are marked slow."""
    return [
        pytest.param(n, marks=[pytest.mark.slow] if i.size == "large" else [], id=n)
        for n, i in load_registry().items()
        if n not in NOT_REPLAYED
    ]


@pytest.fixture
def tmp_path(tmp_path):
    """pytest's ``tmp_path``, emptied after the test: the large cases' golden and replay
    directories (hundreds of MB each) must not pile up on the CI disk."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


def _manifest(d: Path) -> dict:
    return json.loads((d / MANIFEST).read_text())


def _golden_digests(d: Path) -> dict:
    """{(role, name): sha256} of the golden and scores tensors of a golden directory."""
    m = _manifest(d)
    out = {}
    for e in m["tensors"]:
        if e["role"] != "input":
            out[(e["role"], e["name"])] = digest(load_from_manifest(d / MANIFEST, e))
    return out


def _golden(cli, case: str, parent: Path, *extra) -> Path:
    code, out, err = cli("golden", case, "-o", parent, "--no-progress", *extra)
    assert code == 0, err
    return parent / case


@pytest.mark.parametrize("case", _params())
def test_replay_of_the_case_dir_is_bit_exact(cli, tmp_path, case):
    d = _golden(cli, case, tmp_path / "g")
    code, out, err = cli("golden", "--inputs", d, "-o", tmp_path / "r", "--no-progress")
    assert code == 0, err
    r = tmp_path / "r" / case
    want = _golden_digests(d)
    assert want and _golden_digests(r) == want
    orig, rep = _manifest(d), _manifest(r)
    assert rep["op"] == orig["op"] and rep["params"] == orig["params"]
    assert rep["tiling"] == orig["tiling"] == orig["params"].get("tiling")
    if "tiling" in inspect.signature(op_callable(orig["op"])).parameters:  # it is recorded
        t = orig["tiling"]
        kinds = ("MoeTiling", "MsaTiling", "SaTileShapeConfig")
        assert isinstance(t, dict) and t["__type__"] in kinds
        if t["__type__"] != "MoeTiling":  # the split count
            assert isinstance(t["kv_splits"], int) and t["kv_splits"] >= 1
        assert f"tiling: {t['__type__']}(" in out
    assert rep["tolerance"] == orig["tolerance"]


def _run_reproduce(cli, command: str) -> None:
    argv = shlex.split(command)
    assert argv[:2] == ["tilesim", "golden"], command
    code, _, err = cli(*argv[1:], "--no-progress")
    assert code == 0, err


@pytest.mark.parametrize("case", PER_OP)
def test_reproduce_commands_run(cli, tmp_path, case):
    """Both `reproduce` fields, the named case's and the replay's, run as written (the golden
    moved away first) and write the same golden bytes."""
    d = _golden(cli, case, tmp_path / "g", "--format", "bin")
    want = _golden_digests(d)
    assert cli("golden", "--inputs", d, "-o", tmp_path / "r", "--no-progress")[0] == 0
    r = tmp_path / "r" / case
    for target in (d, r):
        command = _manifest(target)["reproduce"]
        assert "<" not in command  # no placeholder left
        saved = tmp_path / "saved"
        shutil.move(target, saved)
        _run_reproduce(cli, command)
        assert _golden_digests(target) == want, command
        shutil.rmtree(saved)
    assert (d / "golden_out.bin").is_file()  # --format recorded in the command


def _inputs_npz(cli, tmp_path, case: str) -> tuple[Path, Path]:
    d = _golden(cli, case, tmp_path / "g")
    return d, d / "inputs.npz"


@pytest.mark.parametrize("case", ["sfa_bf16_b4_s2_seq64K_total_fp8_d", "msa_decode_partial_nb17"])
def test_like_alone_gives_the_case_parameters(cli, tmp_path, case):
    """`--inputs FILE --op OP --like CASE` runs the case's tiling and parameters; a partial
    --params (here without the tiling) only overrides what it names."""
    d, npz = _inputs_npz(cli, tmp_path, case)
    m = _manifest(d)
    partial = {k: v for k, v in m["params"].items() if k != "tiling"}
    runs = (
        (npz, []),
        (npz, ["--params", json.dumps(partial)]),
        (d, ["--params", json.dumps(partial)]),  # the case dir + --like
    )
    for n, (src, extra) in enumerate(runs):
        out = tmp_path / f"r{n}"
        code, _, err = cli(
            "golden", "--inputs", src, "--op", m["op"], "--like", case, "-o", out, "--name", "x",
            *extra,
        )  # fmt: skip
        assert code == 0, err
        assert _golden_digests(out / "x") == _golden_digests(d)
        assert _manifest(out / "x")["tiling"] == m["tiling"]


def test_the_case_tiling_is_not_the_default_one(cli, tmp_path):
    """The DeepSeek case above runs the prefill preset; the env default is the decode preset,
    so a replay that dropped the recorded tiling would differ (a FAIL)."""
    from tilesim.shared import SaTileShapeConfig

    d, _ = _inputs_npz(cli, tmp_path, "sfa_bf16_b4_s2_seq64K_total_fp8_d")
    rec = _manifest(d)["tiling"]
    default = SaTileShapeConfig.from_env(env={})
    assert (rec["softmax"], rec["s_kv_tile"]) != (default.softmax, default.s_kv_tile)


def test_op_mismatch_with_the_golden_dir_is_refused(cli, tmp_path):
    d = _golden(cli, "msa_indexer_nb8", tmp_path / "g")
    code, _, err = cli("golden", "--inputs", d, "--op", "msa_sparse_decode", "-o", tmp_path / "r")
    assert code == 2 and "made by msa_indexer" in err
    assert not (tmp_path / "r").exists()


def test_a_replayed_dir_replays_again(cli, tmp_path):
    """A replayed golden stores no inputs: replaying it reads the inputs it was made from
    (checked by sha256) and gives the same bytes; changed inputs are refused."""
    import numpy as np

    d = _golden(cli, "msa_indexer_nb17", tmp_path / "g")
    src = tmp_path / "captured.npz"
    shutil.copy(d / "inputs.npz", src)
    args = ["--op", "msa_indexer", "--like", "msa_indexer_nb17", "--no-progress"]
    assert cli("golden", "--inputs", src, "-o", tmp_path / "r1", *args)[0] == 0
    r1 = tmp_path / "r1" / "captured"
    assert cli("golden", "--inputs", r1, "-o", tmp_path / "r2", "--no-progress")[0] == 0
    assert _golden_digests(tmp_path / "r2" / "captured") == _golden_digests(d)
    arrays = tio.read_npz(src)
    arrays["idx_q"] = np.ascontiguousarray(arrays["idx_q"][::-1])
    tio.write_npz(src, arrays)
    code, _, err = cli("golden", "--inputs", r1, "-o", tmp_path / "r3")
    assert code == 2 and "'idx_q'" in err and "changed" in err
