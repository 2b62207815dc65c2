"""The corruptions of the grid: one function per class of bad input of the input policy
(docs/numerics.md).

Each corruption takes the valid value of one argument and its :class:`~badinput.table.Arg`
spec and returns the corrupted value, or ``None`` when the class does not apply to that
argument (e.g. a rank change of a flag). :data:`CLASSES` maps the class name to ``(roles it
applies to, the exception type the policy prescribes, the corruption)``; the prescribed type
follows ``tilesim/shared/validate.py``: a wrong kind, dtype or Python type is a ``TypeError``,
a wrong size, range or value a ``ValueError``.
"""

from __future__ import annotations

import numpy as np

U64_MAX = 2**64 - 1
#: an index that overflows int64 arithmetic once multiplied by a block size
HUGE_INDEX = 2**62


class Skip:
    """Marker: the class does not apply to this argument."""


def _first(a: np.ndarray, value, dtype=None) -> np.ndarray:
    """A copy of ``a`` (cast to ``dtype``) with its first element set to ``value``
    (read-only when :data:`BIG`)."""
    out = np.array(a, dtype=dtype if dtype is not None else a.dtype, copy=True)
    out.reshape(-1)[0] = value
    if out.size >= BIG:
        out.setflags(write=False)
    return out


def _array(v) -> bool:
    return isinstance(v, np.ndarray)


#: the most values of a list / object-array corruption: a larger array gives its leading
#: rows (the kind is what must be refused; a 37M-element list costs minutes to build and snapshot)
LIST_CAP = 1 << 12
#: arrays of at least this many elements (the DeepSeek layer ops' weights: ``w_uq_qr`` holds
#: 37M) get a wrong dtype or a cut shape as zeros (no pass over their data: the dtype and the
#: shape are what must be refused), and every big NumPy corruption is read-only
BIG = 1 << 22
#: read-only arrays of at least this many bytes (the frozen base weights of
#: ``table._frozen``, the big corruptions) are compared by their memory, not their bytes, in
#: the grid's before / after snapshots: nothing can write them in place (a write raises)
FROZEN_BYTES = 1 << 20


