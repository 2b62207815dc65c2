"""Every bad file or argument is exit code 2 with one line on stderr (never a traceback, never
exit 1, which a CI harness reads as "comparison failed"). A parameter grid over the classes:
corrupt / truncated npz, npy and manifest files, bad manifest fields, bad dtype names, paths
leaving the manifest's directory, missing files and directories, bad `demo` arguments."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

CASE = "m3_case_smoke_edge"  # golden out: bfloat16 [8, 256]


@pytest.fixture(scope="module")
def golden_src(tmp_path_factory):
    from tilesim.__main__ import main

    root = tmp_path_factory.mktemp("src")
    assert main(["golden", CASE, "-o", str(root / "npz")]) == 0
    assert main(["golden", CASE, "-o", str(root / "bin"), "--format", "bin"]) == 0
    return root


@pytest.fixture
def dirs(golden_src, tmp_path):
    """Fresh copies of the npz and the bin golden directory, and a good actual."""
    npz = shutil.copytree(golden_src / "npz" / CASE, tmp_path / "npz")
    bin_ = shutil.copytree(golden_src / "bin" / CASE, tmp_path / "bin")
    good = tmp_path / "good.bin"
    shutil.copy(bin_ / "golden_out.bin", good)
    return npz, bin_, good


def _one_line_error(code, out, err, command="compare"):
    assert code == 2, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tilesim {command}: error: "), err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# corrupt and truncated files


def _truncate(p, keep=0.5):
    data = p.read_bytes()
    p.write_bytes(data[: int(len(data) * keep)])


def _garbage(p):
    p.write_bytes(os.urandom(64))


def _flip_middle(p):
    data = bytearray(p.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 32] = b"\xff" * 32
    p.write_bytes(bytes(data))


def _empty(p):
    p.write_bytes(b"")


CORRUPTIONS = {"truncated": _truncate, "garbage": _garbage, "empty": _empty}


@pytest.mark.parametrize("how", list(CORRUPTIONS))
@pytest.mark.parametrize("target", ["golden.npz", "manifest.json"])
def test_corrupt_golden_files(cli, dirs, how, target):
    npz, _, good = dirs
    CORRUPTIONS[how](npz / target)
    line = _one_line_error(*cli("compare", good, npz))
    assert target in line or "manifest" in line


def test_npz_member_with_damaged_bytes(cli, dirs):
    """A damaged zip member (CRC / header) is an error, not a crash or silent garbage."""
    npz, _, good = dirs
    _flip_middle(npz / "golden.npz")
    code, out, err = cli("compare", good, npz)
    # the golden tensor is 4 KiB in a small zip: a damaged middle hits it or the index
    if code != 2:
        assert code in (0, 1) and "Traceback" not in err
    else:
        _one_line_error(code, out, err)


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "pickle", "header"])
def test_bad_npy_actual(cli, dirs, tmp_path, how):
    _, bin_, _ = dirs
    p = tmp_path / "a.npy"
    np.save(p, np.zeros((8, 256), np.float32))
    if how == "pickle":
        np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif how == "header":
        data = p.read_bytes()
        p.write_bytes(data[:10] + b"{'descr': 'zz'" + data[24:])
    elif how in CORRUPTIONS:
        CORRUPTIONS[how](p)
    line = _one_line_error(*cli("compare", p, bin_))
    assert "a.npy" in line


def test_bad_pt_actual(cli, dirs, tmp_path):
    _, bin_, _ = dirs
    p = tmp_path / "dump.pt"
    p.write_bytes(b"PK\x03\x04 not really a torch file")
    line = _one_line_error(*cli("compare", p, bin_))
    assert "dump.pt" in line


# ---------------------------------------------------------------------------------------------
# bad manifest fields


def _edit_manifest(d, fn):
    m = json.loads((d / "manifest.json").read_text())
    fn(m)
    (d / "manifest.json").write_text(json.dumps(m))


def _golden_entry(m):
    return next(t for t in m["tensors"] if t["role"] == "golden")


BAD_FIELDS = {
    "tensors not a list": (lambda m: m.update(tensors={"a": 1}), "tensors"),
    "entry not an object": (lambda m: m["tensors"].append(7), "tensors["),
    "no file": (lambda m: _golden_entry(m).pop("file"), "'file'"),
    "file not a string": (lambda m: _golden_entry(m).update(file=3), "'file'"),
    "shape negative": (lambda m: _golden_entry(m).update(shape=[8, -256]), "shape"),
    "shape string": (lambda m: _golden_entry(m).update(shape="8x256"), "shape"),
    "shape bools": (lambda m: _golden_entry(m).update(shape=[True, 256]), "shape"),
    "shape huge": (lambda m: _golden_entry(m).update(shape=[2**60]), "shape"),
    "dtype unknown": (lambda m: _golden_entry(m).update(dtype="bfloat17"), "dtype"),
    "dtype object": (lambda m: _golden_entry(m).update(dtype="object"), "dtype"),
    "dtype complex": (lambda m: _golden_entry(m).update(dtype="complex64"), "dtype"),
    "dtype not a string": (lambda m: _golden_entry(m).update(dtype=16), "dtype"),
    "dtype ml_dtypes helper": (lambda m: _golden_entry(m).update(dtype="finfo"), "dtype"),
    "role unknown": (lambda m: _golden_entry(m).update(role="gold"), "role"),
    "key not a string": (lambda m: _golden_entry(m).update(key=[1]), "key"),
    "tolerance mode": (lambda m: m["tolerance"].update(mode="fuzzy"), "mode"),
    "tolerance atol string": (lambda m: m["tolerance"].update(atol="0.5"), "atol"),
    "tolerance not an object": (lambda m: m.update(tolerance=[0.5]), "tolerance"),
    "duplicate tensor": (lambda m: m["tensors"].append(dict(_golden_entry(m))), "twice"),
}


@pytest.mark.parametrize("fmt", ["npz", "bin"])
@pytest.mark.parametrize("field", list(BAD_FIELDS))
def test_bad_manifest_fields(cli, dirs, fmt, field):
    npz, bin_, good = dirs
    d = npz if fmt == "npz" else bin_
    fn, word = BAD_FIELDS[field]
    _edit_manifest(d, fn)
    line = _one_line_error(*cli("compare", good, d))
    assert word in line, line


def test_manifest_describing_other_bytes(cli, dirs):
    """Shape or dtype that do not match the stored bytes: a mismatched-file error."""
    npz, bin_, good = dirs
    _edit_manifest(bin_, lambda m: _golden_entry(m).update(dtype="float32"))
    assert "mismatched file" in _one_line_error(*cli("compare", good, bin_))
    _edit_manifest(npz, lambda m: _golden_entry(m).update(shape=[256, 8]))
    assert "mismatched file" in _one_line_error(*cli("compare", good, npz))


# ---------------------------------------------------------------------------------------------
# paths confined to the manifest's directory


@pytest.mark.parametrize(
    "file",
    ["/etc/passwd", "../outside.bin", "sub/../../outside.bin", "..", "", "a\0b"],
)
def test_manifest_paths_stay_inside(cli, dirs, tmp_path, file):
    _, bin_, good = dirs
    (tmp_path / "outside.bin").write_bytes((bin_ / "golden_out.bin").read_bytes())
    _edit_manifest(bin_, lambda m: _golden_entry(m).update(file=file))
    line = _one_line_error(*cli("compare", good, bin_))
    assert "outside" in line or "'file'" in line, line


def test_symlink_out_of_the_directory_is_refused(cli, dirs, tmp_path):
    _, bin_, good = dirs
    (tmp_path / "elsewhere.bin").write_bytes((bin_ / "golden_out.bin").read_bytes())
    (bin_ / "link.bin").symlink_to(tmp_path / "elsewhere.bin")
    _edit_manifest(bin_, lambda m: _golden_entry(m).update(file="link.bin"))
    assert "leads outside" in _one_line_error(*cli("compare", good, bin_))
    # a symlink that stays inside is fine
    (bin_ / "inner.bin").symlink_to(bin_ / "golden_out.bin")
    _edit_manifest(bin_, lambda m: _golden_entry(m).update(file="inner.bin"))
    assert cli("compare", good, bin_)[0] == 0


def test_force_never_deletes_outside_the_directory(cli, dirs, tmp_path):
    """An old manifest naming ../victim must not make `golden --force` delete it."""
    from tilesim.__main__ import main

    root = tmp_path / "root"
    assert main(["golden", CASE, "-o", str(root)]) == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")

    def add_victim(m):
        m["tensors"].append({**_golden_entry(m), "name": "v", "file": "../../victim.txt"})

    _edit_manifest(root / CASE, add_victim)
    assert cli("golden", CASE, "-o", root, "--force")[0] == 0
    assert victim.read_text() == "keep me"


# ---------------------------------------------------------------------------------------------
# dtype names, missing paths, demo arguments


@pytest.mark.parametrize("name", ["bfloat17", "object", "complex64", "finfo", "S4", "", "V2"])
def test_bad_dtype_names(cli, dirs, name):
    _, bin_, good = dirs
    line = _one_line_error(*cli("compare", good, bin_, "--actual-dtype", name))
    assert "dtype" in line


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "{tmp}/missing.npy", "{bin}"],
        ["compare", "{good}", "{tmp}/no_such_dir"],
        ["compare", "{good}", "{tmp}/no_such_dir/manifest.json"],
        ["golden", "--inputs", "{tmp}/no_such_dir", "--op", "msa_indexer", "-o", "{tmp}/o"],
        ["trace", CASE, "--png", "{tmp}/no_such_dir/t.png"],
        ["trace", CASE, "--actual", "{tmp}/missing.npy"],
    ],
)
def test_missing_files_and_directories(cli, dirs, tmp_path, argv):
    _, bin_, good = dirs
    argv = [a.format(tmp=tmp_path, bin=bin_, good=good) for a in argv]
    line = _one_line_error(*cli(*argv), command=argv[0])
    assert "no such" in line or "does not exist" in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--rows", "-1"],
        ["--rows", "0"],
        ["--rows", "abc"],
        ["--rows", "1000000000"],
        ["--rows", "1_0"],
        ["--seed", "-1"],
        ["--seed", "1.5"],
        ["--seed", "\u0663"],  # a non-ASCII digit
        ["--seed", str(2**64)],
    ],
)
def test_bad_demo_arguments(cli, argv):
    with pytest.raises(SystemExit) as e:
        cli("demo", *argv)
    assert e.value.code == 2
    err = cli.capsys.readouterr().err
    assert "Traceback" not in err and "error: argument --" in err


def test_demo_still_runs(cli):
    code, out, _ = cli("demo", "--rows", "8")
    assert code == 0 and "PASS" in out


def test_subprocess_prints_no_traceback(cli, dirs, tmp_path):
    """The installed entry point: a truncated golden is exit 2, one line, no traceback."""
    npz, _, good = dirs
    _truncate(npz / "golden.npz")
    p = cli.sub(["compare", good, npz], cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.count("\n") == 1 and "cannot read" in p.stderr
