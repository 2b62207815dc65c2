"""Nothing is overwritten without --force (every file a command would write is checked before
any is written), a failure leaves no partial output, and a missing optional dependency is a
one-line error naming the install."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

CASE = "m3_case_smoke_edge"


def _listing(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def _snapshot(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "fmt, present",
    [
        ("npz", "inputs.npz"),
        ("npz", "golden.npz"),
        ("bin", "golden_out.bin"),
        ("bin", "input_w2_flat.bin"),
        ("npz", "manifest.json"),
    ],
)
def test_golden_refuses_any_existing_target(cli, tmp_path, fmt, present):
    """No manifest needed: one existing file the command would write is enough to refuse."""
    d = tmp_path / CASE
    d.mkdir()
    (d / present).write_bytes(b"mine")
    code, _, err = cli("golden", CASE, "-o", tmp_path, "--format", fmt)
    assert code == 2 and present in err and "--force" in err
    assert _listing(d) == [present] and (d / present).read_bytes() == b"mine"
    code, _, err = cli("golden", CASE, "-o", tmp_path, "--format", fmt, "--force")
    assert code == 0, err
    assert (d / present).read_bytes() != b"mine"


def test_trace_checks_png_and_records_before_the_run(cli, tmp_path):
    png, rec = tmp_path / "t.png", tmp_path / "t.jsonl"
    rec.write_text("old")
    code, _, err = cli("trace", CASE, "--png", png, "--records", rec)
    assert code == 2 and "t.jsonl" in err and "--force" in err
    assert not png.exists() and rec.read_text() == "old"  # nothing written at all
    rec.unlink()
    png.write_bytes(b"old")
    code, _, err = cli("trace", CASE, "--png", png, "--records", rec)
    assert code == 2 and "t.png" in err and not rec.exists()
    code, _, err = cli("trace", CASE, "--png", png, "--records", rec, "--force")
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG" and rec.read_text().count("\n") > 0


def test_trace_records_alone_need_no_png(cli, tmp_path):
    rec = tmp_path / "r.jsonl"
    code, out, err = cli("trace", CASE, "--records", rec)
    assert code == 0, err
    assert "tiles" in out and rec.exists() and _listing(tmp_path) == ["r.jsonl"]
    code, _, err = cli("trace", CASE, "--records", rec)
    assert code == 2 and "--force" in err


def test_failed_png_leaves_nothing(cli, tmp_path, monkeypatch):
    """The PNG writer dies half-way: no PNG, no records, no temporary file remains."""
    import tilesim.cli.plot as plot

    def broken(fig, path):
        open(path, "wb").write(b"\x89PNG partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plot, "save_small_png", broken)
    code, _, err = cli(
        "trace", CASE, "--png", tmp_path / "t.png", "--records", tmp_path / "r.jsonl"
    )
    assert code == 2 and "No space left" in err and "Traceback" not in err
    assert _listing(tmp_path) == []


def test_failed_golden_leaves_nothing(cli, tmp_path, monkeypatch):
    """The second npz write fails: no file, no temporary, no new directory remains."""
    import tilesim.cli.tensorio as tio

    real, calls = tio.write_npz, []

    def flaky(path, arrays):
        calls.append(path)
        if len(calls) == 2:
            open(path, "wb").write(b"PK partial")
            raise OSError(5, "Input/output error")
        real(path, arrays)

    monkeypatch.setattr(tio, "write_npz", flaky)
    code, _, err = cli("golden", CASE, "-o", tmp_path / "new" / "deep")
    assert code == 2 and "Input/output error" in err
    assert len(calls) == 2 and _listing(tmp_path) == []


def test_failed_golden_keeps_the_previous_one(cli, tmp_path, monkeypatch):
    import tilesim.cli.tensorio as tio

    assert cli("golden", CASE, "-o", tmp_path)[0] == 0
    before = _snapshot(tmp_path)

    def broken(path, arrays):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tio, "write_npz", broken)
    assert cli("golden", CASE, "-o", tmp_path, "--force", "--seed", "3")[0] == 2
    assert _snapshot(tmp_path) == before


def test_compare_png_needs_force_and_is_complete(cli, tmp_path):
    assert cli("golden", CASE, "-o", tmp_path)[0] == 0
    d = tmp_path / CASE
    png = tmp_path / "c.png"
    code, out, err = cli("compare", d / "golden.npz", d, "--png", png)
    assert code == 0, err
    w, h = cli.png_size(png)
    assert w > 500 and h > 500 and "wrote" in out
    before = png.read_bytes()
    code, _, err = cli("compare", d / "golden.npz", d, "--png", png)
    assert code == 2 and "--force" in err and png.read_bytes() == before
    assert cli("compare", d / "golden.npz", d, "--png", png, "--force")[0] == 0


# ---------------------------------------------------------------------------------------------
# optional dependencies


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError


def test_trace_png_without_matplotlib(cli, tmp_path, no_matplotlib):
    code, _, err = cli("trace", CASE, "--png", tmp_path / "t.png")
    assert code == 2 and err.count("\n") == 1
    assert "matplotlib" in err and "pip install 'tilesim[cli]'" in err
    assert _listing(tmp_path) == []
    # the text report works without it
    code, out, err = cli("trace", CASE)
    assert code == 0 and "moe_grouped_gemm ran" in out, err


def test_compare_png_without_matplotlib(cli, tmp_path, no_matplotlib):
    g = np.ones(4, np.float32)
    np.save(tmp_path / "g.npy", g)
    argv = ["compare", tmp_path / "g.npy", tmp_path / "g.npy", "--atol", "0", "--rtol", "0"]
    code, _, err = cli(*argv, "--png", tmp_path / "c.png")
    assert code == 2 and "pip install 'tilesim[cli]'" in err
    assert cli(*argv)[0] == 0


def test_progress_without_tqdm(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    code, _, err = cli("golden", CASE, "-o", tmp_path, "--progress")
    assert code == 2 and "tqdm" in err and "pip install 'tilesim[cli]'" in err
    assert _listing(tmp_path) == []
    assert cli("golden", CASE, "-o", tmp_path)[0] == 0  # no bar asked for: fine


def test_pt_without_torch(cli, tmp_path, monkeypatch):
    (tmp_path / "x.pt").write_bytes(b"anything")
    np.save(tmp_path / "g.npy", np.ones(4, np.float32))
    monkeypatch.setitem(sys.modules, "torch", None)
    code, _, err = cli("compare", tmp_path / "x.pt", tmp_path / "g.npy", "--atol", "0")
    assert code == 2 and "torch" in err and "pip install 'tilesim[torch]'" in err


def test_written_files_follow_the_umask(cli, tmp_path):
    """Goldens are meant to be shared: the files get 0666 & ~umask, as open() would give."""
    old = os.umask(0o022)
    try:
        assert cli("golden", CASE, "-o", tmp_path / "a")[0] == 0
        os.umask(0o077)
        assert cli("golden", CASE, "-o", tmp_path / "b")[0] == 0
    finally:
        os.umask(old)
    files_a = [p for p in (tmp_path / "a" / CASE).iterdir() if p.is_file()]
    files_b = [p for p in (tmp_path / "b" / CASE).iterdir() if p.is_file()]
    assert files_a and files_b
    assert {p.stat().st_mode & 0o777 for p in files_a} == {0o644}
    assert {p.stat().st_mode & 0o777 for p in files_b} == {0o600}
