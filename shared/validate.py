"""The one argument-check policy of every public op, builder and wrapper in tilesim.

Policy (``docs/index.md``, "Argument checks"):

* **Arrays** are NumPy arrays (ml_dtypes included) or torch tensors. Python lists, tuples,
  scalars and ``None`` given for an array argument raise ``TypeError``. A torch tensor with
  ``requires_grad`` is read through ``detach()``; BF16/FP8 tensors are viewed as ml_dtypes
  arrays without a copy (:mod:`tilesim.shared.interop`). Nothing a caller passes is written.
* **Output kind** follows the op's first array argument: NumPy in, NumPy out; torch in, torch
  out (:func:`same_kind`).
* **Metadata checks** (:func:`dtype_of`, :func:`shape_of`, :func:`check_array`) read only the
  dtype and shape, so they work on tensors of any device without a copy. **Value checks**
  (:func:`host_ints`, :func:`check_finite`) need the data on the host.
* **Integers** are range-checked as Python ints (arrays: in int64 after rejecting unsigned
  values above the int64 range) before any cast. ``bool`` is not an integer here.
* **Floats** must be real, finite numbers; ``fp32=True`` also rejects values that overflow or
  underflow to 0 when rounded to FP32.
* **Flags** are ``bool`` (or ``numpy.bool_``) only; a truthy string is an error.
* ``trace`` is checked with the other arguments, before any work.

Every message names the argument, the expected value and the actual one:
``"<name>: expected <what>, got <actual>"``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import numpy as np
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.interop import is_torch_tensor, to_numpy, to_torch, torch_dtype_to_numpy

_INT64_MAX = np.iinfo(np.int64).max
_FP32_MAX = float(np.finfo(np.float32).max)
_FP32_TINY = float(np.finfo(np.float32).smallest_subnormal)


def _kind(x) -> str:
    return type(x).__name__


# ----------------------------------------------------------------------------- arrays
def is_array(x) -> bool:
    """True for a NumPy array or a torch tensor."""
    return isinstance(x, np.ndarray) or is_torch_tensor(x)


def require_array(x, name: str) -> None:
    """``TypeError`` unless ``x`` is a NumPy array or a torch tensor."""
    if not is_array(x):
        raise TypeError(f"{name}: expected a numpy array or a torch tensor, got {_kind(x)}")


def dtype_of(x, name: str) -> np.dtype:
    """NumPy dtype of an array or tensor (torch dtypes mapped to ml_dtypes); no data read."""
    require_array(x, name)
    if isinstance(x, np.ndarray):
        return x.dtype
    dt = torch_dtype_to_numpy(x.dtype)
    if dt is None:
        raise TypeError(f"{name}: expected a dtype NumPy can represent, got {x.dtype}")
    return dt


def shape_of(x, name: str) -> tuple[int, ...]:
    """Shape of an array or tensor as a tuple of ints; no data read."""
    require_array(x, name)
    return tuple(int(d) for d in x.shape)


def _dtype_text(allowed) -> str:
    return " or ".join(str(np.dtype(d)) for d in allowed)


def check_dtype(x, name: str, allowed) -> np.dtype:
    """``TypeError`` unless the dtype of ``x`` is one of ``allowed`` (a dtype or a tuple)."""
    allowed = tuple(np.dtype(d) for d in (allowed if isinstance(allowed, tuple) else (allowed,)))
    dt = dtype_of(x, name)
    if dt not in allowed:
        raise TypeError(f"{name}: expected dtype {_dtype_text(allowed)}, got {dt}")
    return dt


def check_shape(x, name: str, expected, layout: str = "") -> tuple[int, ...]:
    """``ValueError`` unless ``shape_of(x)`` matches ``expected`` (``None`` entries: any size).

    ``layout`` names the axes in the message, e.g. ``"[B, HQ, D]"``.
    """
    shp = shape_of(x, name)
    expected = tuple(expected)
    ok = len(shp) == len(expected) and all(
        e is None or e == s for e, s in zip(expected, shp, strict=False)
    )
    if not ok:
        want = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ")"
        lay = f" {layout}" if layout else ""
        raise ValueError(f"{name}: expected shape {want}{lay}, got {shp}")
    return shp


def check_ndim(x, name: str, ndim: int, layout: str = "") -> tuple[int, ...]:
    """``ValueError`` unless ``x`` has ``ndim`` dimensions."""
    shp = shape_of(x, name)
    if len(shp) != ndim:
        lay = f" {layout}" if layout else ""
        raise ValueError(f"{name}: expected a {ndim}-D array{lay}, got shape {shp}")
    return shp


def check_array(x, name: str, *, dtype=None, ndim: int | None = None, shape=None, layout=""):
    """Metadata checks in one call: array kind, then dtype, then ``ndim`` / ``shape``."""
    require_array(x, name)
    if dtype is not None:
        check_dtype(x, name, dtype)
    if ndim is not None:
        check_ndim(x, name, ndim, layout)
    if shape is not None:
        check_shape(x, name, shape, layout)
    return x


def host_array(x, name: str) -> np.ndarray:
    """The data of an array or tensor as a NumPy array on the host.

    NumPy arrays are returned as they are; CPU tensors are viewed without a copy (detached);
    tensors on another device are copied to the host.
    """
    require_array(x, name)
    if isinstance(x, np.ndarray):
        return x
    if x.device.type != "cpu":
        x = x.detach().to("cpu")
    return to_numpy(x)


def as_array(x, name: str, *, dtype=None, ndim: int | None = None, shape=None, layout=""):
    """:func:`check_array` then :func:`host_array`: the checked input as a host NumPy array."""
    check_array(x, name, dtype=dtype, ndim=ndim, shape=shape, layout=layout)
    return host_array(x, name)


def same_kind(result: np.ndarray, like):
    """``result`` as a torch tensor when ``like`` (the op's first array argument) is one."""
    return to_torch(result) if is_torch_tensor(like) else result


def check_finite(a: np.ndarray, name: str) -> None:
    """``ValueError`` naming the first NaN / inf element of a host float array (BF16, FP8,
    FP16, FP32, FP64); integer arrays pass."""
    a = np.asarray(a)
    if a.dtype in (BF16, FP8_E4M3):
        a = a.astype(np.float32)
    elif a.dtype.kind != "f":
        return
    bad = ~np.isfinite(a)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name}: expected finite values, got {a[idx]!r} at index {list(idx)}")


