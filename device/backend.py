"""The one device back end of every kernel wrapper: where a kernel runs and how it is called.

A wrapper does, in this order (each step here, once):

1. :func:`resolve` — the back end and SoC of the call. ``backend="auto"`` picks ``"npu"`` when
   the wrapper's first array argument is a tensor on an NPU, else raises a ``ValueError``
   naming both options; ``"npu"`` needs torch_npu and reads the SoC from the host's pypto
   (``DAV_3510`` -> ``"950"``, else ``"910b"``); ``"sim"`` keeps the ``soc`` argument and
   configures this process for it (:func:`tilesim.device.sim.configure`) before pypto is
   imported, since PyPTO 0.2.0 fixes its compile target at import.
2. :func:`to_tensors` — the input policy shared with the references
   (:mod:`tilesim.shared.validate`): NumPy arrays or torch tensors in; NumPy inputs become CPU
   tensors (zero-copy views, simulator only); the output is of the same kind as the first
   array argument (:func:`finish`).
3. :func:`launch` — run a built kernel: on the simulator every argument is passed as a
   private copy (PyPTO's host interpreter writes all arguments back), and the outputs are
   copied into the caller's output tensors; on the NPU the tensors go to the kernel as they
   are. Returns the cost model's AICore time in µs (simulator) or ``None`` (NPU).
4. :func:`finish` — the ``(out, cost_us)`` convention: the simulator returns the pair, the NPU
   the output alone.

And, for every kernel, written once here:

* **the compile registry** — :func:`compiled` (or the :func:`compile_once` decorator on a
  ``build_kernel(*key)`` factory) builds a kernel once per ``(name, key, SoC)`` and counts
  it; :func:`compile_stats` / :func:`reset_compile_stats` (public as
  ``tilesim.device.compile_stats``) report {kernel name: distinct compiled variants}. A
  key holds only model constants, tiles, dtypes and options (the SoC is added here);
  sequence lengths, ``nb`` and batch are runtime values of the kernels (dynamic axes).
* **the value checks** — :func:`value_checks`, the one ``validate=`` policy of every wrapper
  over the checks each op's record names (:class:`~tilesim.shared.registry.op_record.OpRecord`: its
  ``int_checks`` of the small integer inputs the kernel's contract reads on the host anyway,
  run by ``validate=True``, the default, and its ``scan_checks`` of caches, weights,
  activations and masks, run by ``validate="full"`` too); ``validate=False`` checks
  metadata only.
* **torch.compile** — :func:`graph_safe` marks a wrapper for ``torch._dynamo.allow_in_graph``
  (registered at once when dynamo is loaded, else by :func:`allow_in_graph`), and
  :func:`is_shape_only` / :func:`standin` let a wrapper answer FakeTensor or ``meta`` inputs
  with correctly shaped outputs without reading any data.

Importing this module needs neither torch nor pypto.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tilesim.device._lazy import require, require_pypto, require_torch
from tilesim.device._pypto_common import jit_options
from tilesim.shared.interop import is_torch_tensor, to_numpy, to_torch
from tilesim.shared.registry.op_record import OpRecord
from tilesim.shared.soc import DEFAULT_SOC, SIM_SOCS
from tilesim.shared.validate import check_choice

BACKENDS = ("auto", "npu", "sim")
#: pypto's ``platform.npuarch`` of the 950 (every other arch is treated as the 910B)
ARCH_950 = "DAV_3510"


@dataclass(frozen=True)
class Target:
    """Where one call runs: ``backend`` ``"npu"`` or ``"sim"``, ``soc`` ``"910b"`` / ``"950"``,
    and whether the caller passed NumPy arrays (the output is then NumPy too)."""

    backend: str
    soc: str
    numpy_io: bool

    @property
    def sim(self) -> bool:
        return self.backend == "sim"


def npu_soc() -> str:
    """The SoC the host's pypto compiles for (``"950"`` or ``"910b"``)."""
    return "950" if require_pypto().platform.npuarch == ARCH_950 else "910b"


def _device_type(x) -> str:
    return x.device.type if is_torch_tensor(x) else "cpu"


def resolve(backend: str, soc: str, like, *, configure: bool = True) -> Target:
    """Check ``backend`` / ``soc`` against the wrapper's first array argument ``like``.

    ``configure``: on the simulator, configure this process for ``soc`` now (do it before the
    kernel is built). Raises ``ValueError`` naming the argument for every mismatch.
    """
    check_choice(backend, "backend", BACKENDS)
    check_choice(soc, "soc", SIM_SOCS)
    where = _device_type(like)
    if backend == "auto":
        if where != "npu":
            raise ValueError(
                f"backend: the inputs are on {where!r}; pass NPU tensors (torch_npu) or "
                "backend='sim' to run PyPTO's CPU simulator"
            )
        backend = "npu"
    numpy_io = isinstance(like, np.ndarray)
    if backend == "npu":
        if where != "npu":
            raise ValueError(f"backend='npu': expected torch tensors on an NPU, got {where!r}")
        require("torch_npu")
        return Target("npu", npu_soc(), False)
    if where != "cpu":
        raise ValueError(f"backend='sim': expected CPU tensors or NumPy arrays, got {where!r}")
    if configure:
        from tilesim.device import sim

        sim.configure(soc)
    return Target("sim", soc, numpy_io)


