"""A golden directory's ``manifest.json``: what it records, and reading it back checked.

Layout of a golden directory (written by :func:`tilesim.cli.golden_dir.write_golden_dir`)::

    DIR/manifest.json            case, op, seed, params, tiling, tolerance, tilesim version and
                                 one entry per tensor (name, role, file, key, shape, dtype,
                                 itemsize, nbytes, byte order, C type)
    DIR/inputs.npz, golden.npz   --format npz (NumPy's zip of .npy members)
    DIR/input_<name>.bin, ...    --format bin: one raw file per tensor, C order,
    DIR/golden_<name>.bin        little-endian, no header (read with np.fromfile)

Roles: ``input``, ``golden`` (the op's outputs, in the op's order) and ``scores`` (the MSA
indexer's block scores, stored beside its block ids for the tie-aware compare).

:func:`read_manifest` turns a manifest with bad fields, or a file entry pointing outside the
manifest's directory, into a one-line :class:`CliError`; so are a ``manifest_version`` other
than :data:`MANIFEST_VERSION` and an ``op`` that names no reference op (either may be absent:
a plain manifest describing ``.bin`` files).
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath

import numpy as np
from tilesim.cli import CliError
from tilesim.cli.dtypes import C_TYPES, dtype_from_name
from tilesim.cli.tensorio import reading
from tilesim.shared.registry.tolerance import check_tolerance

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
ROLES = ("input", "golden", "scores")
#: the key of a manifest's tolerance that states its rule in words (beside the numbers)
RULE_KEY = "rule"


def tensor_entry(name: str, role: str, a: np.ndarray, file: str, key: str | None) -> dict:
    """The manifest entry of tensor ``a`` stored as ``name`` (``role``) in ``file`` (under
    ``key`` in an npz)."""
    dt = a.dtype
    return {
        "name": name,
        "role": role,
        "file": file,
        **({"key": key} if key is not None else {}),
        "shape": [int(s) for s in a.shape],
        "dtype": dt.name,
        "itemsize": int(dt.itemsize),
        "nbytes": int(a.nbytes),
        "byte_order": "little",
        "order": "C (row-major)",
        "c_type": C_TYPES.get(dt.name, dt.name),
    }


def dump_json(obj, indent: str = "") -> str:
    """JSON with one key per line but short lists of scalars kept on one line."""
    inner = indent + "  "
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(str(k))}: {dump_json(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        items = [f"{inner}{dump_json(v, inner)}" for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return json.dumps(obj)


def confined(base: Path, file, where: str) -> Path:
    """``base / file`` for a relative ``file`` that stays inside ``base`` (no absolute path,
    no ``..``, no symlink leading out); anything else is a :class:`CliError`."""
    if not isinstance(file, str) or not file or "\0" in file:
        raise CliError(f"{where}: 'file' must be a non-empty relative path, got {file!r}")
    pure = PurePosixPath(file.replace("\\", "/"))
    if pure.is_absolute() or os.path.isabs(file) or ".." in pure.parts or ":" in pure.parts[0]:
        raise CliError(f"{where}: file {file!r} points outside the manifest's directory")
    p = base / Path(*pure.parts)
    try:
        inside = p.resolve().is_relative_to(base.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise CliError(f"{where}: file {file!r} leads outside the manifest's directory")
    return p


def check_shape(shape, where: str) -> list[int]:
    """``shape`` when it is a list of at most 32 sizes in ``[0, 2^48)``, else a
    :class:`CliError`."""
    ok = isinstance(shape, list) and all(
        isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**48 for s in shape
    )
    if not ok or len(shape) > 32:
        raise CliError(f"{where}: 'shape' must be a list of integers >= 0, got {shape!r}")
    return shape


def check_entry(e, where: str) -> dict:
    """A manifest tensor entry with valid name, role, file, shape and dtype fields."""
    if not isinstance(e, dict):
        raise CliError(f"{where}: expected an object, got {type(e).__name__}")
    for k in ("name", "file"):
        if not isinstance(e.get(k), str) or not e[k]:
            raise CliError(f"{where}: {k!r} must be a non-empty string, got {e.get(k)!r}")
    where = f"{where} ({e['name']!r})"
    if e.get("role", "golden") not in ROLES:
        raise CliError(f"{where}: 'role' must be one of {', '.join(ROLES)}, got {e['role']!r}")
    if "key" in e and not isinstance(e["key"], str):
        raise CliError(f"{where}: 'key' must be a string, got {e['key']!r}")
    check_shape(e.get("shape"), where)
    try:
        dtype_from_name(e.get("dtype"))
    except CliError as err:
        raise CliError(f"{where}: {err}") from None
    return e


def check_tolerance_fields(tol, where: str) -> dict:
    """A manifest's ``tolerance`` object (``{}`` when absent), itself, once the one tolerance
    validator (:func:`tilesim.shared.registry.tolerance.check_tolerance`, ``form="stated"``: any of
    the keys, numbers or nulls, ``mode`` ``"compare"`` when absent) passes it without its
    :data:`RULE_KEY` words; a refusal as a :class:`CliError` naming ``where``."""
    if tol is None:
        return {}
    numbers = {k: v for k, v in tol.items() if k != RULE_KEY} if isinstance(tol, dict) else tol
    try:
        check_tolerance(numbers, f"{where}: tolerance", form="stated")
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from None
    if not isinstance(tol.get(RULE_KEY, ""), str):
        raise CliError(f"{where}: tolerance.{RULE_KEY}: expected a str, got {tol[RULE_KEY]!r}")
    return tol


def read_manifest(path: Path) -> dict:
    """A validated manifest: readable JSON, a ``tensors`` list of valid entries whose files
    are confined to the manifest's directory, a valid ``tolerance``."""
    if not path.is_file():
        raise CliError(f"no manifest at {str(path)!r}")
    with reading(f"manifest {str(path)!r}"):
        m = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(m, dict) or not isinstance(m.get("tensors"), list):
        raise CliError(f"{str(path)!r} is not a tilesim manifest (no 'tensors' list)")
    names = set()
    for j, e in enumerate(m["tensors"]):
        check_entry(e, f"{path}: tensors[{j}]")
        confined(path.parent, e["file"], f"{path}: tensors[{j}]")
        if (e.get("role", "golden"), e["name"]) in names:
            raise CliError(f"{path}: tensor {e['name']!r} is listed twice")
        names.add((e.get("role", "golden"), e["name"]))
    check_version_and_op(m, str(path))
    check_tolerance_fields(m.get("tolerance"), str(path))
    return m


