"""The one argument-check policy of every public op, builder and wrapper in tilesim.

Policy (``docs/index.md``, "Argument checks"):

* **Arrays** are NumPy arrays (ml_dtypes included) or torch tensors. Python lists, tuples,
  scalars and ``None`` given for an array argument raise ``TypeError``; so do masked arrays
  (``np.ma.MaskedArray``: the mask would be silently ignored), ``np.matrix`` and arrays of
  the object dtype. A torch tensor with
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
* **Host helpers** (casts, quantizers, cache packers, :func:`~tilesim.reference.compare`)
  read their array arguments with :func:`host_data` and always return NumPy; complex, object,
  string and structured dtypes are refused by :func:`check_real`.
* **Environment values** follow their own policy, in :mod:`tilesim.shared.env`.

Every message names the argument, the expected value and the actual one:
``"<name>: expected <what>, got <actual>"``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable

import numpy as np
from tilesim.shared.casts import BF16, FP8_E4M3
from tilesim.shared.interop import is_torch_tensor, to_numpy, to_torch, torch_dtype_to_numpy

_INT64_MAX = np.iinfo(np.int64).max
INT32_MAX = int(np.iinfo(np.int32).max)
_FP32_MAX = float(np.finfo(np.float32).max)
_FP32_TINY = float(np.finfo(np.float32).smallest_subnormal)
#: the smallest magnitude that rounds to inf in FP32 (RNE): FP32_MAX + half an ULP
_FP32_OVERFLOW = 2.0**128 - 2.0**103


def _kind(x) -> str:
    return type(x).__name__


# ----------------------------------------------------------------------------- arrays
def is_array(x) -> bool:
    """True for a NumPy array or a torch tensor."""
    return isinstance(x, np.ndarray) or is_torch_tensor(x)


#: ndarray subclasses whose data would be misread: a masked array's mask would be silently
#: ignored, ``np.matrix`` keeps every result 2-D and makes ``*`` a matrix product
_REFUSED_SUBCLASSES = (np.ma.MaskedArray, np.matrix)


def require_array(x, name: str) -> None:
    """``TypeError`` unless ``x`` is a NumPy array or a torch tensor holding numbers.

    Refused as well: masked arrays (the mask would be ignored), ``np.matrix`` and arrays of
    the object dtype (Python objects, not numbers of a fixed width)."""
    if not is_array(x):
        raise TypeError(f"{name}: expected a numpy array or a torch tensor, got {_kind(x)}")
    if isinstance(x, _REFUSED_SUBCLASSES):
        fix = (
            "x.filled(value): its mask would be ignored"
            if isinstance(x, np.ma.MaskedArray)
            else "np.asarray(x)"
        )
        raise TypeError(f"{name}: expected a plain numpy array, got {_kind(x)} (pass {fix})")
    if isinstance(x, np.ndarray) and x.dtype.hasobject:
        raise TypeError(f"{name}: expected a real (numeric) dtype, got {x.dtype}")


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


def check_dtype_choice(v, name: str, allowed) -> np.dtype:
    """A dtype argument (a dtype, a type or a dtype name) that is one of ``allowed`` -> its
    ``np.dtype``. ``None`` (which ``np.dtype`` reads as float64), a name NumPy does not know
    and a dtype outside ``allowed`` are a ``TypeError`` naming ``name``."""
    expected = f"{name}: expected one of {_dtype_text(allowed)}"
    if v is None:
        raise TypeError(f"{expected}, got None")
    try:
        dt = np.dtype(v)
    except (TypeError, ValueError):
        raise TypeError(f"{expected}, got {_kind(v)} {v!r}") from None
    if not any(dt == np.dtype(a) for a in allowed):
        raise TypeError(f"{expected}, got {dt}")
    return dt


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
    if x.layout != _torch_strided():
        raise TypeError(f"{name}: expected a dense (strided) tensor, got layout {x.layout}")
    if x.device.type == "meta":
        raise ValueError(f"{name}: expected a tensor holding data, got device meta")
    dtype_of(x, name)  # a dtype NumPy can represent, named, before any copy
    if x.device.type != "cpu":
        x = x.detach().to("cpu")
    return to_numpy(x)


def _torch_strided():
    import torch

    return torch.strided


def host_data(x, name: str, *, scalars: bool = False) -> np.ndarray:
    """The data of an array argument of a host helper, as a NumPy array.

    NumPy arrays are returned as they are (never written); with ``scalars=True`` a NumPy scalar
    (``np.float32(1.5)``) is taken as a 0-d array; torch tensors are read as
    :func:`host_array` does (``detach()``, BF16/FP8 through integer views, other devices
    copied to the host). Python lists, tuples, numbers, strings and ``None`` raise
    ``TypeError`` naming the argument.
    """
    if scalars and isinstance(x, np.generic):
        return np.asarray(x)
    return host_array(x, name)


def check_real(x, name: str, *, bool_ok: bool = True) -> np.dtype:
    """``TypeError`` unless ``x`` holds real numbers: a float dtype (bfloat16 and
    float8_e4m3fn included), an integer dtype or (``bool_ok``) bool. Complex, object, string,
    datetime and structured dtypes are refused, so no imaginary part is ever dropped."""
    dt = dtype_of(x, name)
    if dt.kind in ("fiub" if bool_ok else "fiu") or dt in (BF16, FP8_E4M3):
        return dt
    what = "float, integer or bool" if bool_ok else "float or integer"
    raise TypeError(f"{name}: expected a real ({what}) dtype, got {dt}")


def as_array(x, name: str, *, dtype=None, ndim: int | None = None, shape=None, layout=""):
    """:func:`check_array` then :func:`host_array`: the checked input as a host NumPy array."""
    check_array(x, name, dtype=dtype, ndim=ndim, shape=shape, layout=layout)
    return host_array(x, name)


def same_kind(result: np.ndarray, like):
    """``result`` as a torch tensor when ``like`` (the op's first array argument) is one."""
    return to_torch(result) if is_torch_tensor(like) else result


#: ``(mask, pattern)`` on the raw bits: an element is NaN or inf iff ``bits & mask == pattern``
#: (BF16: exponent all ones; FP8 E4M3FN: no inf, NaN is ``S.1111.111``). A SIMD integer test
#: on the bits, where widening the ml_dtypes types first is a slow scalar loop.
_NONFINITE_BITS = {BF16: (np.uint16, 0x7F80, 0x7F80), FP8_E4M3: (np.uint8, 0x7F, 0x7F)}


def _nonfinite_bits(a: np.ndarray, dtype) -> np.ndarray:
    uint, mask, pattern = _NONFINITE_BITS[dtype]
    return (a.view(uint) & uint(mask)) == uint(pattern)


def e4m3_nan_codes(codes: np.ndarray) -> np.ndarray:
    """bool mask of the NaN codes (``S.1111.111``) among host FP8 E4M3FN values or their raw
    ``uint8`` bytes (a test on the bits: nothing is widened)."""
    return _nonfinite_bits(np.asarray(codes), FP8_E4M3)


def check_finite(a: np.ndarray, name: str) -> None:
    """``ValueError`` naming the first NaN / inf element of a host float array (BF16, FP8,
    FP16, FP32, FP64); integer arrays pass."""
    a = np.asarray(a)
    if a.dtype in _NONFINITE_BITS:
        bad = _nonfinite_bits(a, a.dtype)
    elif a.dtype.kind == "f":
        bad = ~np.isfinite(a)
    else:
        return
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name}: expected finite values, got {float(a[idx])!r} at index {list(idx)}"
        )


