"""Reading tensors back: a manifest entry's tensor (:func:`load_from_manifest`) and a tensor
named on the command line (:func:`load_tensor`: ``x.npy``, ``x.npz[:KEY]``, ``x.bin``,
``x.pt[:KEY]``, a ``manifest.json`` or a golden directory), as a :class:`Loaded` that keeps
the manifest it came with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tilesim.cli import CliError
from tilesim.cli.dtypes import check_dtype_supported, dtype_from_name, reinterpret
from tilesim.cli.manifest import (
    MANIFEST,
    confined,
    entries,
    golden_entry,
    manifest_beside,
    read_manifest,
)
from tilesim.cli.tensorio import read_bin, read_npy, read_npz_member, read_pt


@dataclass
class Loaded:
    """A tensor read back from disk, plus the manifest it came with (if any)."""

    array: np.ndarray
    source: str
    manifest: dict | None = None
    entry: dict | None = None

    @property
    def name(self) -> str | None:
        return self.entry["name"] if self.entry else None


def load_from_manifest(mpath: Path, entry: dict, *, dtype: np.dtype | None = None) -> np.ndarray:
    """The tensor of the (checked) manifest entry ``entry`` of the manifest at ``mpath``, its
    file confined to the manifest's directory; ``dtype`` reinterprets its bytes. A shape or
    dtype other than the entry's is a :class:`CliError`."""
    f = confined(mpath.parent, entry["file"], str(mpath))
    if f.suffix == ".bin":
        return read_bin(f, entry["shape"], dtype or dtype_from_name(entry["dtype"]))
    if not f.is_file():
        raise CliError(f"no such file {str(f)!r} (listed in {str(mpath)!r})")
    if f.suffix == ".npy":
        a = read_npy(f)
        a = reinterpret(a, dtype or dtype_from_name(entry["dtype"]), str(f))
    else:
        a, _ = read_npz_member(f, entry.get("key", entry["name"]), None)
        if dtype is not None:
            a = reinterpret(a, dtype, str(f))
    want = dtype.name if dtype is not None else entry["dtype"]
    if list(a.shape) != list(entry["shape"]) or a.dtype.name != want:
        raise CliError(
            f"{str(f)!r}:{entry['name']} is {a.dtype.name}{list(a.shape)} but the manifest says "
            f"{want}{entry['shape']}: mismatched file"
        )
    return a


def split_key(spec: str) -> tuple[Path, str | None]:
    """``file.npz:key`` / ``file.pt:key`` / ``manifest.json:name`` -> (file, key); a plain
    path -> (path, None)."""
    if ":" in spec and not Path(spec).exists():
        p, _, key = spec.rpartition(":")
        if p.endswith((".npz", ".pt", ".pth", ".json")):
            return Path(p), key
    return Path(spec), None


def resolve_spec(spec: str) -> tuple[Path, str | None]:
    """``(file, key)`` of a command-line tensor spec (a directory: its manifest); a missing
    file is a :class:`CliError`."""
    path, key = split_key(str(spec))
    if path.is_dir():
        path = path / MANIFEST
    if not path.exists():
        raise CliError(f"no such file or directory {str(path)!r}")
    return path, key


def load_tensor(spec: str, *, like: Loaded | None = None, dtype: str | None = None) -> Loaded:
    """Read one tensor named on the command line.

    ``spec`` is ``x.npy``, ``x.npz`` / ``x.npz:KEY``, ``x.bin``, ``x.pt`` / ``x.pt:KEY``, a
    ``manifest.json`` or a golden directory (its golden tensor). A ``.bin`` takes shape and
    dtype from the manifest next to it (the entry whose ``file`` is that name) or else from
    ``like`` (the golden it is compared with). ``dtype`` reinterprets the raw bytes (e.g. a
    ``uint16`` dump as ``bfloat16``).
    """
    want = dtype_from_name(dtype) if dtype is not None else None
    path, key = resolve_spec(spec)
    if path.name == MANIFEST or path.suffix == ".json":
        m = read_manifest(path)
        e = golden_entry(m, str(path), key)
        src = f"{path}:{key}" if key is not None else str(path)
        return Loaded(load_from_manifest(path, e, dtype=want), src, m, e)
    if path.suffix == ".npy":
        a = read_npy(path)
        if want is not None:
            a = reinterpret(a, want, spec)
        elif a.dtype.kind == "V" and like is not None:
            # an ml_dtypes array saved with np.save: same width as the golden -> its dtype
            a = reinterpret(a, like.array.dtype, spec)
        return Loaded(check_dtype_supported(a, str(path)), str(path))
    if path.suffix == ".npz":
        return _load_npz_tensor(path, key, like, want, spec)
    if path.suffix in (".pt", ".pth"):
        return _pick_pt(path, key, like, want)
    if path.suffix == ".bin":
        return _load_bin_tensor(path, like, want)
    raise CliError(
        f"unsupported file {str(path)!r}: expected .npy, .npz[:KEY], .bin, .pt[:KEY], "
        "manifest.json or a directory"
    )


def _load_npz_tensor(path, key, like, want, spec) -> Loaded:
    preferred = like.name if like is not None else None
    m = manifest_beside(path)
    if m is not None and preferred is None:
        goldens = [t["name"] for t in entries(m, "golden") if t["file"] == path.name]
        preferred = goldens[0] if len(goldens) == 1 else None
    a, k = read_npz_member(path, key, preferred)
    if want is not None:
        a = reinterpret(a, want, spec)
    elif a.dtype.kind == "V" and like is not None:  # as for .npy: the golden's dtype
        a = reinterpret(a, like.array.dtype, f"{path}:{k}")
    entry = None
    if m is not None:
        mine = [t for t in m["tensors"] if t["file"] == path.name and t["name"] == k]
        entry = mine[0] if mine else None
    return Loaded(
        check_dtype_supported(a, f"{path}:{k}"), f"{path}:{k}", m if entry else None, entry
    )


def _pick_pt(path, key, like, want) -> Loaded:
    obj = read_pt(path)
    if isinstance(obj, dict):
        names = list(obj)
        if key is None:
            key = names[0] if len(names) == 1 else (like.name if like is not None else None)
        if key not in obj:
            raise CliError(f"{str(path)!r} holds {names}; name one as {path}:KEY")
        a, src = obj[key], f"{path}:{key}"
    else:
        if key is not None:
            if not key.isdigit() or int(key) >= len(obj):
                raise CliError(f"{str(path)!r} holds {len(obj)} tensors; no item {key!r}")
            a, src = obj[int(key)], f"{path}:{key}"
        elif len(obj) != 1:
            raise CliError(f"{str(path)!r} holds {len(obj)} tensors; name one as {path}:INDEX")
        else:
            a, src = obj[0], str(path)
    return Loaded(reinterpret(a, want, src) if want is not None else a, src)


def _load_bin_tensor(path, like, want) -> Loaded:
    m = manifest_beside(path)
    if m is not None:
        for e in m["tensors"]:
            if e["file"] == path.name:
                dt = want if want is not None else dtype_from_name(e["dtype"])
                return Loaded(read_bin(path, e["shape"], dt), str(path), m, e)
    if like is None:
        raise CliError(
            f"{str(path)!r} is a raw .bin file without a manifest entry beside it; "
            "compare it against a golden that has one (its shape and dtype are used)"
        )
    shape = list(like.array.shape)
    dt = want if want is not None else like.array.dtype
    return Loaded(read_bin(path, shape, dt), str(path))


__all__ = ["Loaded", "load_from_manifest", "load_tensor", "resolve_spec", "split_key"]
