"""Running a ``@pypto.frontend.jit`` kernel on CPU torch tensors (:mod:`tilesim.device.sim`).

:func:`run_kernel` compiles, interprets with the real inputs, writes the results back INTO the
tensors (every argument is an in/out buffer) and returns the cost model's simulated AICore time;
:func:`run_cost` costs without interpreting, :func:`run_compile` only compiles. The calls
configure the process for the default SoC if needed (:mod:`tilesim.device.sim.process`) and run
libtorch on one thread (docs/device.md, "A deterministic interpreter").
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from tilesim.device._lazy import require_pypto, require_torch
from tilesim.device.sim.cost_output import (
    drop_output,
    root_tasks,
    swim_us,
    total_cycles,
)
from tilesim.device.sim.errors import SimError
from tilesim.device.sim.patches import NEXT_CALL
from tilesim.device.sim.process import configure, current_soc

#: the call mode :func:`cost_only` and :func:`record_roots` set for the calls inside them
_MODE = {"cost_only": False, "roots": None}


@dataclass(frozen=True)
class SimRun:
    """What one :func:`run_kernel` call measured.

    ``us``: cost-model AICore end-to-end time (max task end - min task start over AIC/AIV cores,
    cycles / 1800), ``None`` when the cost model was not run. ``cycles``: the whole machine
    model's total cycles incl. AICPU scheduling (``None`` if absent). ``seconds``: wall time.
    """

    soc: str
    us: float | None
    cycles: int | None
    seconds: float


def _check_args(args) -> None:
    """Every argument a contiguous CPU torch tensor (``TypeError`` / ``ValueError`` naming it)."""
    torch = require_torch()
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"args[{i}]: expected a torch.Tensor, got {type(a).__name__}")
        if a.device.type != "cpu":
            raise ValueError(f"args[{i}]: expected a CPU tensor for the simulator, got {a.device}")
        if not a.is_contiguous():
            raise ValueError(f"args[{i}]: expected a contiguous tensor")


def run_kernel(kernel, args, *, costmodel: bool = True, pass_filter=(), **params) -> SimRun:
    """Compile ``kernel`` on CPU, interpret it on ``args`` IN PLACE, optionally run the cost model.

    kernel      a ``@pypto.frontend.jit`` function defined in a ``.py`` file (the frontend
                re-reads its source); ``params`` are its non-tensor parameters.
    args        CPU torch tensors in signature order. Every one is an in/out buffer: after the
                call each holds the interpreter's final value; regions the kernel never
                writes keep what the caller put there.
    costmodel   also run the cost model (needed for the in-place read-back too: the results
                come back through its final copy). ``False`` = compile + interpret only, and
                the arguments are NOT updated -- use it to check that a kernel compiles.
    pass_filter ``()``: interpret the tensor graph only; ``["all"]``: also re-interpret after
                every compiler pass and compare (slow, superlinear in loop trips).

    Inside a :func:`cost_only` block (and with ``costmodel``) it is :func:`run_cost` instead:
    no interpretation, the arguments keep what the caller put there.

    Returns a :class:`SimRun`. Configures the process for the default SoC if needed.
    """
    if _MODE["cost_only"] and costmodel:
        return run_cost(kernel, args, **params)
    pypto_impl = _prepare(
        args,
        costmodel,
        enable_pass_verify=True,
        pass_verify_save_tensor=False,
        pass_verify_pass_filter=list(pass_filter),
    )
    require_pypto().set_verify_golden_data(goldens=[None] * len(args))
    seconds = _call(kernel, args, params)
    return _collect(pypto_impl, costmodel, seconds)


def run_cost(kernel, args, **params) -> SimRun:
    """Compile ``kernel`` and run the cost model on ``args`` WITHOUT the host interpreter.

    Same call and result as :func:`run_kernel`, but the tensor graph is never interpreted
    (``enable_pass_verify=False``), so the outputs are NOT computed: every argument keeps what
    the caller put there. The cost model only needs the compiled program and the inputs: PyPTO
    0.2.0's ``CostModelRunOnceDataFromHost`` runs the device control flow (loop trip counts,
    scalars read from input tensors) on the caller's tensors and charges each leaf task its
    modelled time -- it never reads a value the interpreter would have produced. So the µs
    equal :func:`run_kernel`'s for the same kernel and arguments (tested on a small case),
    at the cost of compile + cost model only: what makes shapes too big to interpret
    costable. A kernel whose control flow read a tensor the kernel itself writes would see
    the caller's values there, not computed ones.
    """
    pypto_impl = _prepare(args, True, enable_pass_verify=False)
    seconds = _call(kernel, args, params)
    return _collect(pypto_impl, True, seconds)


@contextlib.contextmanager
def cost_only():
    """Within the block, :func:`run_kernel` (and so every wrapper's ``backend="sim"`` call)
    runs :func:`run_cost`: the cost model's µs without interpreting -- the wrapper's output is
    NOT computed (it holds whatever its buffer held). For costing shapes too big to interpret
    through the wrappers' own argument building. Not re-entrant across threads."""
    before = _MODE["cost_only"]
    _MODE["cost_only"] = True
    try:
        yield
    finally:
        _MODE["cost_only"] = before


@contextlib.contextmanager
def record_roots():
    """Within the block, every kernel call that runs the cost model (:func:`run_kernel`,
    :func:`run_cost`, so every wrapper's ``backend="sim"`` call) appends to the yielded list
    ``{root function: leaf tasks}`` of the root functions its device control flow RAN on the
    call's inputs (:func:`tilesim.device.sim.cost_output.root_tasks`): which loop bodies and
    unroll chunks a runtime length took, not which were compiled. Not re-entrant across
    threads."""
    before, _MODE["roots"] = _MODE["roots"], []
    try:
        yield _MODE["roots"]
    finally:
        _MODE["roots"] = before


def _collect(pypto_impl, costmodel: bool, seconds: float) -> SimRun:
    """The :class:`SimRun` of the call just made (read from PyPTO's output folder, then
    dropped)."""
    top = Path(pypto_impl.LogTopFolder())
    sim_dir = top / "CostModelSimulationOutput"
    us = swim_us(sim_dir) if costmodel else None
    cycles = total_cycles(sim_dir) if costmodel else None
    if costmodel and us is None:
        raise SimError(f"cost model wrote no {sim_dir}/_simulate.swim.json")
    if costmodel and _MODE["roots"] is not None:
        _MODE["roots"].append(root_tasks(top))
    drop_output(top)
    return SimRun(soc=current_soc(), us=us, cycles=cycles, seconds=seconds)


def run_compile(kernel, args, **params) -> float:
    """Compile only (tensor graph -> passes -> host control-flow code); returns seconds."""
    pypto_impl = _prepare(args, False, enable_pass_verify=False)
    seconds = _call(kernel, args, params)
    drop_output(Path(pypto_impl.LogTopFolder()))
    return seconds


def _prepare(args, costmodel: bool, **verify):
    """Configure the process, check ``args``, set PyPTO's verify options; returns pypto_impl."""
    configure()
    _check_args(args)
    pypto = require_pypto()
    from pypto import pypto_impl

    pypto.set_verify_options(**verify)
    NEXT_CALL["costmodel"] = costmodel
    return pypto_impl


@contextlib.contextmanager
def _pinned_threads():
    """libtorch on one thread for the duration of a kernel call (restored after), so that a
    process that did not start through :func:`tilesim.device.sim.isolated` interprets with the
    same reduction order as one that did."""
    torch = require_torch()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _call(kernel, args, params: dict) -> float:
    """``kernel(*args, **params)`` with PyPTO's errors as :class:`SimError`, libtorch pinned to
    one thread; returns seconds."""
    t0 = time.perf_counter()
    try:
        with _pinned_threads():
            kernel(*args, **params)
    except Exception as e:
        raise SimError(f"{getattr(kernel, '__name__', kernel)}: {type(e).__name__}: {e}") from e
    return time.perf_counter() - t0
