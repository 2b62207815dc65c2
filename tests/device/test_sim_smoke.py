"""Smoke test of the CPU machinery (tilesim.device.sim) on both SoCs with a tiny kernel."""

from __future__ import annotations

import pytest
from tilesim.shared.soc import get_soc

pytestmark = [pytest.mark.sim, pytest.mark.torch]


def test_elementwise_kernel_matches_torch(sim_soc, sim_report):
    from probes.smoke import check_scaled_exp_add
    from tilesim.device import sim

    # 100 rows = three full 32-row tiles + a 4-row tail (dynamic first dim, valid_shape)
    r = sim.isolated(check_scaled_exp_add, 100, 7, soc=sim_soc)
    assert r["soc"] == sim_soc
    assert r["arch"] == get_soc(sim_soc).arch  # the 950 overlay really retargets the compiler
    assert r["inputs_kept"]
    # the interpreter is libtorch on CPU: exp, add and the RNE cast to BF16 match torch bit for bit
    assert r["bit_exact"] == 1.0 and r["max_abs"] == 0.0
    assert 0.0 < r["us"] < 100.0
    sim_report.add(
        kernel="smoke_scaled_exp_add",
        soc=sim_soc,
        case="[100,128] fp32 -> bf16",
        bit_exact=r["bit_exact"],
        max_ulp=0,
        max_abs=r["max_abs"],
        us=r["us"],
    )


def test_fp8_cast_is_ocp_e4m3(sim_soc):
    from probes.smoke import check_fp8_encode
    from tilesim.device import sim

    r = sim.isolated(check_fp8_encode, 3, soc=sim_soc)
    # stock pypto 0.2.0 would give 1.0, 0.0, 2.0 (integer rounding) and 240 (E4M3 max 240)
    assert r["first"] == [0.625, 0.25, 2.5, 288.0, 448.0, -448.0]
    assert r["n_above_240"] > 100
    assert r["bit_exact"] == 1.0


def _bad_call():
    from probes.smoke import scaled_exp_add
    from tilesim.device import sim

    sim.run_kernel(scaled_exp_add, [1.0, 2.0, 3.0])


def test_isolated_reports_child_errors():
    from tilesim.device import sim

    with pytest.raises(sim.SimError, match=r"args\[0\]: expected a torch.Tensor"):
        sim.isolated(_bad_call, soc="910b")


def _abort():
    import os

    os.abort()


def test_isolated_reports_a_dead_child():
    from tilesim.device import sim

    with pytest.raises(sim.SimError, match="child process died"):
        sim.isolated(_abort, soc="950")


def _switch_soc():
    from tilesim.device import sim

    return sim.current_soc(), sim.configure("950")


def test_one_process_one_soc():
    from tilesim.device import sim

    with pytest.raises(sim.SimError, match="set up for '910b', got '950'"):
        sim.isolated(_switch_soc, soc="910b")


def check_run_cost(rows: int, seed: int) -> dict:
    """Child: the smoke kernel through run_kernel and run_cost on the same inputs."""
    import torch
    from probes.smoke import scaled_exp_add
    from tilesim.device import sim

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 128, generator=g)
    y = torch.randn(rows, 128, generator=g)
    outs = {}
    runs = {}
    for name, fn in (("kernel", sim.run_kernel), ("cost", sim.run_cost)):
        outs[name] = torch.full((rows, 128), -7.0, dtype=torch.bfloat16)
        runs[name] = fn(scaled_exp_add, [x.clone(), y.clone(), outs[name]], scale=0.5)
    fill = torch.full((rows, 128), -7.0, dtype=torch.bfloat16)
    return {
        "us": (runs["kernel"].us, runs["cost"].us),
        "cycles": (runs["kernel"].cycles, runs["cost"].cycles),
        "kernel_wrote": not torch.equal(outs["kernel"], fill),
        "cost_wrote": not torch.equal(outs["cost"], fill),
    }


def test_run_cost_equals_run_kernel(sim_soc):
    from tilesim.device import sim

    r = sim.isolated(check_run_cost, 100, 3, soc=sim_soc)
    assert r["us"][0] > 0 and r["us"][0] == r["us"][1]
    assert r["cycles"][0] == r["cycles"][1]
    assert r["kernel_wrote"]  # interpreted: the output was computed
    assert not r["cost_wrote"]  # cost only: the output keeps the caller's fill
