"""``python -m tilesim.device.sim``: build the simulator's caches (calculator, 950 overlay,
cost configs) before the tests start (:func:`tilesim.device.sim.warm`)."""

from __future__ import annotations

from tilesim.device.sim.warmup import warm

if __name__ == "__main__":
    print(warm())
