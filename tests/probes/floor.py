"""The streaming floor: what PyPTO's cost model charges for reading a given number of bytes
(test support, not installed).

A kernel's headline row states its time against three yardsticks (``docs/device.md``,
"Yardsticks"): the HBM bound (the op's bytes at the chip's bandwidth), this floor and the
op's matmul-only probe. The floor is the model's own price of the op's bytes
(``tilesim.shared.<op>.cost(...)["bytes"]``) when nothing else is done with them: a dense FP32
tensor of that many bytes streamed through the vector cores in the largest tiles the UB
takes, one task per vector core, every task reading its share as a chain of tiles and
writing one small row sum, one launch. Whatever a kernel does beyond moving its bytes -- a
matmul, a softmax, a longer chain of tasks, more or smaller copies -- is what
``kernel / floor`` measures.

The floor kernel (:func:`build_floor`), per task ``t`` of ``tasks`` (= the SoC's AIV cores)::

    acc = sum_k rowsum(x[(t*tiles + k)*rows : +rows, :256])     k = 0 .. tiles-1
    out[t*rows : +rows] = acc                                   [rows, 1] FP32

all in one manual subgraph scope (``sg_set_scope``: one task per ``t``, its ``tiles`` copies
one after another, as the model runs a task's copies). The tiles are ``rows x 256`` FP32, at
most half the UB (:func:`tile_rows`: 96 KiB on the 910B, 124 KiB on the 950): one tile alone
compiles up to ~65 % of the UB, but a chain of eight tiles of more than half the UB makes
the scheduler spill, which PyPTO 0.2.0's cost model cannot parse. :func:`floor_plan` picks
the fewest tiles per task that hold the bytes, then the fewest rows per tile (whole 1 KiB
rows), so the floor streams at most ``tasks * tiles`` KiB more than asked. Measured on both
SoCs: one task per core beats fewer tasks of full tiles (e.g. 384 KiB on the 910B: 48 tasks
of 8 KiB 1.79 µs, 3 tasks of 124 KiB 1.93 µs), and a chain of tiles in one task beats one
task per tile (6 MiB: 48 chains of two 64 KiB tiles 3.3 µs, 96 tasks of one tile 9.4 µs).

Importing this module needs neither torch nor pypto; :func:`floor_us` runs in a simulator
process (``tilesim.device.sim.isolated``, or any process a wrapper has configured) and caches
its µs per plan, so each size is compiled and costed once per process.
"""

# no `from __future__ import annotations`: the frontend evaluates the pypto.Tensor(...) annotations
import functools
import math
from dataclasses import dataclass

from tilesim.device import backend as _backend
from tilesim.device._lazy import require_pypto, require_torch
from tilesim.shared.soc import DEFAULT_SOC, get_soc
from tilesim.shared.validate import check_pos_int

OP_NAME = "stream_floor"
COLS = 256  #: FP32 columns of a tile row
ROW_BYTES = COLS * 4  #: 1 KiB
#: the manual subgraph scope of a task's tile chain
SCOPE = 1


def tile_rows(soc=DEFAULT_SOC) -> int:
    """Rows of the floor's largest tile on ``soc``: half the UB of a vector core (96 on the
    910B, 124 on the 950)."""
    return get_soc(soc).ub_bytes // 2 // ROW_BYTES


@dataclass(frozen=True)
class FloorPlan:
    """How the floor streams a byte count: ``tasks`` tasks (one per vector core), each a chain
    of ``tiles`` tiles of ``rows x 256`` FP32."""

    tasks: int
    tiles: int
    rows: int

    @property
    def tile_bytes(self) -> int:
        return self.rows * ROW_BYTES

    @property
    def streamed(self) -> int:
        """Bytes the floor kernel reads (>= the bytes asked, by less than ``tasks * tiles``
        KiB)."""
        return self.tasks * self.tiles * self.tile_bytes


def floor_plan(nbytes, soc=DEFAULT_SOC) -> FloorPlan:
    """The :class:`FloorPlan` of ``nbytes`` (a positive integer) on ``soc``: every vector
    core one task, the fewest tiles per task of at most :func:`tile_rows` rows, then the
    fewest rows per tile."""
    nbytes = check_pos_int(nbytes, "nbytes")
    spec = get_soc(soc)
    tasks, cap = spec.aiv_cores, tile_rows(spec)
    rows_needed = math.ceil(nbytes / ROW_BYTES)
    tiles = math.ceil(rows_needed / (tasks * cap))
    return FloorPlan(tasks, tiles, math.ceil(rows_needed / (tasks * tiles)))


def stream_chain(pypto, x, out, t, rows: int, tiles: int):
    """Inside a kernel body: task ``t`` -- its ``tiles`` tiles' row sums added up and written
    as one ``[rows, 1]`` FP32 column, in one subgraph scope."""
    pypto.set_pass_options(sg_set_scope=SCOPE)
    pypto.set_vec_tile_shapes(rows, COLS)
    acc = None
    for k in range(tiles):  # static: the chain of one task
        tile = pypto.view(x, [rows, COLS], [(t * tiles + k) * rows, 0])
        s = pypto.sum(tile, -1, True)
        acc = s if acc is None else pypto.add(acc, s)
    pypto.assemble(acc, [t * rows, 0], out)
    pypto.set_pass_options(sg_set_scope=-1)


@_backend.compile_once(OP_NAME)
def build_floor(rows: int, tiles: int):
    """The ``@pypto.frontend.jit`` floor kernel for ``rows x 256`` tiles, ``tiles`` per task
    (the task count is the input's row count / ``rows * tiles``, a runtime value)."""
    pypto = require_pypto()

    @pypto.frontend.jit()
    def stream_floor_kernel(
        x: pypto.Tensor([pypto.DYNAMIC, COLS], pypto.DT_FP32),  # [tasks*tiles*rows, 256]
        out: pypto.Tensor([pypto.DYNAMIC, 1], pypto.DT_FP32),  # [tasks*rows, 1]
    ):
        tasks = x.shape[0] // (rows * tiles)
        for t in pypto.loop(0, tasks, 1, name="LOOP_FLOOR", idx_name="t"):
            stream_chain(pypto, x, out, t, rows, tiles)

    return stream_floor_kernel


@functools.cache
def _plan_us(soc: str, plan: FloorPlan) -> float:
    from tilesim.device import sim

    torch = require_torch()
    kernel = build_floor(plan.rows, plan.tiles)
    x = torch.zeros((plan.tasks * plan.tiles * plan.rows, COLS), dtype=torch.float32)
    out = torch.zeros((plan.tasks * plan.rows, 1), dtype=torch.float32)
    return sim.run_cost(kernel, [x, out]).us


def floor_us(nbytes, *, soc=DEFAULT_SOC) -> float:
    """The cost-model µs of streaming ``nbytes`` on ``soc`` (:func:`floor_plan`, the floor
    kernel costed without interpreting: its output is never read). Configures this process
    for ``soc`` if needed (a process compiles for one SoC: run it through
    ``tilesim.device.sim.isolated``); cached per plan."""
    import numpy as np

    plan = floor_plan(nbytes, soc)
    target = _backend.resolve("sim", soc, np.zeros(1))
    return _plan_us(target.soc, plan)


__all__ = ["COLS", "FloorPlan", "build_floor", "floor_plan", "floor_us", "stream_chain",
           "tile_rows"]  # fmt: skip