def host_ints(x, name: str, *, ndim: int | None = None, shape=None, layout="") -> np.ndarray:
    """An integer array's values as a host int64 NumPy array (a copy), checked for range.

    Rejects non-integer dtypes (bool included) and unsigned values above the int64 range, so
    no later cast can wrap a huge value around.
    """
    check_array(x, name, ndim=ndim, shape=shape, layout=layout)
    dt = dtype_of(x, name)
    if dt.kind not in "iu":
        raise TypeError(f"{name}: expected an integer dtype, got {dt}")
    a = host_array(x, name)
    if dt.kind == "u" and dt.itemsize >= 8 and a.size and int(a.max()) > _INT64_MAX:
        raise ValueError(f"{name}: expected values <= {_INT64_MAX}, got {int(a.max())}")
    return a.astype(np.int64)


def check_range(a: np.ndarray, name: str, lo: int | None = None, hi: int | None = None) -> None:
    """``ValueError`` naming the first element of int ``a`` outside ``[lo, hi]``."""
    bad = np.zeros(a.shape, dtype=bool)
    if lo is not None:
        bad |= a < lo
    if hi is not None:
        bad |= a > hi
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        lo_t = "-inf" if lo is None else lo
        hi_t = "inf" if hi is None else hi
        raise ValueError(
            f"{name}{list(idx)}: expected a value in [{lo_t}, {hi_t}], got {int(a[idx])}"
        )


# ----------------------------------------------------------------------------- scalars
def check_int(v, name: str, *, lo: int | None = None, hi: int | None = None) -> int:
    """An integer scalar (Python or NumPy int, not bool) in ``[lo, hi]`` -> ``int``."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {_kind(v)} {v!r}")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        lo_t = "-inf" if lo is None else lo
        hi_t = "inf" if hi is None else hi
        raise ValueError(f"{name}: expected an int in [{lo_t}, {hi_t}], got {v}")
    return v


def check_pos_int(v, name: str) -> int:
    """A positive integer scalar -> ``int``."""
    return check_int(v, name, lo=1)


def check_float(v, name: str, *, positive: bool = False, fp32: bool = False) -> float:
    """A real, finite number (not bool) -> ``float``.

    ``positive``: must be > 0. ``fp32``: must stay finite and (unless 0) non-zero when rounded
    to FP32, the dtype the kernels compute in.
    """
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {_kind(v)} {v!r}")
    f = float(v)
    if not math.isfinite(f):
        raise ValueError(f"{name}: expected a finite number, got {v!r}")
    if positive and not f > 0:
        raise ValueError(f"{name}: expected a number > 0, got {v!r}")
    if fp32 and f != 0 and not (_FP32_TINY / 2 < abs(f) < _FP32_MAX):
        raise ValueError(
            f"{name}: expected a value FP32 can hold (|x| in [{_FP32_TINY:.3g}, "
            f"{_FP32_MAX:.4g}]), got {v!r}"
        )
    return f


def check_bool(v, name: str) -> bool:
    """A flag: ``bool`` or ``numpy.bool_`` only -> ``bool``."""
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {_kind(v)} {v!r}")
    return bool(v)


def check_choice(v, name: str, choices: Iterable):
    """``ValueError`` unless ``v`` is one of ``choices`` (compared by equality, type-strict)."""
    choices = tuple(choices)
    if not any(type(v) is type(c) and v == c for c in choices):
        raise ValueError(f"{name}: expected one of {choices}, got {v!r}")
    return v


def check_instance(v, name: str, cls, *, optional: bool = False):
    """``TypeError`` unless ``v`` is a ``cls`` (or ``None`` when ``optional``)."""
    if v is None and optional:
        return v
    if not isinstance(v, cls):
        want = getattr(cls, "__name__", str(cls)) + (" or None" if optional else "")
        raise TypeError(f"{name}: expected a {want}, got {_kind(v)}")
    return v


def check_trace(trace) -> None:
    """``TypeError`` unless ``trace`` is a callable or ``None``."""
    if trace is not None and not callable(trace):
        raise TypeError(f"trace: expected a callable or None, got {_kind(trace)}")


__all__ = [
    "as_array",
    "check_array",
    "check_bool",
    "check_choice",
    "check_dtype",
    "check_finite",
    "check_float",
    "check_instance",
    "check_int",
    "check_ndim",
    "check_pos_int",
    "check_range",
    "check_shape",
    "check_trace",
    "dtype_of",
    "host_array",
    "host_ints",
    "is_array",
    "require_array",
    "same_kind",
    "shape_of",
]
