"""tilesim.device.sim — run a PyPTO 0.2.0 kernel on a CPU: compile, interpret, read back, cost.

The CPU ("sim") machinery every kernel test uses. The recipe and the reasons behind each piece
are written up in ``docs/device.md`` and ``docs/sources.md`` ("PyPTO 0.2.0 on a CPU"); what it
patches is PyPTO 0.2.0's own code (the ``pypto==0.2.0`` package of ``hicann/pypto``:
``pypto/frontend/parser/entry.py``, ``pypto/lib/calculator/src/``, ``pypto/lib/configs/``).

One module per job, in the order a kernel call meets them:

=====================  ==================================================================
``process``            :func:`configure` prepares THIS process for one SoC before pypto is
                       imported (environment, output folders, overlay, arch check); one
                       process = one SoC. :func:`current_soc`.
``soc_target``         what makes pypto target a SoC without CANN: :func:`sim_soc`, the 950
                       package overlay (``overlay_950``) and the cost-model config
                       (``cost_config``).
``patches``            the two monkey-patches of ``JitCallableWrapper``: the interpreter gets
                       the caller's tensors, the cost-model step is optional.
``calculator``         :func:`load_calculator`: PyPTO's C++ interpreter back end, source-
                       patched (OCP FP8 E4M3 casts, exact K-tile sums) and built once.
``run``                :func:`run_kernel`, :func:`run_cost`, :func:`run_compile`,
                       :func:`cost_only`, :func:`record_roots` and their :class:`SimRun`.
``cost_output``        reading the cost model's output folder (swim lanes, cycles, tasks).
``isolation``          :func:`isolated`: a function in a fresh process for a SoC (forked
                       from a fork server that preloads torch and tilesim), run with
                       :data:`PINNED_ENV`.
``cache``              the on-disk cache the others build into, published atomically.
``warmup``             :func:`warm` (``python -m tilesim.device.sim``): build every cache.
``errors``             :class:`SimError`.
=====================  ==================================================================

Environment knobs: ``TILESIM_SIM_CACHE`` (calculator, overlay and configs; default
``~/.cache/tilesim/sim``), ``TILESIM_SIM_KEEP=1`` (keep PyPTO's output folders and print where),
``TILESIM_SIM_STOCK_CALC=1`` (build the unpatched calculator), ``TILESIM_SOC`` (SoC of a process
that runs a kernel without calling :func:`configure`; default ``910b``).

Importing this package imports neither torch nor pypto.
"""

from __future__ import annotations

from tilesim.device.sim.calculator import load_calculator
from tilesim.device.sim.errors import SimError
from tilesim.device.sim.isolation import PINNED_ENV, isolated
from tilesim.device.sim.process import configure, current_soc
from tilesim.device.sim.run import (
    SimRun,
    cost_only,
    record_roots,
    run_compile,
    run_cost,
    run_kernel,
)
from tilesim.device.sim.soc_target import sim_soc
from tilesim.device.sim.warmup import warm

__all__ = [
    "PINNED_ENV",
    "SimError",
    "SimRun",
    "configure",
    "cost_only",
    "current_soc",
    "isolated",
    "load_calculator",
    "record_roots",
    "run_compile",
    "run_cost",
    "run_kernel",
    "sim_soc",
    "warm",
]
