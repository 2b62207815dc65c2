"""The cross-op bad-input grid (docs/numerics.md, "Input policy"; FlashMLA-style parameter grid).

Every class of bad input of the policy (``corrupt.CLASSES``: wrong kind -- list, masked array,
``np.matrix``, object dtype, str, None --, wrong dtype, complex, wrong rank or shape, torch
tensor of a wrong dtype, NaN in a finite-only array, out-of-range / int64-overflowing /
negative / unsigned-huge / fractional / bool index and length arrays, inconsistent lengths,
NaN / inf / overflowing / underflowing FP32 scalars, bools and strings for numbers, huge
``n``, ints and truthy strings for flags, unknown modes, a wrong trace type, wrong config
objects, bad int sequences) is crossed with every argument of every public op, case builder,
host helper and device wrapper it applies to (``table.all_ops``). Each cell asserts:

* the exception type the policy prescribes (``TypeError`` for a wrong kind / dtype / Python
  type, ``ValueError`` for a wrong size / range / value; ``tilesim/shared/validate.py``);
* the message names the argument;
* no work was done: none of the op's work functions (``Op.work``) was entered -- the control
  below proves that the base call does enter them, so this cannot pass vacuously;
* nothing the caller passed (valid arguments and the corrupted one) was modified (bytes,
  dtype, shape and kind compared before and after; a read-only array of at least 1 MiB -- the
  DeepSeek layer ops' frozen weights, a big corruption -- by its memory: a NumPy write into
  it raises).

Device wrappers get NumPy inputs and ``backend="auto"``: a bad input they wrongly accept goes
on to :func:`tilesim.device.backend.resolve`, which refuses NumPy input with a message naming
``backend`` (a failure here, and a work marker hit), and never builds a kernel.

Controls: each reference op, builder and helper runs its uncorrupted base call (and enters its
work functions); each device wrapper with a shape-only mode accepts the base inputs as
``meta`` tensors (``device.mla_prolog`` and ``device.dsa_attention_step`` have none: their
value checks read ``slot_mapping`` / ``seq_lens`` on the host). Equivalences (positive
classes): torch tensors (BF16 with ``requires_grad``, FP8, ints) and non-contiguous views give
the same bits as the NumPy base call.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from contextlib import contextmanager
from functools import cache

import numpy as np
import pytest

from badinput import corrupt, table
from badinput.corrupt import CLASSES, Skip

OPS = {op.name: op for op in table.all_ops()}
ARRAY_ROLES = ("data", "real", "index", "length", "mask", "out")


# ----------------------------------------------------------------------------- helpers
def _get(kw: dict, key: str):
    name, _, item = key.partition(".")
    v = kw.get(name)
    return v[int(item)] if item else v


def _set(kw: dict, key: str, value) -> None:
    name, _, item = key.partition(".")
    if item:
        seq = list(kw[name])
        seq[int(item)] = value
        kw[name] = tuple(seq)
    else:
        kw[name] = value


def _canon(v, frozen: bool = False):
    """A comparable snapshot of a value: arrays by kind, dtype, shape and bytes. ``frozen``
    (the snapshots of the caller's arguments): a read-only NumPy array of at least
    ``corrupt.FROZEN_BYTES`` (a frozen base weight, a big corruption) by its memory instead of
    its bytes -- nothing writes it in place (a write raises)."""
    if isinstance(v, np.ndarray):
        kind = type(v).__name__
        ma = isinstance(v, np.ma.MaskedArray)
        mask = _body(np.ma.getmaskarray(v), frozen) if ma else b""
        base = np.asarray(v)
        return (kind, base.dtype.str, base.shape, _body(base, frozen), mask)
    if type(v).__module__.startswith("torch"):
        t = v.detach()
        if frozen and t.numel() >= corrupt.BIG:
            return ("torch", str(t.dtype), tuple(t.shape), _torch_zeros(t))
        return ("torch", str(t.dtype), tuple(t.shape), _torch_bits(t))
    if isinstance(v, dict):
        return tuple(sorted((k, _canon(x, frozen)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_canon(x, frozen) for x in v))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return (type(v).__name__, _canon({f.name: getattr(v, f.name) for f in
                                          dataclasses.fields(v)}, frozen))  # fmt: skip
    if hasattr(v, "_asdict"):
        return (type(v).__name__, _canon(v._asdict(), frozen))
    if isinstance(v, float) and v != v:
        return "nan"
    return repr(v)


def _body(a: np.ndarray, frozen: bool):
    if frozen and not a.flags.writeable and a.nbytes >= corrupt.FROZEN_BYTES:
        return ("read-only", a.__array_interface__["data"][0], a.strides)
    return a.tolist() if a.dtype == object else np.ascontiguousarray(a).tobytes()


def _snapshot(kw: dict):
    """The caller's arguments as :func:`_canon` compares them before and after a call."""
    return _canon(kw, frozen=True)


def _torch_zeros(t):
    """A big torch tensor of the caller's arguments: a tensor of zero bits (the big
    ``torch_dtype`` corruptions, ``corrupt.BIG``) by its memory -- it is unmodified exactly
    while every bit stays 0 --, any other by its bits."""
    import torch

    iv = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    if t.dtype != torch.bool and not t.view(iv).count_nonzero():
        return ("zeros", t.data_ptr(), t.stride())
    return _torch_bits(t)


def _torch_bits(t):
    import torch

    if t.dtype == torch.bool:
        return t.cpu().tolist()
    iv = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(iv).cpu().numpy().tobytes()


def _fresh(op) -> dict:
    """A deep copy of the op's base call; read-only arrays (the frozen weights) are shared."""
    base = op.base()
    frozen = {id(v): v for v in base.values() if type(v) is np.ndarray and not v.flags.writeable}
    return copy.deepcopy(base, frozen)


@contextmanager
def entered(markers):
    """Records every call of a function named in ``markers`` (``(path suffix, name)``)."""
    hits: list[str] = []

    def prof(frame, event, arg):
        if event == "call":
            co = frame.f_code
            for suffix, name in markers:
                if co.co_name == name and co.co_filename.replace("\\", "/").endswith(suffix):
                    hits.append(f"{suffix}:{name}")

    old = sys.getprofile()
    sys.setprofile(prof)
    try:
        yield hits
    finally:
        sys.setprofile(old)


def _applies(cls: str, v, spec) -> bool:
    roles, _, fn = CLASSES[cls]
    if spec.role not in roles:
        return False
    if cls == "torch_dtype":  # built at run time (torch may be missing at collection)
        return isinstance(v, np.ndarray) and spec.bad_dtype is not None
    return fn(v, spec) is not Skip


def _marks(op):
    return [pytest.mark.torch] if op.device else []


#: holes the grid found that are not fixed yet: ``xfail(strict=True)``, so a fix turns them
#: into XPASS failures and the entry must go. Key: (op without "device.", arg, class).
KNOWN_HOLES: dict[tuple[str, str, str], str] = {}
#: holes whose cell is not run: it asks NumPy for terabytes (a MemoryError here; on a host
#: that always overcommits, an OOM kill of the worker). Key and meaning as KNOWN_HOLES.
UNSAFE_HOLES: dict[tuple[str, str, str], str] = {}


def _grid():
    for op in OPS.values():
        base = op.base()
        for key, spec in op.args.items():
            v = _get(base, key)
            for cls in CLASSES:
                if _applies(cls, v, spec):
                    marks = _marks(op) + ([pytest.mark.torch] if cls == "torch_dtype" else [])
                    where = (op.name.removeprefix("device."), key, cls)
                    if where in KNOWN_HOLES:
                        marks.append(pytest.mark.xfail(reason=KNOWN_HOLES[where], strict=True))
                    if where in UNSAFE_HOLES:
                        marks.append(pytest.mark.skip(reason=f"unsafe: {UNSAFE_HOLES[where]}"))
                    yield pytest.param(op.name, key, cls, id=f"{op.name}-{key}-{cls}",
                                       marks=marks)  # fmt: skip


GRID = list(_grid())


# ----------------------------------------------------------------------------- the grid
@pytest.mark.parametrize("op_name, key, cls", GRID)
def test_bad_input_rejected(op_name, key, cls):
    op, fn = OPS[op_name], CLASSES[cls][2]
    spec = op.args[key]
    exc = corrupt.expected(cls, spec)
    kw = _fresh(op)
    bad = fn(_get(kw, key), spec)
    _set(kw, key, bad)
    before = _snapshot(kw)
    # the back end and the SoC are checked in resolve() itself
    work = [m for m in op.work if key not in ("backend", "soc") or m[1] != "resolve"]
    with entered(work) as hits, pytest.raises((TypeError, ValueError)) as info:
        op.fn(**kw)
    msg = str(info.value)
    assert isinstance(info.value, exc), f"{type(info.value).__name__} (expected {exc}): {msg}"
    assert any(n in msg for n in spec.names), f"message names none of {spec.names}: {msg}"
    assert not hits, f"work done before the error: {hits}"
    assert _snapshot(kw) == before, "an argument was modified"


def test_grid_covers_every_class_and_op():
    """Every class of bad input has cells, and every op has at least 2 cells."""
    classes = {p.values[2] for p in GRID}
    assert classes == set(CLASSES)
    per_op = {name: sum(p.values[0] == name for p in GRID) for name in OPS}
    assert min(per_op.values()) >= 2, per_op


# ----------------------------------------------------------------------------- controls
HOST_OPS = [op.name for op in OPS.values() if not op.device]
DEVICE_OPS = [pytest.param(op.name, marks=pytest.mark.torch) for op in OPS.values() if op.device]


@cache
def _base_result(op_name):
    op = OPS[op_name]
    return _canon(_to_numpy(op.fn(**_fresh(op))))


def _to_numpy(v):
    if type(v).__module__.startswith("torch"):
        from tilesim.shared.interop import to_numpy

        return to_numpy(v.detach())
    if hasattr(v, "_asdict"):  # a named tuple of results
        return type(v)(*(_to_numpy(x) for x in v))
    if isinstance(v, (list, tuple)):
        return type(v)(_to_numpy(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_numpy(x) for k, x in v.items()}
    return v


@pytest.mark.parametrize("op_name", HOST_OPS)
def test_base_call_succeeds(op_name):
    """The uncorrupted call works, enters the op's work functions and modifies nothing."""
    op = OPS[op_name]
    kw = _fresh(op)
    inputs = lambda: _snapshot({k: v for k, v in kw.items() if k != "out"})  # noqa: E731
    before = inputs()
    with entered(op.work) as hits:
        result = op.fn(**kw)
    assert result is not None
    assert inputs() == before, "an input was modified (``out`` excepted: it is the output)"
    if op.work:
        assert hits, f"none of the work markers {op.work} was entered"


def _meta(v):
    import torch
    from tilesim.shared.interop import numpy_dtype_to_torch

    if isinstance(v, np.ndarray):
        return torch.empty(v.shape, dtype=numpy_dtype_to_torch(v.dtype), device="meta")
    if isinstance(v, tuple):
        return tuple(_meta(x) for x in v)
    if isinstance(v, torch.Tensor):
        return torch.empty_like(v, device="meta")
    return v


@pytest.mark.parametrize("op_name", DEVICE_OPS)
def test_device_base_inputs_pass_the_checks(op_name):
    """Shape-only mode: the base inputs as ``meta`` tensors pass every entry check and give
    an empty output on the meta device (no data read, no kernel)."""
    pytest.importorskip("torch")
    op = OPS[op_name]
    if not op.meta:
        pytest.skip(
            f"{op.name} has no shape-only mode (not graph_safe: its value checks read "
            "slot_mapping / seq_lens on the host, validate=False goes on to resolve)"
        )
    kw = {k: _meta(v) for k, v in _fresh(op).items()}
    if "out" in kw and op.name.endswith("moe_grouped_gemm"):
        kw["out"] = None
    with entered(op.work) as hits:
        out = op.fn(**kw)
    out = out[0] if isinstance(out, tuple) else out
    assert out.device.type == "meta"
    assert not hits


# ----------------------------------------------------------------------------- equivalences
def _array_args(roles=ARRAY_ROLES):
    for op in OPS.values():
        if op.device or not op.full:
            continue
        base = op.base()
        for key, spec in op.args.items():
            if spec.role in roles and isinstance(_get(base, key), np.ndarray):
                yield pytest.param(op.name, key, id=f"{op.name}-{key}")


def _as_torch(v: np.ndarray):
    from tilesim.shared.interop import to_torch

    t = to_torch(np.ascontiguousarray(v))
    if t.dtype.is_floating_point and t.element_size() > 1:
        t = t.clone().requires_grad_(True)
    return t


@pytest.mark.torch
@pytest.mark.parametrize("op_name, key", list(_array_args(("data", "real", "index", "length",
                                                           "mask"))))  # fmt: skip
def test_torch_tensor_gives_the_numpy_bits(op_name, key):
    """A torch tensor (BF16/FP32 with ``requires_grad``, FP8, ints) where NumPy data is read:
    accepted, and the same bits as the NumPy call."""
    pytest.importorskip("torch")
    op = OPS[op_name]
    kw = _fresh(op)
    _set(kw, key, _as_torch(_get(kw, key)))
    assert _canon(_to_numpy(op.fn(**kw))) == _base_result(op_name)


def _strided(v: np.ndarray) -> np.ndarray:
    """The same values as a non-contiguous view."""
    view = np.stack([v, v], axis=-1)[..., 0]
    assert not view.flags.c_contiguous or v.size <= 1
    return view


@pytest.mark.parametrize("op_name, key", list(_array_args()))
def test_non_contiguous_view_gives_the_same_bits(op_name, key):
    op = OPS[op_name]
    kw = _fresh(op)
    _set(kw, key, _strided(_get(kw, key)))
    assert _canon(_to_numpy(_flat_out(op.fn(**kw)))) == _canon(
        _to_numpy(_flat_out(op.fn(**_fresh(op))))
    )


def _flat_out(v):
    """Results compared by value (a strided ``out`` is returned as itself)."""
    return np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v


def test_huge_index_constant():
    assert corrupt.HUGE_INDEX * table.DSA_BS > np.iinfo(np.int64).max