def to_tensors(*arrays):
    """Each argument as a torch tensor: tensors as they are, NumPy arrays as CPU tensors
    sharing their memory (:func:`tilesim.shared.interop.to_torch`), ``None`` kept."""
    require_torch()
    return tuple(a if a is None or is_torch_tensor(a) else to_torch(np.asarray(a)) for a in arrays)


def launch(kernel, args: list, outputs: list, target: Target) -> float | None:
    """Run ``kernel(*args, *outputs)``; returns the cost-model µs (simulator) or ``None``.

    ``args``: input tensors, never written. ``outputs``: the tensors the kernel writes; on the
    simulator the kernel writes private copies, copied back into ``outputs`` afterwards.
    """
    if not target.sim:
        kernel(*args, *outputs)
        return None
    from tilesim.device import sim

    ins = [t.detach().contiguous().clone() for t in args]
    outs = [t.detach().contiguous().clone() for t in outputs]
    run = sim.run_kernel(kernel, [*ins, *outs])
    for dst, src in zip(outputs, outs, strict=True):
        dst.copy_(src)
    return run.us


def finish(out, cost_us: float | None, target: Target):
    """The wrapper's return value: ``(out, cost_us)`` on the simulator, ``out`` on the NPU;
    ``out`` becomes a NumPy array when the caller passed NumPy arrays."""
    if target.numpy_io:
        out = to_numpy(out).copy()
    return (out, 0.0 if cost_us is None else cost_us) if target.sim else out


# ----------------------------------------------------------------------------- value checks
#: the ``validate=`` choices of every wrapper: ``True`` (default) metadata and the small
#: integer inputs, ``"full"`` every value check of the golden, ``False`` metadata only
VALIDATE = (True, False, "full")


def validate_level(validate) -> str:
    """``"meta"`` (``validate=False``), ``"ints"`` (``True``, the default) or ``"full"``;
    ``TypeError`` naming ``validate`` for anything else (an int, another string)."""
    if isinstance(validate, (bool, np.bool_)):
        return "ints" if validate else "meta"
    if isinstance(validate, str) and validate == "full":
        return "full"
    raise TypeError(
        f"validate: expected a bool or 'full' (True: metadata and the small integer inputs; "
        f"'full': every value check; False: metadata only), got {type(validate).__name__} "
        f"{validate!r}"
    )


def value_checks(record: OpRecord, args, validate, *, shape_only: bool = False):
    """The value checks of the op of ``record`` that ``validate`` asks for
    (:meth:`~tilesim.shared.registry.op_record.OpRecord.value_checks` at :func:`validate_level`), on
    the contract's checked ``args``; returns the contract's ``args`` after them. Shape-only
    inputs (:func:`is_shape_only`) and ``validate=False`` read nothing."""
    level = validate_level(validate)
    if shape_only:
        return args
    return record.value_checks(args, level)


# ----------------------------------------------------------------------------- compile registry
_KERNELS: dict[tuple, object] = {}  # (name, key, arch) -> built kernel
_BUILDS: dict[str, int] = {}  # name -> kernels built since the last reset


def _check_key(key, name: str) -> tuple:
    """A compile key: a tuple of hashable constants (numbers, strings, tuples of them)."""
    if not isinstance(key, tuple):
        raise TypeError(f"{name}: expected the compile key as a tuple, got {type(key).__name__}")
    try:
        hash(key)
    except TypeError as e:
        raise TypeError(f"{name}: expected a hashable compile key, got {key!r}") from e
    return key


def compiled(name: str, key: tuple, build: Callable[[], object]):
    """The kernel ``name`` for ``key`` on this process's target, built by ``build()`` once.

    ``key`` holds what the kernel is specialised on -- model constants, tiles, dtypes,
    options -- never a runtime size (sequence length, ``nb``, batch: dynamic axes of the
    kernel). The target's arch (``pypto.platform.npuarch``) is added to the key here. Every
    build is counted under ``name`` (:func:`compile_stats`).
    """
    key = _check_key(key, name)
    full = (name, key, require_pypto().platform.npuarch)
    kernel = _KERNELS.get(full)
    if kernel is None:
        kernel = build()
        _KERNELS[full] = kernel
        _BUILDS[name] = _BUILDS.get(name, 0) + 1
    return kernel


