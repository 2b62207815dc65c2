"""Golden files on disk: ``.npz`` or raw little-endian ``.bin`` tensors plus ``manifest.json``.

Layout of a golden directory written by :func:`write_golden_dir`::

    DIR/manifest.json            case, op, seed, params, tiling, tolerance, tilesim version and
                                 one entry per tensor (name, role, file, key, shape, dtype,
                                 itemsize, nbytes, byte order, C type)
    DIR/inputs.npz, golden.npz   --format npz (NumPy's zip of .npy members)
    DIR/input_<name>.bin, ...    --format bin: one raw file per tensor, C order,
    DIR/golden_<name>.bin        little-endian, no header (read with np.fromfile)

NumPy cannot describe the ml_dtypes types (bfloat16, float8_e4m3fn) in a ``.npy`` header: it
writes them as opaque void (``|V2``). The npz files therefore store those tensors as their
raw bits and carry a ``__tilesim_dtypes__`` member naming the real dtype of every key, so
:func:`load_tensor` gives them back with the right dtype even without the manifest.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
from tilesim.cli import CliError

MANIFEST = "manifest.json"
DTYPES_KEY = "__tilesim_dtypes__"
MANIFEST_VERSION = 1

#: how a C/C++ or Ascend harness should declare each element type
C_TYPES = {
    "bfloat16": "uint16_t (bfloat16 bits)",
    "float16": "uint16_t (IEEE binary16 bits) / aclFloat16",
    "float8_e4m3fn": "uint8_t (float8 e4m3fn bits)",
    "float32": "float",
    "float64": "double",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "int16": "int16_t",
    "uint16": "uint16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "bool": "uint8_t (0/1)",
}


def dtype_from_name(name: str) -> np.dtype:
    """``"bfloat16"`` / ``"float8_e4m3fn"`` / any NumPy dtype name -> dtype (clear error)."""
    if hasattr(ml_dtypes, name):
        return np.dtype(getattr(ml_dtypes, name))
    try:
        return np.dtype(name)
    except TypeError:
        raise CliError(f"unknown dtype {name!r}") from None


def _bits_dtype(dt: np.dtype) -> np.dtype | None:
    """Storage dtype for types a .npy header cannot name (None if NumPy knows the type)."""
    if dt.kind == "V" or dt.type.__module__.startswith("ml_dtypes"):
        return np.dtype(f"<u{dt.itemsize}")
    return None


def _little(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a


# ---------------------------------------------------------------------------------------------
# writing


def check_writable_dir(path: Path, *, force: bool) -> None:
    """Create ``path`` (parents too) or fail clearly; refuse a non-empty directory holding a
    manifest or any file we would write, unless ``force``."""
    if path.exists() and not path.is_dir():
        raise CliError(f"output {str(path)!r} exists and is not a directory")
    if path.is_dir() and not force and (path / MANIFEST).exists():
        raise CliError(
            f"{str(path)!r} already holds a golden ({MANIFEST}); pass --force to overwrite"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"cannot create output directory {str(path)!r}: {e.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CliError(f"output directory {str(path)!r} is not writable")
    if force and (path / MANIFEST).exists():
        _remove_previous_golden(path)


def _remove_previous_golden(path: Path) -> None:
    """--force: delete the files the old manifest lists (so no stale .bin/.npz stays behind)."""
    try:
        old = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        files = {t["file"] for t in old.get("tensors", []) if isinstance(t, dict) and "file" in t}
    except (OSError, ValueError, TypeError):
        files = set()
    for f in files | {MANIFEST}:
        p = path / f
        if p.parent == path and p.is_file():  # never follow a path out of the directory
            p.unlink()


def tensor_entry(name: str, role: str, a: np.ndarray, file: str, key: str | None) -> dict:
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


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Uncompressed ``.npz``; ml_dtypes tensors stored as raw bits + a dtype map member."""
    store = {}
    names = {}
    for k, a in arrays.items():
        a = _little(np.asarray(a))
        names[k] = a.dtype.name
        bits = _bits_dtype(a.dtype)
        store[k] = a.view(bits) if bits is not None else a
    store[DTYPES_KEY] = np.array(json.dumps(names))
    np.savez(path, **store)


def write_bin(path: Path, a: np.ndarray) -> None:
    """Raw C-order little-endian bytes, no header."""
    _little(np.asarray(a)).tofile(path)


