"""Golden files on disk: ``.npz`` or raw little-endian ``.bin`` tensors plus ``manifest.json``.

Layout of a golden directory written by :func:`write_golden_dir`::

    DIR/manifest.json            case, op, seed, params, tiling, tolerance, tilesim version and
                                 one entry per tensor (name, role, file, key, shape, dtype,
                                 itemsize, nbytes, byte order, C type)
    DIR/inputs.npz, golden.npz   --format npz (NumPy's zip of .npy members)
    DIR/input_<name>.bin, ...    --format bin: one raw file per tensor, C order,
    DIR/golden_<name>.bin        little-endian, no header (read with np.fromfile)

Roles: ``input``, ``golden`` (the op's outputs, in the op's order) and ``scores`` (the MSA
indexer's block scores, stored beside its block ids for the tie-aware compare).

NumPy cannot describe the ml_dtypes types (bfloat16, float8_e4m3fn) in a ``.npy`` header: it
writes them as opaque void (``|V2``). The npz files therefore store those tensors as their
raw bits and carry a ``__tilesim_dtypes__`` member naming the real dtype of every key, so
:func:`load_tensor` gives them back with the right dtype even without the manifest.

Every reader turns a bad file (missing, truncated, corrupt, a manifest with bad fields, a file
entry pointing outside the manifest's directory) into a one-line :class:`CliError`.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import ml_dtypes
import numpy as np
from tilesim.cli import CliError
from tilesim.shared.case_schema import TOLERANCE_MODES

MANIFEST = "manifest.json"
DTYPES_KEY = "__tilesim_dtypes__"
MANIFEST_VERSION = 1
ROLES = ("input", "golden", "scores")
#: file-name prefix of each role in a ``--format bin`` golden
BIN_PREFIX = {"input": "input", "golden": "golden", "scores": "scores"}

#: how a C/C++ or Ascend harness should declare each element type
C_TYPES = {
    "bfloat16": "uint16_t (bfloat16 bits)",
    "float16": "uint16_t (IEEE binary16 bits) / aclFloat16",
    "float8_e4m3fn": "uint8_t (float8 e4m3fn bits)",
    "float8_e5m2": "uint8_t (float8 e5m2 bits)",
    "float32": "float",
    "float64": "double",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "int16": "int16_t",
    "uint16": "uint16_t",
    "int32": "int32_t",
    "uint32": "uint32_t",
    "int64": "int64_t",
    "uint64": "uint64_t",
    "bool": "uint8_t (0/1)",
}
#: the element types a tensor file may hold (the names of C_TYPES)
DTYPE_NAMES = tuple(C_TYPES)

#: what the readers turn into a one-line error (corrupt or truncated files of every kind)
_READ_ERRORS = (
    OSError,
    ValueError,
    EOFError,
    zipfile.BadZipFile,
    zlib.error,
    KeyError,
    TypeError,
    IndexError,
    RecursionError,
)


@contextmanager
def reading(what: str, also: tuple = ()):
    """Turn the exceptions of a corrupt or truncated file into ``CliError("cannot read ...")``
    (``also``: more exception types, e.g. torch's RuntimeError for a bad archive)."""
    try:
        yield
    except CliError:
        raise
    except MemoryError:
        raise CliError(f"cannot read {what}: not enough memory") from None
    except (*_READ_ERRORS, *also) as e:
        msg = (getattr(e, "strerror", None) or str(e) or type(e).__name__).splitlines()[0]
        if len(msg) > 160:
            msg = msg[:157] + "..."
        raise CliError(f"cannot read {what}: {msg}") from None


def dtype_from_name(name) -> np.dtype:
    """``"bfloat16"`` / ``"float8_e4m3fn"`` / a NumPy numeric dtype name -> dtype; anything
    else (object, complex, strings, a non-string) is a clear error."""
    if not isinstance(name, str) or name not in DTYPE_NAMES:
        raise CliError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPE_NAMES)}")
    if hasattr(ml_dtypes, name):
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


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


def check_dtype_supported(a: np.ndarray, what: str) -> np.ndarray:
    """``a`` itself when its dtype is one of :data:`DTYPE_NAMES`, else a clear error."""
    if a.dtype.kind == "V" and a.dtype.name not in DTYPE_NAMES:
        raise CliError(
            f"{what}: opaque {a.dtype.itemsize}-byte elements ({a.dtype.str}, e.g. bfloat16 "
            "saved with np.save); name the dtype with --actual-dtype / --golden-dtype"
        )
    if a.dtype.name not in DTYPE_NAMES:
        raise CliError(
            f"{what}: unsupported dtype {a.dtype} (expected one of {', '.join(DTYPE_NAMES)})"
        )
    return a


# ---------------------------------------------------------------------------------------------
# writing


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
    with open(path, "wb") as f:  # a file object: np.savez appends no ".npz" to a temp name
        np.savez(f, **store)