def check_positive(a: np.ndarray, name: str, what: str = "values") -> None:
    """``ValueError`` naming the first element of host float ``a`` that is not ``> 0`` (NaN
    included): ``"<name>: expected <what> > 0, got <value> at index [...]"``."""
    a = np.asarray(a)
    bad = ~(a > 0)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name}: expected {what} > 0, got {float(a[idx])!r} at index {list(idx)}")


def check_weight_values(w, w_name: str, scale=None, s_name: str = "", *, block: bool = False):
    """The one value rule of a prolog's weight and its scale (the MLA and the indexer prolog):
    every element of ``w`` finite (BF16 / FP32 / FP16: no NaN or inf; FP8 E4M3FN: no NaN code
    ``0x7F`` / ``0xFF``; INT8 codes always pass), ``scale`` (when given) finite, and ``> 0``
    for ``block`` scales (DeepSeek's per-128 x 128 ``weight_scale_inv``; a per-channel INT8
    scale may be 0 for an all-zero channel). Bit tests on host data: a full-size weight is
    read once (docs/numerics.md, "Input policy"). ``ValueError`` naming the first bad entry."""
    check_finite(host_array(w, w_name), w_name)
    if scale is None:
        return
    s = host_array(scale, s_name)
    check_finite(s, s_name)
    if block:
        check_positive(s, s_name, "scales")


def check_int_array(x, name: str, *, ndim: int | None = None, shape=None, layout=""):
    """:func:`check_array` (kind, ``ndim`` / ``shape``), then ``TypeError`` unless the dtype
    is an integer one (bool refused); metadata only. Returns the shape as a tuple of ints."""
    check_array(x, name, ndim=ndim, shape=shape, layout=layout)
    dt = dtype_of(x, name)
    if dt.kind not in "iu":
        raise TypeError(f"{name}: expected an integer dtype, got {dt}")
    return shape_of(x, name)


def host_ints(x, name: str, *, ndim: int | None = None, shape=None, layout="") -> np.ndarray:
    """An integer array's values as a host int64 NumPy array (a copy), checked for range.

    Rejects non-integer dtypes (bool included) and unsigned values above the int64 range, so
    no later cast can wrap a huge value around.
    """
    check_int_array(x, name, ndim=ndim, shape=shape, layout=layout)
    dt = dtype_of(x, name)
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


