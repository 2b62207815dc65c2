"""The streaming floor (``tests/probes/floor.py``), the lower yardstick of the cost-model report.

Without the simulator: :func:`floor_plan` covers the bytes asked with one task per vector core,
the fewest tiles per task of at most half the UB, the fewest rows per tile.

On the simulator, per SoC, one small size (an MSA indexer score call over 40 blocks, 1.6 MB):
the floor kernel reads every byte of its plan (interpreted, its row sums are torch's), and the
floor lies between the op's HBM bound and the kernel's cost-model time; a second size with the
same plan is served from the cache (no second compile).
"""

from __future__ import annotations

import math

import pytest
from probes.floor import COLS, ROW_BYTES, FloorPlan, floor_plan, tile_rows
from tilesim.shared.soc import get_soc

SIZES = [1, 1023, 1024, 1025, 300_000, 1_630_000, 13_000_000, 36_000_000, 590_000_000]


@pytest.mark.parametrize("soc", ["910b", "950"])
@pytest.mark.parametrize("nbytes", SIZES)
def test_plan_covers_the_bytes(nbytes, soc):
    p = floor_plan(nbytes, soc)
    spec = get_soc(soc)
    assert p.tasks == spec.aiv_cores
    assert 1 <= p.rows <= tile_rows(soc) == spec.ub_bytes // 2 // ROW_BYTES
    assert p.tile_bytes == p.rows * COLS * 4
    assert nbytes <= p.streamed < nbytes + p.tasks * p.tiles * ROW_BYTES
    # the fewest tiles per task: one fewer cannot hold the bytes in full tiles
    assert p.tiles == 1 or (p.tiles - 1) * p.tasks * tile_rows(soc) * ROW_BYTES < nbytes
    # the fewest rows per tile
    assert p.rows == 1 or (p.rows - 1) * p.tasks * p.tiles * ROW_BYTES < nbytes


def test_plan_values():
    assert (tile_rows("910b"), tile_rows("950")) == (96, 124)  # 96 KiB / 124 KiB tiles
    assert floor_plan(1, "910b") == FloorPlan(48, 1, 1)
    assert floor_plan(48 * 96 * 1024, "910b") == FloorPlan(48, 1, 96)
    assert floor_plan(48 * 96 * 1024 + 1, "910b") == FloorPlan(48, 2, 49)
    assert floor_plan(13_000_000, "950") == FloorPlan(56, 2, math.ceil(13_000_000 / 1024 / 112))


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "8", None])
def test_plan_refuses_a_bad_size(bad):
    with pytest.raises((TypeError, ValueError), match="nbytes"):
        floor_plan(bad, "910b")


def check_floor(soc: str) -> dict:
    """Child: the floor kernel interpreted on a small plan (its output against torch), then
    the floor of an MSA indexer score call and the call's own cost-model time."""
    import torch
    from probes.floor import build_floor, floor_us
    from tilesim.device import compile_stats, msa_indexer_scores, reset_compile_stats, sim
    from tilesim.shared import msa_indexer as contract

    reset_compile_stats()
    # interpreted: 3 tasks x 2 tiles x 4 rows, each task's two tiles' row sums added
    rows, tiles, tasks = 4, 2, 3
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-64, 64, (tasks * tiles * rows, COLS), generator=g).float()
    out = torch.zeros(tasks * rows, 1)
    sim.run_kernel(build_floor(rows, tiles), [x, out])
    want = x.reshape(tasks, tiles, rows, COLS).sum(dim=(1, 3)).reshape(tasks * rows, 1)
    reset_compile_stats()

    nb = 40
    q = torch.zeros(4, 128, dtype=torch.bfloat16)
    k = torch.zeros(nb * 128, 128, dtype=torch.bfloat16)
    with sim.cost_only():
        _, us = msa_indexer_scores(q, k, nb, backend="sim", soc=soc)
    nbytes = contract.cost(contract.sized_args(nb))["bytes"]
    floor = floor_us(nbytes, soc=soc)
    again = floor_us(nbytes + 1, soc=soc)  # the same plan: cached
    return {
        "sums_exact": bool(torch.equal(out, want)),
        "us": us,
        "bytes": nbytes,
        "floor_us": floor,
        "again_us": again,
        "stats": compile_stats(),
    }


@pytest.mark.sim
@pytest.mark.torch
def test_floor_between_hbm_bound_and_kernel(sim_soc):
    from tilesim.device import sim

    r = sim.isolated(check_floor, sim_soc, soc=sim_soc)
    assert r["sums_exact"], "the floor kernel must read every tile of its plan"
    hbm = get_soc(sim_soc).hbm_bound_us(r["bytes"])
    assert hbm <= r["floor_us"] <= r["us"], (hbm, r)
    assert r["again_us"] == r["floor_us"]
    assert r["stats"] == {"msa_indexer_scores": 1, "stream_floor": 1}, r["stats"]
