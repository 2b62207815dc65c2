"""Which SoC PyPTO 0.2.0 compiles and costs for on a CPU (:mod:`tilesim.device.sim`).

0.2.0 has no API to choose the target. Without CANN it reads the SoC from its platform ini
(``pypto/lib/configs/A2A3.ini`` of ``hicann/pypto``) and the cost model's machine from
``TILEFWK_CONFIG_PATH`` (``pypto/lib/configs/tile_fwk_config.json``). This module writes both
for a SoC: :func:`overlay_950` (a package overlay whose ini is the Ascend950PR one) and
:func:`cost_config` (the cost model's config), built once into the cache
(:mod:`tilesim.device.sim.cache`). docs/device.md, "The CPU machinery", has the reasons.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from tilesim.device.sim.cache import (
    cache_dir,
    pkg_key,
    publish_dir,
    publish_file,
    pypto_pkg_dir,
)
from tilesim.shared.soc import get_soc


def sim_soc(soc: str) -> str:
    """The compile target of a SoC name: ``"910b"`` or ``"950"`` (``"950dt"`` compiles as 950)."""
    spec = get_soc(soc)
    return "950" if spec.arch == "DAV_3510" else "910b"


# Values the 0.2.0 platform parser reads, for the Ascend950PR_9579 (upstream platform config).
_INI_950 = """[version]
SoC_version=Ascend950PR_9579
Short_SoC_version=Ascend950
AIC_version=AIC-C-310
CCEC_AIC_version=dav-c310-cube
CCEC_AIV_version=dav-c310-vec
CCEC_CUBE_version=dav-c310-cube
CCEC_VECTOR_version=dav-c310-vec
NpuArch=3510

[SoCInfo]
ai_core_cnt=28
cube_core_cnt=28
vector_core_cnt=56
ai_cpu_cnt=5

[AICoreSpec]
cube_freq=1650
l0_a_size=65536
l0_b_size=65536
l0_c_size=262144
l1_size=524288
ub_size=253952
bt_size=4096
fb0_size=4096
"""


def overlay_950() -> Path:
    """A directory to put first on ``sys.path`` so that ``import pypto`` targets DAV_3510.

    pypto 0.2.0 without CANN reads the SoC only from ``<pkg>/lib/configs/A2A3.ini`` (found next
    to its platform library). The overlay links every file of the installed package except
    ``lib/configs``, whose ``A2A3.ini`` carries the Ascend950PR values. Built once per install.
    """
    pkg = pypto_pkg_dir()
    final = cache_dir() / f"overlay950-{pkg_key(pkg)}"
    if (final / "pypto" / "lib" / "configs" / "A2A3.ini").exists():
        return final
    tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix="overlay950-tmp-"))
    root = tmp / "pypto"
    (root / "lib" / "configs").mkdir(parents=True)
    for entry in pkg.iterdir():
        if entry.name not in ("lib", "__pycache__"):
            os.symlink(entry, root / entry.name)
    for entry in (pkg / "lib").iterdir():
        if entry.name != "configs":
            os.symlink(entry, root / "lib" / entry.name)
    for entry in (pkg / "lib" / "configs").iterdir():
        shutil.copy2(entry, root / "lib" / "configs" / entry.name)
    (root / "lib" / "configs" / "A2A3.ini").write_text(_INI_950)
    publish_dir(tmp, final)
    return final


def cost_config(soc: str) -> Path:
    """A ``tile_fwk_config.json`` for ``TILEFWK_CONFIG_PATH`` (read once at pypto start-up).

    910b: A2A3 latency tables, 6 AICPU machines (24 AIC / 48 AIV). 950: A5 tables, 7 machines
    (28 AIC / 56 AIV), device platform ASCEND_950PR_9579. Both skip the swim-lane PNG/HTML
    scripts (``Model.drawPngThresholdCycle=0``); the timing json is still written.
    """
    target = sim_soc(soc)
    pkg = pypto_pkg_dir()
    final = cache_dir() / f"costcfg-{target}-{pkg_key(pkg)}.json"
    if final.exists():
        return final
    cfg = json.loads((pkg / "lib" / "configs" / "tile_fwk_config.json").read_text())
    arch, machines, platform = (
        ("A5", 7, "ASCEND_950PR_9579") if target == "950" else ("A2A3", 6, "ASCEND_910B2")
    )
    cfg["global"]["platform"]["device_platform"] = platform
    keep = [
        a
        for a in cfg["global"]["simulation"]["args"]
        if not a.startswith(
            (
                "Model.deviceArch=",
                "Model.aicpuMachineNumber=",
                "Model.drawPngThresholdCycle=",
            )
        )
    ]
    keep += [
        f"Model.deviceArch={arch}",
        f"Model.aicpuMachineNumber={machines}",
        "Model.drawPngThresholdCycle=0",
    ]
    cfg["global"]["simulation"]["args"] = keep
    publish_file(json.dumps(cfg, indent=2), final)
    return final
