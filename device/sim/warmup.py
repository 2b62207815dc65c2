"""Building the simulator's caches ahead of the tests (``python -m tilesim.device.sim``)."""

from __future__ import annotations

import os
import time

from tilesim.device.sim.calculator import load_calculator
from tilesim.device.sim.process import configure
from tilesim.device.sim.soc_target import cost_config, overlay_950
from tilesim.shared.soc import DEFAULT_SOC, SIM_SOCS


def warm() -> str:
    """Build the calculator, the 950 overlay and both cost configs (CI runs this once)."""
    t0 = time.perf_counter()
    overlay = overlay_950()
    for s in SIM_SOCS:
        cost_config(s)
    configure(os.environ.get("TILESIM_SOC") or DEFAULT_SOC)
    lib = load_calculator()
    return f"calculator {lib}\noverlay {overlay}\nready in {time.perf_counter() - t0:.1f} s"
