"""Tensors in files: ``.npz`` (NumPy's zip of ``.npy`` members), ``.npy``, raw little-endian
``.bin`` (C order, no header) and torch's ``.pt``, written and read back as NumPy arrays.

NumPy cannot describe the ml_dtypes types (bfloat16, float8_e4m3fn) in a ``.npy`` header: it
writes them as opaque void (``|V2``). The npz files therefore store those tensors as their
raw bits and carry a ``__tilesim_dtypes__`` member (:data:`DTYPES_KEY`) naming the real dtype
of every key, so :func:`read_npz` gives them back with the right dtype even without a
manifest. A ``.bin`` file holds bytes only: its shape and dtype come from a manifest entry
(:mod:`tilesim.cli.manifest`) or the golden it is compared with (:mod:`tilesim.cli.loading`).

Every reader turns a bad file (missing, truncated, corrupt) into a one-line :class:`CliError`
(:func:`reading`).
"""

from __future__ import annotations

import json
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tilesim.cli import CliError
from tilesim.cli.dtypes import (
    bits_dtype,
    check_dtype_supported,
    dtype_from_name,
    little_endian,
    reinterpret,
)

DTYPES_KEY = "__tilesim_dtypes__"

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


# ---------------------------------------------------------------------------------------------
# writing


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Uncompressed ``.npz``; ml_dtypes tensors stored as raw bits + a dtype map member."""
    store = {}
    names = {}
    for k, a in arrays.items():
        a = little_endian(np.asarray(a))
        names[k] = a.dtype.name
        bits = bits_dtype(a.dtype)
        store[k] = a.view(bits) if bits is not None else a
    store[DTYPES_KEY] = np.array(json.dumps(names))
    with open(path, "wb") as f:  # a file object: np.savez appends no ".npz" to a temp name
        np.savez(f, **store)


def write_bin(path: Path, a: np.ndarray) -> None:
    """Raw C-order little-endian bytes, no header."""
    with open(path, "wb") as f:
        little_endian(np.asarray(a)).tofile(f)


# ---------------------------------------------------------------------------------------------
# reading


def read_bin(path: Path, shape, dtype: np.dtype) -> np.ndarray:
    """A raw C-order little-endian tensor of ``shape`` (a checked list of sizes) and ``dtype``;
    the file's byte count must match exactly."""
    dt, shape = dtype, tuple(shape)
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
            out[k] = reinterpret(out[k], dtype_from_name(name), f"{path}:{k}")
    return out


def read_npz_member(path: Path, key: str | None, preferred: str | None) -> tuple[np.ndarray, str]:
    """``(array, key)``: the member ``key`` of an npz (dtype restored), or with ``key=None`` its
    only member, else the member named ``preferred``; else a :class:`CliError` listing them."""
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
        a = reinterpret(a, dtype_from_name(dtypes[key]), f"{path}:{key}")
    return a, key


def read_pt(path: Path) -> dict[str, np.ndarray] | list[np.ndarray]:
    """A ``.pt`` file loaded with ``torch.load(weights_only=True)`` (no code runs): one
    tensor -> ``[array]``, a list/tuple -> list, a dict of name -> tensor -> dict."""
    import pickle

    from tilesim.cli import optional_dependency

    with optional_dependency(f"reading {path.name}", extra="torch"):
        import torch

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


__all__ = ["DTYPES_KEY", "read_bin", "read_npy", "read_npz", "read_npz_member", "read_pt",
           "reading", "write_bin", "write_npz"]  # fmt: skip
