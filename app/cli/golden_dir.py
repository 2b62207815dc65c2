"""Writing a golden directory: its tensors in ``--format npz`` (``inputs.npz``, ``golden.npz``)
or ``bin`` (one raw file per tensor) and its ``manifest.json`` (:mod:`tilesim.cli.manifest`
describes the layout), through :class:`~tilesim.cli.outputs.Outputs` (all or nothing).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tilesim.cli import CliError, tensorio
from tilesim.cli.manifest import MANIFEST, MANIFEST_VERSION, dump_json, tensor_entry

#: file-name prefix of each role in a ``--format bin`` golden
BIN_PREFIX = {"input": "input", "golden": "golden", "scores": "scores"}


def golden_files(fmt: str, groups: dict[str, dict]) -> dict[str, list[tuple[str, str]]]:
    """``{file name: [(role, tensor name), ...]}`` of a golden directory in ``fmt``;
    ``groups`` = ``{role: {name: array}}``."""
    files: dict[str, list[tuple[str, str]]] = {}
    for role, arrays in groups.items():
        for name in arrays:
            if fmt == "npz":
                fname = "inputs.npz" if role == "input" else "golden.npz"
            elif fmt == "bin":
                fname = f"{BIN_PREFIX[role]}_{name}.bin"
            else:
                raise CliError(f"unknown format {fmt!r}; expected npz or bin")
            files.setdefault(fname, []).append((role, name))
    return files


def write_golden_dir(
    outputs,
    out_dir: Path,
    *,
    fmt: str,
    groups: dict[str, dict],
    header: dict,
    notes: dict | None = None,
) -> dict:
    """Write ``groups`` (``{role: {name: array}}``) in ``fmt`` and the manifest through the
    :class:`~tilesim.cli.outputs.Outputs` ``outputs`` (targets declared with
    :func:`declare_golden_dir` first); return the manifest. ``notes`` adds fields to the entry
    of the tensor of that name (e.g. a byte layout)."""
    tensors = []
    for fname, members in golden_files(fmt, groups).items():
        arrays = {name: np.asarray(groups[role][name]) for role, name in members}
        tmp = outputs.temp(out_dir / fname)
        if fmt == "npz":
            tensorio.write_npz(tmp, arrays)
        else:
            tensorio.write_bin(tmp, arrays[members[0][1]])
        for role, name in members:
            key = name if fmt == "npz" else None
            tensors.append(tensor_entry(name, role, arrays[name], fname, key))
    for t in tensors:
        t.update((notes or {}).get(t["name"], {}))
    manifest = {"manifest_version": MANIFEST_VERSION, **header, "format": fmt, "tensors": tensors}
    tmp = outputs.temp(out_dir / MANIFEST)
    tmp.write_text(dump_json(manifest) + "\n", encoding="utf-8")
    return manifest


def declare_golden_dir(outputs, out_dir: Path, *, fmt: str, groups: dict[str, dict]) -> None:
    """Declare every file :func:`write_golden_dir` will write, and check them all."""
    if out_dir.exists() and not out_dir.is_dir():
        raise CliError(f"output {str(out_dir)!r} exists and is not a directory")
    for fname in [*golden_files(fmt, groups), MANIFEST]:
        outputs.add(out_dir / fname)
    there = outputs.existing()
    if there and not outputs.force:
        what = "a golden (manifest.json)" if (out_dir / MANIFEST) in there else "files"
        names = ", ".join(p.name for p in there[:4])
        raise CliError(f"{str(out_dir)!r} already holds {what}: {names}; pass --force to overwrite")
    outputs.check()


def stale_files(out_dir: Path, keep: set[str]) -> list[Path]:
    """Files the previous manifest of ``out_dir`` lists that a new golden no longer writes
    (only plain files inside ``out_dir``; a bad old manifest lists nothing)."""
    try:
        old = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
        files = {t["file"] for t in old.get("tensors", []) if isinstance(t, dict)}
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return []
    out = []
    for f in files - keep:
        if isinstance(f, str) and "/" not in f and "\\" not in f and f not in ("", ".", ".."):
            p = out_dir / f
            if p.is_file() and not p.is_symlink():
                out.append(p)
    return out


__all__ = ["BIN_PREFIX", "declare_golden_dir", "golden_files", "stale_files", "write_golden_dir"]