def check_version_and_op(m: dict, where: str) -> None:
    """A manifest's ``manifest_version`` (when present) must be :data:`MANIFEST_VERSION`, and
    its ``op`` (when present) a reference op (it selects the judge's plan and calibrated
    bounds); else a :class:`CliError` naming the field."""
    from tilesim.shared.registry import ops

    version = m.get("manifest_version", MANIFEST_VERSION)
    if type(version) is not int or version != MANIFEST_VERSION:
        raise CliError(f"{where}: manifest_version: expected {MANIFEST_VERSION} (the version "
                       f"this tilesim reads), got {version!r}")  # fmt: skip
    known = [c.name for c in ops.calls()]
    if "op" in m and m["op"] not in known:
        raise CliError(f"{where}: op: expected a reference op ({', '.join(known)}), got "
                       f"{m['op']!r}")  # fmt: skip


def manifest_beside(path: Path) -> dict | None:
    """The manifest in the same directory, if there is one."""
    mpath = path.parent / MANIFEST
    if not mpath.exists():
        return None
    return read_manifest(mpath)


def entries(manifest: dict, role: str) -> list[dict]:
    """The manifest's tensor entries of ``role`` (an entry without a role is a golden)."""
    return [t for t in manifest["tensors"] if t.get("role", "golden") == role]


def golden_entry(manifest: dict, where: str, name: str | None = None) -> dict:
    """The manifest's one golden tensor entry (named ``name`` when given), else a
    :class:`CliError`."""
    goldens = entries(manifest, "golden")
    if name is not None:
        goldens = [t for t in goldens if t["name"] == name]
    if len(goldens) != 1:
        raise CliError(
            f"{where}: expected one golden tensor{f' named {name!r}' if name else ''}, "
            f"found {[t['name'] for t in goldens]}"
        )
    return goldens[0]


__all__ = ["MANIFEST", "MANIFEST_VERSION", "ROLES", "RULE_KEY", "check_entry", "check_shape",
           "check_tolerance_fields", "check_version_and_op", "confined", "dump_json", "entries",
           "golden_entry", "manifest_beside", "read_manifest", "tensor_entry"]  # fmt: skip