def compiled_jit(
    name: str, key: tuple, jit: tuple, source: Callable[[], object], *, ready_on_host: tuple
):
    """:func:`compiled` for a PyPTO kernel: ``pypto.frontend.jit`` with the options of the
    spec ``jit`` (:func:`tilesim.device._pypto_common.jit_options`, ``ready_on_host``: the
    tensors the kernel's control flow reads on the host) applied to ``source()`` (the kernel
    function, built only on a miss), once per ``(*key, jit)`` on this process's target."""
    return compiled(
        name, (*_check_key(key, name), jit),
        lambda: require_pypto().frontend.jit(**jit_options(jit, ready_on_host=ready_on_host))(
            source()),
    )  # fmt: skip


def compile_once(name: str):
    """Decorator form of :func:`compiled` for a factory ``build_kernel(*key)``: each distinct
    positional argument tuple is built once (keyword arguments are refused)."""

    def wrap(factory):
        def build_kernel(*key):
            return compiled(name, key, lambda: factory(*key))

        build_kernel.__name__ = factory.__name__
        build_kernel.__qualname__ = factory.__qualname__
        build_kernel.__doc__ = factory.__doc__
        build_kernel.__wrapped__ = factory
        return build_kernel

    return wrap


def compile_stats() -> dict[str, int]:
    """{kernel name: distinct compiled variants} since the process started or the last
    :func:`reset_compile_stats` (kernel names: ``docs/device.md``, "Compiled once per model
    configuration")."""
    return dict(sorted(_BUILDS.items()))


def reset_compile_stats() -> None:
    """Forget every built kernel and zero the counts (the next call of each builds anew)."""
    _KERNELS.clear()
    _BUILDS.clear()


# ----------------------------------------------------------------------------- torch.compile
_GRAPH_SAFE: list = []  # wrappers to hand to torch._dynamo.allow_in_graph


def _register(fn) -> None:
    import torch._dynamo  # noqa: PLC0415 -- only when dynamo is (being) used

    torch._dynamo.allow_in_graph(fn)


def graph_safe(fn):
    """Mark a wrapper as ``allow_in_graph``-safe: torch.compile then puts the call into the
    graph as it is, and traces it with FakeTensors (the wrapper answers those through
    :func:`is_shape_only`). Registered with dynamo at once when ``torch._dynamo`` is already
    imported (importing it costs seconds, so it is never imported for this), else by
    :func:`allow_in_graph`."""
    _GRAPH_SAFE.append(fn)
    if "torch._dynamo" in sys.modules:
        _register(fn)
    return fn


def allow_in_graph() -> list[str]:
    """Register every wrapper marked :func:`graph_safe` with ``torch._dynamo.allow_in_graph``
    (imports dynamo; the wrappers are loaded with :mod:`tilesim.device`, this module's
    package); returns their names. Needed only when dynamo was not yet imported when the
    wrappers were."""
    for fn in _GRAPH_SAFE:
        _register(fn)
    return sorted({fn.__name__ for fn in _GRAPH_SAFE})


def is_shape_only(*arrays, names: tuple[str, ...] | None = None) -> bool:
    """True when any argument is a tensor without data to read: a FakeTensor (torch.compile's
    tracing) or a ``meta`` tensor. A wrapper then checks metadata only and returns empty
    outputs of the right shape, dtype and device (no kernel, no host copy), made like its first
    array argument. ``names`` (the arguments' names, first = the one the outputs follow): then
    a first argument that is not a torch tensor is a ``TypeError`` naming both."""
    if not any(is_torch_tensor(a) for a in arrays):
        return False
    from torch._subclasses.fake_tensor import is_fake  # noqa: PLC0415 -- torch is loaded

    hollow = [is_torch_tensor(a) and (a.device.type == "meta" or is_fake(a)) for a in arrays]
    if any(hollow) and names is not None and not is_torch_tensor(arrays[0]):
        which = names[hollow.index(True)]
        raise TypeError(
            f"{names[0]}: expected a torch tensor (a meta / FakeTensor {which} makes this a "
            f"shape-only call, whose outputs are empty tensors like {names[0]}), got "
            f"{type(arrays[0]).__name__}"
        )
    return any(hollow)


def standin(x, fill=None):
    """A host NumPy array with the shape and dtype of ``x`` (no data read) to give a value
    check when the data cannot or should not be read (:func:`is_shape_only`,
    ``validate=False``). ``fill``: ``None`` zeros, or a function ``shape -> array`` of values
    the check accepts."""
    from tilesim.shared.validate import dtype_of, shape_of

    shape, dt = shape_of(x, "x"), dtype_of(x, "x")
    return (np.zeros(shape, dt) if fill is None else np.asarray(fill(shape))).astype(dt)


__all__ = [
    "ARCH_950",
    "BACKENDS",
    "DEFAULT_SOC",
    "VALIDATE",
    "Target",
    "allow_in_graph",
    "compile_once",
    "compile_stats",
    "compiled",
    "compiled_jit",
    "finish",
    "graph_safe",
    "is_shape_only",
    "launch",
    "npu_soc",
    "reset_compile_stats",
    "resolve",
    "standin",
    "to_tensors",
    "validate_level",
    "value_checks",
]
