"""Reading what PyPTO's cost model wrote for one call (:mod:`tilesim.device.sim`).

Each kernel call leaves an output folder (``pypto_impl.LogTopFolder()``): the swim lanes
``CostModelSimulationOutput/_simulate.swim.json`` (per-core task start/end cycles), the
statistics report ``_simulate.stat.report.txt``, ``program.json`` (the compiled functions) and
``dyn_topo.txt`` (the tasks the device control flow dispatched). These readers turn them into
the figures of :class:`tilesim.device.sim.SimRun` and :func:`tilesim.device.sim.record_roots`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from tilesim.shared.soc import COST_MODEL_CYCLES_PER_US


def swim_us(sim_dir: Path) -> float | None:
    """AICore end-to-end time from ``_simulate.swim.json`` (what draw_swim_lane.py prints)."""
    f = sim_dir / "_simulate.swim.json"
    if not f.exists():
        return None
    start = end = None
    for core in json.loads(f.read_text()):
        if core.get("coreType") not in ("AIC", "AIV"):
            continue
        for t in core.get("tasks", []):
            s, e = t.get("execStart", 0), t.get("execEnd", 0)
            if e < s:
                continue
            start = s if start is None else min(start, s)
            end = e if end is None else max(end, e)
    return 0.0 if start is None else (end - start) / COST_MODEL_CYCLES_PER_US


def total_cycles(sim_dir: Path) -> int | None:
    """The machine model's "Total Cycles" (``_simulate.stat.report.txt``; ``None`` if absent)."""
    f = sim_dir / "_simulate.stat.report.txt"
    if not f.exists():
        return None
    for line in f.read_text().splitlines():
        if line.startswith("Total Cycles"):
            return int(line.split(":")[-1])
    return None


def drop_output(top: Path) -> None:
    """Remove a call's output folder (``TILESIM_SIM_KEEP`` set: keep it and say where)."""
    if os.environ.get("TILESIM_SIM_KEEP"):
        print(f"[tilesim.sim] kept {top}", file=sys.stderr)
    else:
        shutil.rmtree(top, ignore_errors=True)


def root_tasks(top: Path) -> dict[str, int]:
    """Leaf tasks per root function that the cost model's run of the device control flow
    dispatched: one row of ``dyn_topo.txt`` per task, whose fourth column is its root
    function's hash; the name is that function's ``rawname`` in ``program.json`` (PyPTO names
    a loop body's root after its loop, e.g. ``TENSOR_<loop>_LoopUnroll<u>_Unroll1_PATH0_
    hiddenfunc0_root`` for the chunks of unroll factor ``u`` of a ``loop_unroll``)."""
    functions = json.loads((top / "program.json").read_text())["functions"]
    names = {str(f["hash"]): f["rawname"] for f in functions
             if str(f.get("rawname", "")).endswith("_root")}  # fmt: skip
    out: dict[str, int] = {}
    with open(top / "dyn_topo.txt") as rows:
        next(rows)  # header: seqNo,taskId,rootIndex,rootHash,...
        for row in rows:
            name = names.get(row.split(",")[3], "?")
            out[name] = out.get(name, 0) + 1
    return out