def write_golden_dir(
    out_dir: Path,
    *,
    fmt: str,
    inputs: dict[str, np.ndarray],
    goldens: dict[str, np.ndarray],
    header: dict,
    progress=None,
    notes: dict | None = None,
) -> dict:
    """Write inputs + goldens in ``fmt`` ("npz" or "bin") and the manifest; return it.
    ``notes`` adds fields to the entry of the tensor of that name (e.g. a byte layout)."""
    tensors = []
    if fmt == "npz":
        write_npz(out_dir / "inputs.npz", inputs)
        if progress:
            progress("inputs.npz")
        write_npz(out_dir / "golden.npz", goldens)
        if progress:
            progress("golden.npz")
        for k, a in inputs.items():
            tensors.append(tensor_entry(k, "input", np.asarray(a), "inputs.npz", k))
        for k, a in goldens.items():
            tensors.append(tensor_entry(k, "golden", np.asarray(a), "golden.npz", k))
    elif fmt == "bin":
        for role, group in (("input", inputs), ("golden", goldens)):
            for k, a in group.items():
                fname = f"{role}_{k}.bin"
                write_bin(out_dir / fname, a)
                tensors.append(tensor_entry(k, role, np.asarray(a), fname, None))
                if progress:
                    progress(fname)
    else:
        raise CliError(f"unknown format {fmt!r}; expected npz or bin")
    for t in tensors:
        t.update((notes or {}).get(t["name"], {}))
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        **header,
        "format": fmt,
        "tensors": tensors,
    }
    (out_dir / MANIFEST).write_text(dump_json(manifest) + "\n", encoding="utf-8")
    return manifest


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


# ---------------------------------------------------------------------------------------------
# reading


@dataclass
class Loaded:
    """A tensor read back from disk, plus the manifest it came with (if any)."""

    array: np.ndarray
    source: str
    manifest: dict | None = None
    entry: dict | None = None