def _leading(v: np.ndarray) -> np.ndarray:
    """``v``, or its leading corner of the same rank holding at most :data:`LIST_CAP` values
    (the first axes cut first)."""
    shape = list(v.shape)
    for ax, n in enumerate(shape):
        rest = int(np.prod(shape)) // n if n else 0
        shape[ax] = max(1, min(n, LIST_CAP // max(rest, 1)))
    return v[tuple(slice(0, n) for n in shape)]


def _zeros(shape, dtype) -> np.ndarray:
    out = np.zeros(shape, dtype)
    out.setflags(write=False)
    return out


# ----------------------------------------------------------------------------- any array
def as_list(v, spec):
    return _leading(v).tolist() if _array(v) else Skip


def as_masked(v, spec):
    if not _array(v):
        return Skip
    return np.ma.masked_array(v, mask=(_zeros if v.size >= BIG else np.zeros)(v.shape, bool))


def as_matrix(v, spec):
    if not _array(v) or v.ndim != 2 or v.dtype.kind not in "fiu":
        return Skip
    return v.view(np.matrix)


def as_object(v, spec):
    return _leading(v).astype(object) if _array(v) else Skip


def as_str(v, spec):
    return "0" if _array(v) else Skip


def as_none(v, spec):
    return None if _array(v) and not spec.optional else Skip


def wrong_dtype(v, spec):
    if not _array(v) or spec.bad_dtype is None:
        return Skip
    return _zeros(v.shape, spec.bad_dtype) if v.size >= BIG else v.astype(spec.bad_dtype)


def complex_dtype(v, spec):
    return v.astype(np.float32).astype(np.complex64) if spec.role == "real" else Skip


def wrong_rank(v, spec):
    return v[None] if _array(v) and spec.fixed_rank else Skip


def wrong_shape(v, spec):
    if not _array(v) or not spec.fixed_shape or v.ndim == 0 or v.shape[-1] < 2:
        return Skip
    if v.size >= BIG:
        return _zeros((*v.shape[:-1], v.shape[-1] - 1), v.dtype)
    return np.ascontiguousarray(v[..., :-1])


def torch_wrong_dtype(v, spec):
    """A torch tensor of a dtype the argument does not take (FP64 for BF16 data, ...)."""
    if not _array(v) or spec.bad_dtype is None:
        return Skip
    import torch

    if v.size >= BIG:
        from tilesim.shared.interop import numpy_dtype_to_torch

        return torch.zeros(v.shape, dtype=numpy_dtype_to_torch(np.dtype(spec.bad_dtype)))
    return torch.from_numpy(np.ascontiguousarray(v.astype(spec.bad_dtype)))


def non_finite(v, spec):
    """NaN in an array whose values must be finite (the MSA main-branch mask)."""
    return _first(v, np.nan) if _array(v) else Skip


def non_finite_data(v, spec):
    """NaN (FP8: the NaN code) in float data whose values must be finite (a prolog's
    activations, weights and scales); integer codes cannot hold one."""
    if not _array(v) or not spec.finite or v.dtype.kind in "iub":
        return Skip
    return _first(v, np.nan)


# ----------------------------------------------------------------------------- index/length
def _ints(spec):
    return spec.role in ("index", "length")


def out_of_range(v, spec):
    if not _array(v) or not _ints(spec) or spec.oob is None:
        return Skip
    return _first(v, spec.oob)


def int64_overflow(v, spec):
    return _first(v, HUGE_INDEX, np.int64) if _array(v) and _ints(spec) else Skip


def negative(v, spec):
    """-2 in the argument's own dtype (-1 marks a skipped entry in some index arrays)."""
    return _first(v, -2) if _array(v) and _ints(spec) else Skip


def unsigned_huge(v, spec):
    """An unsigned array whose huge value wraps to -1 in a careless cast."""
    return _first(v, U64_MAX, np.uint64) if _array(v) and _ints(spec) else Skip


def fractional(v, spec):
    if _array(v) and _ints(spec):
        return _first(v, 1.5, np.float64)
    if spec.role == "int":
        return 2.5
    return Skip


def bool_array(v, spec):
    return np.ones(v.shape, bool) if _array(v) and _ints(spec) else Skip


def inconsistent(v, spec):
    """One entry too many (a length array not matching the batch)."""
    if _array(v) and spec.role == "length" and v.ndim == 1:
        return np.concatenate([v, v[-1:]])
    return Skip


# ----------------------------------------------------------------------------- scalars
def fp32_nan(v, spec):
    return float("nan") if spec.role == "scale" else Skip


def fp32_inf(v, spec):
    return float("inf") if spec.role == "scale" else Skip


def fp32_overflow(v, spec):
    return 1e39 if spec.role == "scale" else Skip


def fp32_underflow(v, spec):
    return 1e-46 if spec.role == "scale" else Skip


def bool_as_number(v, spec):
    return True if spec.role in ("int", "scale") else Skip


def str_as_number(v, spec):
    return "4" if spec.role in ("int", "scale", "seq") else Skip


def huge_int(v, spec):
    return 2**40 if spec.role == "int" and spec.huge else Skip


def none_int(v, spec):
    """``None`` for a required int (a ``None`` tile size, count, ...)."""
    return None if spec.role == "int" and not spec.optional else Skip


def strided_torch_out(v, spec):
    """A torch ``out`` of the right shape and dtype that is a non-contiguous view: a kernel
    writes its output rows contiguously, so it must be refused (or written correctly)."""
    if spec.role != "out" or not spec.contiguous or len(getattr(v, "shape", ())) != 2:
        return Skip
    return v.new_zeros(tuple(v.shape[::-1])).t()


def int_for_bool(v, spec):
    return 1 if spec.role == "flag" else Skip


def truthy_str(v, spec):
    return "False" if spec.role == "flag" else Skip


def unknown_mode(v, spec):
    return "bogus" if spec.role == "mode" else Skip


def mode_wrong_type(v, spec):
    return 1 if spec.role == "mode" else Skip


def bad_trace(v, spec):
    return "print" if spec.role == "trace" else Skip


def wrong_object(v, spec):
    """A ``tiling`` / ``dims`` of the wrong type (a dict of its fields)."""
    return {"ntile": 128} if spec.role == "object" else Skip


def seq_entry(v, spec):
    """A sequence of ints with a fractional entry / a bool entry / a string."""
    return (*v[:-1], 2.5) if spec.role == "seq" else Skip


def seq_length(v, spec):
    """One entry too many in a sequence whose length is fixed (MoE ``counts``: one per expert)."""
    return (*v, v[-1]) if spec.role == "seq" and spec.fixed_shape else Skip


def seq_bool(v, spec):
    return (*v[:-1], True) if spec.role == "seq" else Skip


def seq_huge(v, spec):
    return (*v[:-1], 2**62) if spec.role == "seq" and spec.huge else Skip


def nan_float(v, spec):
    """NaN / inf for a plain float argument (a builder's scale, compare's atol)."""
    return float("nan") if spec.role == "float" else Skip


def inf_float(v, spec):
    return float("inf") if spec.role == "float" else Skip


def str_float(v, spec):
    return "0.5" if spec.role == "float" else Skip


def bool_float(v, spec):
    return True if spec.role == "float" else Skip


T, V = TypeError, ValueError
_ARR = ("data", "real", "index", "length", "mask", "out")
_INTS = ("index", "length")
#: class -> (roles, exception, corruption)
CLASSES = {
    "list": (_ARR, T, as_list),
    "masked": (_ARR, T, as_masked),
    "matrix": (_ARR, T, as_matrix),
    "object_dtype": (_ARR, T, as_object),
    "str": (_ARR, T, as_str),
    "none": (_ARR, T, as_none),
    "dtype": (_ARR, T, wrong_dtype),
    "complex": (("real",), T, complex_dtype),
    "rank": (_ARR, V, wrong_rank),
    "shape": (_ARR, V, wrong_shape),
    "torch_dtype": (_ARR, T, torch_wrong_dtype),
    "nonfinite": (("mask",), V, non_finite),
    "nonfinite_data": (("data",), V, non_finite_data),
    "out_of_range": (_INTS, V, out_of_range),
    "int64_overflow": (_INTS, V, int64_overflow),  # TypeError where only INT32 is taken
    "negative": (_INTS, V, negative),
    "unsigned": (_INTS, V, unsigned_huge),  # idem
    "fractional_array": (_INTS, T, fractional),
    "fractional_int": (("int",), T, fractional),
    "bool_array": (_INTS, T, bool_array),
    "inconsistent": (("length",), V, inconsistent),
    "fp32_nan": (("scale",), V, fp32_nan),
    "fp32_inf": (("scale",), V, fp32_inf),
    "fp32_overflow": (("scale",), V, fp32_overflow),
    "fp32_underflow": (("scale",), V, fp32_underflow),
    "bool_as_int": (("int", "scale"), T, bool_as_number),
    "str_as_number": (("int", "scale", "seq"), T, str_as_number),
    "huge_n": (("int",), V, huge_int),
    "none_int": (("int",), T, none_int),
    "strided_torch_out": (("out",), V, strided_torch_out),
    "int_as_bool": (("flag",), T, int_for_bool),
    "truthy_str": (("flag",), T, truthy_str),
    "unknown_mode": (("mode",), V, unknown_mode),
    "mode_type": (("mode",), (T, V), mode_wrong_type),
    "trace_type": (("trace",), T, bad_trace),
    "wrong_object": (("object",), T, wrong_object),
    "seq_fraction": (("seq",), T, seq_entry),
    "seq_bool": (("seq",), T, seq_bool),
    "seq_length": (("seq",), V, seq_length),
    "seq_huge": (("seq",), V, seq_huge),
    "float_nan": (("float",), V, nan_float),
    "float_inf": (("float",), V, inf_float),
    "float_str": (("float",), T, str_float),
    "float_bool": (("float",), T, bool_float),
}


#: classes that change an integer array's dtype: a dtype error where only INT32 is taken
WIDENING = ("int64_overflow", "unsigned")


def expected(cls: str, spec):
    """The exception type(s) the policy prescribes for ``cls`` on ``spec``."""
    exc = CLASSES[cls][1]
    return TypeError if cls in WIDENING and spec.int32_only else exc
