"""One process = one SoC: :func:`configure` prepares this process before pypto is imported.

It unsets ``ASCEND_HOME_PATH`` (pypto would load CANN and fail), points
``TILEFWK_CONFIG_PATH`` at the SoC's cost-model config, sends PyPTO's per-call output folders
to a private temp dir (removed at exit), puts the 950 package overlay first on ``sys.path``
when the target is the 950 (:mod:`tilesim.device.sim.soc_target`), checks the arch pypto
reports and patches its JIT entry (:mod:`tilesim.device.sim.patches`). A second SoC needs
another process (:func:`tilesim.device.sim.isolated`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from tilesim.device._lazy import require_pypto, require_torch
from tilesim.device.sim.errors import SimError
from tilesim.device.sim.patches import patch_jit_wrapper
from tilesim.device.sim.soc_target import cost_config, overlay_950, sim_soc
from tilesim.shared.soc import DEFAULT_SOC, get_soc

_STATE: dict = {"soc": None, "workdir": None}


def current_soc() -> str | None:
    """SoC this process was configured for (``None`` before :func:`configure`)."""
    return _STATE["soc"]


def configure(soc: str | None = None, *, workdir: str | None = None) -> str:
    """Prepare this process to compile for ``soc`` (default ``$TILESIM_SOC`` or ``910b``).

    Must run before pypto is imported; calling it again with the same SoC is a no-op, with
    another SoC a :class:`SimError` (use :func:`tilesim.device.sim.isolated`). ``workdir``:
    where PyPTO's output goes (default a fresh temp dir, removed at exit). Returns the compile
    target name.
    """
    if soc is None and _STATE["soc"] is not None:
        return _STATE["soc"]
    target = sim_soc(soc or os.environ.get("TILESIM_SOC") or DEFAULT_SOC)
    if _STATE["soc"] is not None:
        if _STATE["soc"] != target:
            raise SimError(
                f"soc: this process is set up for {_STATE['soc']!r}, got {target!r}; "
                "one process compiles for one SoC -- run it through tilesim.device.sim.isolated"
            )
        return target
    if "pypto" in sys.modules:
        raise SimError(
            "pypto was imported before tilesim.device.sim.configure(); call configure(soc) "
            "first (or run the kernel through tilesim.device.sim.isolated)"
        )
    require_torch()
    os.environ.pop("ASCEND_HOME_PATH", None)  # SIM mode; with it set pypto loads CANN and fails
    os.environ["TILEFWK_CONFIG_PATH"] = str(cost_config(target))
    workdir = Path(workdir or tempfile.mkdtemp(prefix=f"tilesim-sim-{target}-"))
    os.environ["TILE_FWK_OUTPUT_DIR"] = str(workdir / "output")
    os.environ.setdefault("PYPTO_HOME", str(workdir / "pypto_home"))
    if not os.environ.get("TILESIM_SIM_KEEP"):
        atexit.register(shutil.rmtree, str(workdir), True)
    if target == "950":
        sys.path.insert(0, str(overlay_950()))
    pypto = require_pypto()
    arch = pypto.platform.npuarch
    want = get_soc(target).arch
    if arch != want:
        raise SimError(f"soc {target!r}: pypto compiles for {arch!r}, expected {want!r}")
    _STATE["soc"] = target
    _STATE["workdir"] = workdir
    patch_jit_wrapper()
    return target