def raise_at_first(bad: np.ndarray, message: Callable[[int], str]) -> None:
    """``ValueError(message(i))`` for the first flat index ``i`` where bool ``bad`` holds;
    nothing when it holds nowhere."""
    if bad.any():
        raise ValueError(message(int(np.flatnonzero(bad)[0])))


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


def fp32_holds(v: float) -> bool:
    """Whether the real number ``v`` rounds (RNE) to a finite FP32 value that is non-zero
    unless ``v`` is 0: ``|v|`` above half the smallest subnormal and below FP32_MAX plus half
    an ULP."""
    return v == 0 or _FP32_TINY / 2 < abs(v) < _FP32_OVERFLOW


def check_float(v, name: str, *, positive: bool = False, fp32: bool = False) -> float:
    """A real, finite number (not bool) -> ``float``.

    ``positive``: must be > 0. ``fp32``: must stay finite and (unless 0) non-zero when rounded
    to FP32, the dtype the kernels compute in.
    """
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {_kind(v)} {v!r}")
    try:
        f = float(v)
    except OverflowError:  # a Python int (or Fraction) beyond the float64 range
        raise ValueError(f"{name}: expected a finite number, got {v!r}") from None
    if not math.isfinite(f):
        raise ValueError(f"{name}: expected a finite number, got {v!r}")
    if positive and not f > 0:
        raise ValueError(f"{name}: expected a number > 0, got {v!r}")
    if fp32 and not fp32_holds(f):
        raise ValueError(
            f"{name}: expected a value FP32 can hold (|x| in [{_FP32_TINY:.3g}, "
            f"{_FP32_MAX:.4g}]), got {v!r}"
        )
    return f


#: the most elements one array a builder or helper allocates may hold (2**32: 16 GiB of FP32).
#: Checked on Python ints before the allocation, so a huge size is a ``ValueError`` naming the
#: arguments, not a ``MemoryError`` (or a wrapped-around shape) from NumPy.
MAX_ELEMENTS = 2**32


def check_elements(shape, names: str, what: str, limit: int = MAX_ELEMENTS) -> int:
    """``ValueError`` naming ``names`` (the arguments that set ``shape``) when an array of
    ``shape`` (Python ints) would hold more than ``limit`` elements; returns the count."""
    count = math.prod(int(d) for d in shape)
    if count > limit:
        raise ValueError(
            f"{names}: expected at most {limit} elements in {what}, got shape "
            f"{tuple(int(d) for d in shape)} ({count} elements)"
        )
    return count


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


def check_str(v, name: str, *, nonempty: bool = True) -> str:
    """``TypeError`` unless ``v`` is a ``str``; ``ValueError`` when empty (``nonempty``)."""
    if not isinstance(v, str):
        raise TypeError(f"{name}: expected a str, got {_kind(v)} {v!r}")
    if nonempty and not v:
        raise ValueError(f"{name}: expected a non-empty str, got ''")
    return v


def check_int_sequence(v, name: str, *, lo: int | None = None, hi: int | None = None) -> tuple:
    """A list/tuple (or 1-D integer array) of ints, each checked as :func:`check_int` (errors
    name ``name[i]``) -> ``tuple`` of ``int``. A ``str`` is not a sequence here."""
    if isinstance(v, np.ndarray):
        require_array(v, name)  # a masked array's mask must not turn into None entries
        if v.ndim == 1 and v.dtype.kind in "iu":
            v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"{name}: expected a tuple or list of ints, got {_kind(v)} {v!r}")
    return tuple(check_int(x, f"{name}[{i}]", lo=lo, hi=hi) for i, x in enumerate(v))


def check_trace(trace) -> None:
    """``TypeError`` unless ``trace`` is a callable or ``None``."""
    if trace is not None and not callable(trace):
        raise TypeError(f"trace: expected a callable or None, got {_kind(trace)}")


def require_values(args, cls: type, what: str) -> None:
    """``TypeError`` unless ``args`` is a ``cls`` (an op's ``Args``) that its
    ``check_values`` returned (``args.values`` set): ``what`` needs the values read."""
    if not (isinstance(args, cls) and args.values):
        raise TypeError(f"args: {what} needs the Args of check_values, got {type(args).__name__}")


__all__ = [
    "INT32_MAX",
    "MAX_ELEMENTS",
    "as_array",
    "check_array",
    "check_bool",
    "check_choice",
    "check_dtype",
    "check_dtype_choice",
    "check_elements",
    "check_finite",
    "check_float",
    "check_instance",
    "check_int",
    "check_int_array",
    "check_int_sequence",
    "check_ndim",
    "check_pos_int",
    "check_positive",
    "check_range",
    "check_real",
    "check_shape",
    "check_str",
    "check_trace",
    "check_weight_values",
    "dtype_of",
    "e4m3_nan_codes",
    "fp32_holds",
    "host_array",
    "host_data",
    "host_ints",
    "is_array",
    "raise_at_first",
    "require_array",
    "require_values",
    "same_kind",
    "shape_of",
]
