"""The element types a tensor file may hold: their names, how a C/C++ or Ascend harness declares
each, and the byte-level handling of the ml_dtypes types (bfloat16, float8) NumPy's ``.npy``
header cannot name (stored as raw unsigned bits, little-endian).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from tilesim.cli import CliError

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


def dtype_from_name(name) -> np.dtype:
    """``"bfloat16"`` / ``"float8_e4m3fn"`` / a NumPy numeric dtype name -> dtype; anything
    else (object, complex, strings, a non-string) is a clear error."""
    if not isinstance(name, str) or name not in DTYPE_NAMES:
        raise CliError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPE_NAMES)}")
    if hasattr(ml_dtypes, name):
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


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


def bits_dtype(dt: np.dtype) -> np.dtype | None:
    """Storage dtype for types a .npy header cannot name (None if NumPy knows the type)."""
    if dt.kind == "V" or dt.type.__module__.startswith("ml_dtypes"):
        return np.dtype(f"<u{dt.itemsize}")
    return None


def little_endian(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a


def reinterpret(a: np.ndarray, want: np.dtype, source: str) -> np.ndarray:
    if a.dtype == want:
        return a
    if a.dtype.itemsize != want.itemsize:
        raise CliError(
            f"{source}: cannot reinterpret {a.dtype} ({a.dtype.itemsize} bytes) as {want} "
            f"({want.itemsize} bytes)"
        )
    return np.ascontiguousarray(a).view(want)


__all__ = ["C_TYPES", "DTYPE_NAMES", "bits_dtype", "check_dtype_supported", "dtype_from_name",
           "little_endian", "reinterpret"]  # fmt: skip
