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

Importing this module needs neither torch nor pypto.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tilesim.device._lazy import require, require_pypto, require_torch
from tilesim.shared.interop import is_torch_tensor, to_numpy, to_torch
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


__all__ = [
    "ARCH_950",
    "BACKENDS",
    "DEFAULT_SOC",
    "Target",
    "finish",
    "launch",
    "npu_soc",
    "resolve",
    "to_tensors",
]
