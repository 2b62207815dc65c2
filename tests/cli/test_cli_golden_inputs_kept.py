"""The CLI refuses, before touching any file, what it would otherwise do silently: a replay
whose output directory holds the inputs it reads (``--force`` would delete them), options it
would ignore (``golden CASE --name``, ``--name ''``, ``trace --actual-dtype`` without
``--actual``), a manifest naming an unknown ``op`` or an unsupported ``manifest_version``, and a
``--records`` file in a missing directory (refused as ``--png`` refuses one). Each refusal is
exit status 2 with one line on stderr."""

from __future__ import annotations

import json
import shutil

import pytest

CASE = "m3_case_smoke_edge"  # moe_grouped_gemm, golden `out`


def _one_line_error(code, out, err, command):
    assert code == 2, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tilesim {command}: error: "), err
    return lines[0]


def _snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def golden_src(tmp_path_factory):
    from tilesim.__main__ import main

    root = tmp_path_factory.mktemp("src")
    assert main(["golden", CASE, "-o", str(root), "--no-progress"]) == 0
    return root / CASE


@pytest.fixture
def golden_dir(golden_src, tmp_path):
    return shutil.copytree(golden_src, tmp_path / CASE)


def test_replay_into_its_own_inputs_directory_is_refused_and_keeps_them(cli, golden_dir):
    """``golden -o PARENT --inputs PARENT/NAME --force`` would replace the golden it reads and
    delete its ``inputs.npz``: refused naming ``-o/--name`` and ``--inputs``, nothing changed."""
    before = _snapshot(golden_dir)
    line = _one_line_error(
        *cli(
            "golden", "-o", golden_dir.parent, "--inputs", golden_dir, "--force", "--no-progress"
        ),  # fmt: skip
        "golden",
    )
    assert "-o" in line and "--name" in line and "--inputs" in line
    assert _snapshot(golden_dir) == before
    line = _one_line_error(
        *cli(
            "golden",
            "-o",
            golden_dir.parent,
            "--inputs",
            golden_dir / "manifest.json",
            "--name",
            CASE,
            "--force",
            "--no-progress",
        ),  # fmt: skip
        "golden",
    )
    assert _snapshot(golden_dir) == before


def test_replay_over_the_source_of_a_replayed_golden_is_refused(cli, golden_dir, tmp_path):
    """A replayed golden reads the inputs it was made from: writing over that source directory
    (which ``--force`` would empty of ``inputs.npz``) is refused, and the source is kept."""
    code, _, err = cli("golden", "-o", tmp_path / "r", "--inputs", golden_dir, "--no-progress")
    assert code == 0, err
    before = _snapshot(golden_dir)
    _one_line_error(
        *cli(
            "golden",
            "-o",
            golden_dir.parent,
            "--inputs",
            tmp_path / "r" / CASE,
            "--name",
            CASE,
            "--force",
            "--no-progress",
        ),  # fmt: skip
        "golden",
    )
    assert _snapshot(golden_dir) == before
    # another output directory still works
    code, _, err = cli("golden", "-o", tmp_path / "s", "--inputs", tmp_path / "r" / CASE,
                       "--no-progress")  # fmt: skip
    assert code == 0, err


def test_options_that_would_be_ignored_are_refused(cli, golden_dir, tmp_path):
    """``golden CASE --name``, ``golden --inputs ... --name ''`` and ``trace --actual-dtype``
    without ``--actual`` are refused naming the option, before any file is written."""
    line = _one_line_error(
        *cli("golden", CASE, "-o", tmp_path / "a", "--name", "custom", "--no-progress"), "golden"
    )
    assert "--name" in line and not (tmp_path / "a").exists()
    line = _one_line_error(
        *cli(
            "golden", "-o", tmp_path / "b", "--inputs", golden_dir, "--name", "", "--no-progress"
        ),  # fmt: skip
        "golden",
    )
    assert "--name" in line and not (tmp_path / "b").exists()
    line = _one_line_error(
        *cli("trace", CASE, "--actual-dtype", "float32", "--no-progress"), "trace"
    )
    assert "--actual-dtype" in line and "--actual" in line


@pytest.mark.parametrize(
    "field, value", [("op", "bogus"), ("manifest_version", 99), ("manifest_version", "1")]
)
def test_compare_refuses_an_unknown_op_or_manifest_version(cli, golden_dir, tmp_path, field,
                                                          value):  # fmt: skip
    """A manifest whose ``op`` names no reference op, or whose ``manifest_version`` is not the
    one this tilesim writes, is refused (exit 2, one line naming the field), not judged."""
    actual = f"{shutil.copy(golden_dir / 'golden.npz', tmp_path / 'act.npz')}:out"
    assert cli("compare", actual, golden_dir)[0] == 0
    mpath = golden_dir / "manifest.json"
    m = json.loads(mpath.read_text())
    m[field] = value
    mpath.write_text(json.dumps(m))
    line = _one_line_error(*cli("compare", actual, golden_dir), "compare")
    assert field in line


def test_records_in_a_missing_directory_is_refused_like_png(cli, tmp_path):
    """``trace --records nd/r.jsonl`` is refused as ``--png nd/x.png`` is (the directory of a
    single output file must exist), and no directory is created."""
    line = _one_line_error(
        *cli("trace", CASE, "--records", tmp_path / "nd" / "r.jsonl", "--no-progress"), "trace"
    )
    assert "--records" in line and not (tmp_path / "nd").exists()