def write_bin(path: Path, a: np.ndarray) -> None:
    """Raw C-order little-endian bytes, no header."""
    with open(path, "wb") as f:
        _little(np.asarray(a)).tofile(f)


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
            write_npz(tmp, arrays)
        else:
            write_bin(tmp, arrays[members[0][1]])
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
# manifests


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


def _check_shape(shape, where: str) -> list[int]:
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
    _check_shape(e.get("shape"), where)
    try:
        dtype_from_name(e.get("dtype"))
    except CliError as err:
        raise CliError(f"{where}: {err}") from None
    return e


def check_tolerance_fields(tol, where: str) -> dict:
    """A manifest's ``tolerance`` object (``{}`` when absent): a mode of
    :data:`tilesim.shared.case_schema.TOLERANCE_MODES`, numbers or nulls for ``atol``,
    ``rtol``, ``ratio`` and the optional ``row_ulp``."""
    if tol is None:
        return {}
    if not isinstance(tol, dict):
        raise CliError(f"{where}: 'tolerance' must be an object, got {type(tol).__name__}")
    mode = tol.get("mode", "compare")
    if mode not in TOLERANCE_MODES:
        raise CliError(
            f"{where}: tolerance 'mode' must be one of {', '.join(TOLERANCE_MODES)}, got {mode!r}"
        )
    for k in ("atol", "rtol", "ratio", "row_ulp"):
        v = tol.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise CliError(f"{where}: tolerance {k!r} must be a number or null, got {v!r}")
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
    check_tolerance_fields(m.get("tolerance"), str(path))
    return m


# ---------------------------------------------------------------------------------------------
# reading files


def _split_key(spec: str) -> tuple[Path, str | None]:
    """``file.npz:key`` / ``file.pt:key`` / ``manifest.json:name`` -> (file, key); a plain
    path -> (path, None)."""
    if ":" in spec and not Path(spec).exists():
        p, _, key = spec.rpartition(":")
        if p.endswith((".npz", ".pt", ".pth", ".json")):
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
    return np.ascontiguousarray(a).view(want)


def read_bin(path: Path, entry: dict, *, dtype: np.dtype | None = None) -> np.ndarray:
    """Read a raw tensor described by a manifest entry; the byte count must match exactly."""
    dt = dtype if dtype is not None else dtype_from_name(entry["dtype"])
    shape = tuple(_check_shape(list(entry["shape"]), str(path)))
    want = int(np.prod(shape, dtype=object)) * dt.itemsize if shape else dt.itemsize
    if not path.is_file():
        raise CliError(f"no such file {str(path)!r}")
    have = path.stat().st_size
    if have != want:
        raise CliError(
            f"{str(path)!r} has {have} bytes but the manifest describes {want} "
            f"(shape {list(shape)}, dtype {dt.name}): mismatched file"
        )
    with reading(repr(str(path))):
        a = np.fromfile(path, dtype=dt.newbyteorder("<"))
    return a.astype(dt, copy=False).reshape(shape)


def read_npy(path: Path) -> np.ndarray:
    with reading(f"{str(path)!r} as .npy"):
        a = np.load(path, allow_pickle=False)
        if not isinstance(a, np.ndarray):
            raise ValueError("not a .npy file")
    return a