def read_manifest(path: Path) -> dict:
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CliError(f"no manifest at {str(path)!r}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise CliError(f"cannot read manifest {str(path)!r}: {e}") from None
    if not isinstance(m, dict) or "tensors" not in m:
        raise CliError(f"{str(path)!r} is not a tilesim manifest (no 'tensors' list)")
    return m


def _split_key(spec: str) -> tuple[Path, str | None]:
    """``file.npz:key`` -> (file.npz, key); a plain path -> (path, None)."""
    if ":" in spec and not Path(spec).exists():
        p, _, key = spec.rpartition(":")
        if p.endswith(".npz"):
            return Path(p), key
    return Path(spec), None


def _reinterpret(a: np.ndarray, want: np.dtype, source: str) -> np.ndarray:
    if a.dtype == want:
        return a
    if a.dtype.itemsize != want.itemsize:
        raise CliError(
            f"{source}: cannot reinterpret {a.dtype} ({a.dtype.itemsize} bytes) as {want} "
            f"({want.itemsize} bytes)"
        )
    return a.view(want)


def read_bin(path: Path, entry: dict, *, dtype: np.dtype | None = None) -> np.ndarray:
    """Read a raw tensor described by a manifest entry; the byte count must match exactly."""
    dt = dtype if dtype is not None else dtype_from_name(entry["dtype"])
    shape = tuple(entry["shape"])
    want = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    try:
        have = path.stat().st_size
    except FileNotFoundError:
        raise CliError(f"no such file {str(path)!r}") from None
    if have != want:
        raise CliError(
            f"{str(path)!r} has {have} bytes but the manifest describes {want} "
            f"(shape {list(shape)}, dtype {dt.name}): mismatched file"
        )
    return np.fromfile(path, dtype=dt.newbyteorder("<")).astype(dt, copy=False).reshape(shape)


def _load_npz(path: Path, key: str | None, preferred: str | None) -> tuple[np.ndarray, str]:
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read {str(path)!r} as .npz: {e}") from None
    with z:
        names = [k for k in z.files if k != DTYPES_KEY]
        dtypes = json.loads(str(z[DTYPES_KEY])) if DTYPES_KEY in z.files else {}
        if key is None:
            if len(names) == 1:
                key = names[0]
            elif preferred in names:
                key = preferred
            else:
                raise CliError(
                    f"{str(path)!r} holds several arrays {names}; name one as {path}:KEY"
                )
        if key not in names:
            raise CliError(f"{str(path)!r} has no array {key!r}; it holds {names}")
        a = z[key]
    if key in dtypes:
        a = _reinterpret(a, dtype_from_name(dtypes[key]), f"{path}:{key}")
    return a, key


def _golden_entry(manifest: dict, where: str, name: str | None = None) -> dict:
    goldens = [t for t in manifest["tensors"] if t.get("role") == "golden"]
    if name is not None:
        goldens = [t for t in goldens if t["name"] == name]
    if len(goldens) != 1:
        raise CliError(
            f"{where}: expected one golden tensor{f' named {name!r}' if name else ''}, "
            f"found {[t['name'] for t in goldens]}"
        )
    return goldens[0]


def load_from_manifest(mpath: Path, entry: dict) -> np.ndarray:
    f = mpath.parent / entry["file"]
    if f.suffix == ".bin":
        return read_bin(f, entry)
    a, _ = _load_npz(f, entry.get("key", entry["name"]), None)
    if list(a.shape) != list(entry["shape"]) or a.dtype.name != entry["dtype"]:
        raise CliError(
            f"{str(f)!r}:{entry['name']} is {a.dtype.name}{list(a.shape)} but the manifest says "
            f"{entry['dtype']}{entry['shape']}: mismatched file"
        )
    return a


def _manifest_beside(path: Path) -> dict | None:
    """The manifest in the same directory, if there is a readable one."""
    mpath = path.parent / MANIFEST
    if not mpath.exists():
        return None
    return read_manifest(mpath)


def load_tensor(
    spec: str,
    *,
    like: Loaded | None = None,
    dtype: str | None = None,
) -> Loaded:
    """Read a tensor named on the command line.

    ``spec`` is ``x.npy``, ``x.npz`` / ``x.npz:KEY``, ``x.bin``, a ``manifest.json`` or a golden
    directory (its golden tensor). A ``.bin`` takes shape and dtype from the manifest next to
    it (the entry whose ``file`` is that name) or else from ``like`` (the golden it is compared
    with). ``dtype`` reinterprets the raw bytes (e.g. a ``uint16`` dump as ``bfloat16``).
    """
    want = dtype_from_name(dtype) if dtype else None
    path, key = _split_key(spec)
    if path.is_dir():
        path = path / MANIFEST
    if not path.exists():
        raise CliError(f"no such file {str(path)!r}")
    if path.name == MANIFEST or path.suffix == ".json":
        m = read_manifest(path)
        e = _golden_entry(m, str(path), key)
        a = load_from_manifest(path, e)
        return Loaded(_reinterpret(a, want, spec) if want else a, str(path), m, e)
    if path.suffix == ".npy":
        try:
            a = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise CliError(f"cannot read {str(path)!r} as .npy: {e}") from None
        if want is not None:
            a = _reinterpret(a, want, spec)
        elif a.dtype.kind == "V" and like is not None:
            # an ml_dtypes array saved with np.save: same width as the golden -> its dtype
            a = _reinterpret(a, like.array.dtype, spec)
        return Loaded(a, str(path))
    if path.suffix == ".npz":
        preferred = like.entry["name"] if like is not None and like.entry else None
        m = _manifest_beside(path)
        if m is not None and preferred is None:
            goldens = [t["name"] for t in m["tensors"] if t.get("file") == path.name]
            preferred = goldens[0] if len(goldens) == 1 else None
        a, k = _load_npz(path, key, preferred)
        if want is not None:
            a = _reinterpret(a, want, spec)
        entry = None
        if m is not None:
            mine = [t for t in m["tensors"] if t.get("file") == path.name and t["name"] == k]
            entry = mine[0] if mine else None
        return Loaded(a, f"{path}:{k}", m if entry else None, entry)
    if path.suffix == ".bin":
        m = _manifest_beside(path)
        if m is not None:
            for e in m["tensors"]:
                if e.get("file") == path.name:
                    return Loaded(read_bin(path, e, dtype=want), str(path), m, e)
        if like is None:
            raise CliError(
                f"{str(path)!r} is a raw .bin file without a manifest entry beside it; "
                "compare it against a golden that has one (its shape and dtype are used)"
            )
        shape = list(like.array.shape)
        dt = want if want is not None else like.array.dtype
        return Loaded(read_bin(path, {"shape": shape, "dtype": dt.name}, dtype=dt), str(path))
    raise CliError(
        f"unsupported file {str(path)!r}: expected .npy, .npz[:KEY], .bin, manifest.json "
        "or a golden directory"
    )


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