def _npz_dtypes(z, path: Path) -> dict:
    if DTYPES_KEY not in z.files:
        return {}
    d = json.loads(str(z[DTYPES_KEY]))
    if not isinstance(d, dict):
        raise CliError(f"{str(path)!r}: bad {DTYPES_KEY} member")
    return d


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an npz (dtypes restored from its ``__tilesim_dtypes__`` member)."""
    with reading(f"{str(path)!r} as .npz"), np.load(path, allow_pickle=False) as z:
        if not hasattr(z, "files"):
            raise ValueError("not an .npz file")
        dtypes = _npz_dtypes(z, path)
        out = {k: z[k] for k in z.files if k != DTYPES_KEY}
    for k, name in dtypes.items():
        if k in out:
            out[k] = _reinterpret(out[k], dtype_from_name(name), f"{path}:{k}")
    return out


def _load_npz(path: Path, key: str | None, preferred: str | None) -> tuple[np.ndarray, str]:
    with reading(f"{str(path)!r} as .npz"), np.load(path, allow_pickle=False) as z:
        if not hasattr(z, "files"):
            raise ValueError("not an .npz file")
        names = [k for k in z.files if k != DTYPES_KEY]
        dtypes = _npz_dtypes(z, path)
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


def read_pt(path: Path) -> dict[str, np.ndarray] | list[np.ndarray]:
    """A ``.pt`` file loaded with ``torch.load(weights_only=True)`` (no code runs): one
    tensor -> ``[array]``, a list/tuple -> list, a dict of name -> tensor -> dict."""
    from tilesim.cli import require

    torch = require("torch", f"reading {path.name}", extra="torch")
    import pickle

    from tilesim.shared.interop import to_numpy

    with reading(f"{str(path)!r} as a torch file", (RuntimeError, pickle.UnpicklingError)):
        obj = torch.load(path, map_location="cpu", weights_only=True)

    def conv(t, where):
        if not isinstance(t, torch.Tensor):
            raise CliError(f"{path}: {where} is a {type(t).__name__}, not a tensor")
        with reading(f"{path}: {where}"):
            a = to_numpy(t.detach().cpu())
        return check_dtype_supported(np.asarray(a), f"{path}: {where}")

    if isinstance(obj, torch.Tensor):
        return [conv(obj, "the tensor")]
    if isinstance(obj, (list, tuple)):
        return [conv(t, f"item {j}") for j, t in enumerate(obj)]
    if isinstance(obj, dict):
        return {str(k): conv(v, f"key {k!r}") for k, v in obj.items()}
    raise CliError(f"{path}: holds a {type(obj).__name__}; expected a tensor, list or dict")


def load_from_manifest(mpath: Path, entry: dict, *, dtype: np.dtype | None = None) -> np.ndarray:
    f = confined(mpath.parent, entry["file"], str(mpath))
    if f.suffix == ".bin":
        return read_bin(f, entry, dtype=dtype)
    if not f.is_file():
        raise CliError(f"no such file {str(f)!r} (listed in {str(mpath)!r})")
    if f.suffix == ".npy":
        a = read_npy(f)
        a = _reinterpret(a, dtype or dtype_from_name(entry["dtype"]), str(f))
    else:
        a, _ = _load_npz(f, entry.get("key", entry["name"]), None)
        if dtype is not None:
            a = _reinterpret(a, dtype, str(f))
    want = dtype.name if dtype is not None else entry["dtype"]
    if list(a.shape) != list(entry["shape"]) or a.dtype.name != want:
        raise CliError(
            f"{str(f)!r}:{entry['name']} is {a.dtype.name}{list(a.shape)} but the manifest says "
            f"{want}{entry['shape']}: mismatched file"
        )
    return a


def _manifest_beside(path: Path) -> dict | None:
    """The manifest in the same directory, if there is one."""
    mpath = path.parent / MANIFEST
    if not mpath.exists():
        return None
    return read_manifest(mpath)


def entries(manifest: dict, role: str) -> list[dict]:
    return [t for t in manifest["tensors"] if t.get("role", "golden") == role]


def _golden_entry(manifest: dict, where: str, name: str | None = None) -> dict:
    goldens = entries(manifest, "golden")
    if name is not None:
        goldens = [t for t in goldens if t["name"] == name]
    if len(goldens) != 1:
        raise CliError(
            f"{where}: expected one golden tensor{f' named {name!r}' if name else ''}, "
            f"found {[t['name'] for t in goldens]}"
        )
    return goldens[0]


def _resolve(spec: str) -> tuple[Path, str | None]:
    path, key = _split_key(str(spec))
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
    path, key = _resolve(spec)
    if path.name == MANIFEST or path.suffix == ".json":
        m = read_manifest(path)
        e = _golden_entry(m, str(path), key)
        src = f"{path}:{key}" if key is not None else str(path)
        return Loaded(load_from_manifest(path, e, dtype=want), src, m, e)
    if path.suffix == ".npy":
        a = read_npy(path)
        if want is not None:
            a = _reinterpret(a, want, spec)
        elif a.dtype.kind == "V" and like is not None:
            # an ml_dtypes array saved with np.save: same width as the golden -> its dtype
            a = _reinterpret(a, like.array.dtype, spec)
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
    m = _manifest_beside(path)
    if m is not None and preferred is None:
        goldens = [t["name"] for t in entries(m, "golden") if t["file"] == path.name]
        preferred = goldens[0] if len(goldens) == 1 else None
    a, k = _load_npz(path, key, preferred)
    if want is not None:
        a = _reinterpret(a, want, spec)
    elif a.dtype.kind == "V" and like is not None:  # as for .npy: the golden's dtype
        a = _reinterpret(a, like.array.dtype, f"{path}:{k}")
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
    return Loaded(_reinterpret(a, want, src) if want is not None else a, src)


def _load_bin_tensor(path, like, want) -> Loaded:
    m = _manifest_beside(path)
    if m is not None:
        for e in m["tensors"]:
            if e["file"] == path.name:
                return Loaded(read_bin(path, e, dtype=want), str(path), m, e)
    if like is None:
        raise CliError(
            f"{str(path)!r} is a raw .bin file without a manifest entry beside it; "
            "compare it against a golden that has one (its shape and dtype are used)"
        )
    shape = list(like.array.shape)
    dt = want if want is not None else like.array.dtype
    return Loaded(read_bin(path, {"shape": shape, "dtype": dt.name}, dtype=dt), str(path))


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
