"""MoE grouped-GEMM kernel on PyPTO's CPU simulator (910B and 950) vs tilesim.reference.

Budget (stated in docs/ops/moe.md#kernel, enforced here), against
``tilesim.reference.moe_grouped_gemm``
with the same tiling:

1. at least 99 % of the output elements bit-identical;
2. the verdict of :func:`tilesim.reference.judge` passes with a row-ULP budget of 1: every
   element within 1 BF16 ULP of the largest ``|golden|`` of its row (row-wise: where mm2
   cancels, an output far smaller than its row magnifies any FP32 accumulation difference,
   worth many of ITS OWN ULPs), plus the judge's relative-L2 / cosine bounds per row and over
   the tensor;
3. on the small cases (H = 256: two K tiles) additionally every element within 1 BF16 ULP of
   itself, for every case alike. The simulator's matmul sums each K tile exactly, the
   golden's model (docs/device.md, "A deterministic interpreter"), so no accumulation-order
   difference is left between the two; on an NPU the cube's order inside a K tile is its own,
   which is why the device budgets are 1. and 2.

The checks run in a spawned process per case (``tilesim.device.sim.isolated``) and return
plain numbers. The seed case ``m3_case_smoke_edge`` goes in as NumPy arrays (the wrapper's
NumPy-in, NumPy-out rule), the others as torch tensors. The full-size seed case's row also
carries the streaming floor of the op's bytes (``tests/probes/floor.py``: "floor µs",
"kernel / floor").
"""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.shared.registry.ops import record

#: the kernel's pass figures: the device budgets of the op's record (tilesim.shared.moe)
BUDGETS = record("moe").budgets
#: the judge's tolerance for the kernel against its reference twin (no published atol/rtol)
TOLERANCE = {"mode": "ulp", "row_ulp": BUDGETS["row_ulp"]}
SMALL_CASE_MAX_ULP = 1

# name -> how to build it: ("custom", activation, counts, H, I, x scale, w scale, unroll,
# vec_tile) or ("seed", moe_make_case name). Custom data: torch.randn (not a seed's RNG).
CASES = {
    # uneven experts: an empty one, 5 and 12 (not powers of two: chunks 4+1, 8+4), a single row
    "silu E4 [5,0,12,1] H256 I128": ("custom", "silu", [5, 0, 12, 1], 256, 128, 0.5, 0.3),
    # scales large enough that the gate and up clamps at +-7 are both exercised
    "swigluoai E4 [5,0,12,1] H256 I128": (
        "custom",
        "swigluoai",
        [5, 0, 12, 1],
        256,
        128,
        0.5,
        0.3,
    ),
    # the M3 seed case: counts [1,0,3,4], unroll "1,2,4" (chunks 2+1, 4), clamp exercised;
    # passed to the wrapper as NumPy arrays
    "m3_case_smoke_edge": ("seed", "m3_case_smoke_edge"),
}
SLOW_CASES = {
    # the M2.7 seed case: H 3072, I 1536, counts [0,1,2,4,8,16,32,0] (20-80 s per SoC)
    "m27_case_001": ("seed", "m27_case_001"),
}


def _case_tensors(counts, h, i, xs, ws, seed):
    import torch

    e = len(counts)
    n = sum(counts) + 3  # 3 trailing rows no expert owns: must keep the caller's values
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, h, generator=g) * xs).bfloat16()
    w13 = (torch.randn(e * h, 2 * i, generator=g) * ws).bfloat16()
    w2 = (torch.randn(e * i, h, generator=g) * ws).bfloat16()
    cs = torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32)
    return x, w13, w2, cs


def _build(spec, soc):
    """(x, w13, w2, cs, dims, tiling) of a CASES entry; x has 3 rows past the last expert."""
    import torch
    from tilesim.reference.cases.moe import moe_make_case
    from tilesim.shared.models import MoeDims
    from tilesim.shared.soc import moe_tiling

    if spec[0] == "custom":
        _, activation, counts, h, i, xs, ws = spec
        x, w13, w2, cs = _case_tensors(counts, h, i, xs, ws, seed=1234)
        dims = MoeDims(len(counts), h, i, activation)
        return x, w13, w2, cs, dims, moe_tiling(activation, soc)
    case = moe_make_case(spec[1])
    inp, p = case["inputs"], case["params"]

    def bf16(a):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(torch.bfloat16)

    x = bf16(inp["sorted_tokens"])
    x = torch.cat([x, torch.ones(3, x.shape[1], dtype=torch.bfloat16)])
    w13, w2 = (bf16(w) for w in inp["weights"])
    cs = torch.from_numpy(inp["expert_cumsum"].copy())
    dims = p["dims"]
    # the seed's unroll list and swiglu constants on the SoC's tile defaults
    tiling = moe_tiling(dims.activation, soc).replace(
        unroll=p["tiling"].unroll,
        swiglu_alpha=p["tiling"].swiglu_alpha,
        swiglu_limit=p["tiling"].swiglu_limit,
    )
    return x, w13, w2, cs, dims, tiling


def _device_run(x, w13, w2, cs, dims, tiling, sentinel, soc, numpy_io):
    """The wrapper on the simulator with torch tensors, or with NumPy arrays (``numpy_io``);
    returns (out as a torch tensor, cost µs, trace records)."""
    from tilesim.device import moe_grouped_gemm
    from tilesim.shared.interop import to_numpy, to_torch

    dev_trace = []
    args = [x, (w13, w2), cs]
    out = sentinel.clone()
    if numpy_io:
        args = [to_numpy(x).copy(), tuple(to_numpy(w).copy() for w in (w13, w2)),
                to_numpy(cs).copy()]  # fmt: skip
        out = to_numpy(out).copy()
    got, us = moe_grouped_gemm(*args, dims, tiling=tiling, out=out, backend="sim", soc=soc,
                               trace=dev_trace.append)  # fmt: skip
    assert got is out, "the wrapper must return the given out"
    if numpy_io:
        assert isinstance(got, np.ndarray)
        got = to_torch(got)
    return got, us, dev_trace


def check_moe(spec, soc, floor: bool = False) -> dict:
    """Runs in the isolated child: kernel in the simulator, reference, metrics; ``floor``: also
    the streaming floor of the op's contract bytes (``tests/probes/floor.py``)."""
    import ml_dtypes
    import torch
    from tilesim.reference import judge
    from tilesim.reference import moe_grouped_gemm as reference

    x, w13, w2, cs, dims, tiling = _build(spec, soc)
    h, i = dims.hidden_size, dims.intermediate_size
    before = [t.clone() for t in (x, w13, w2, cs)]
    sentinel = torch.full_like(x, -3.0)
    numpy_io = spec == ("seed", "m3_case_smoke_edge")
    out, us, dev_trace = _device_run(x, w13, w2, cs, dims, tiling, sentinel, soc, numpy_io)
    ref_trace = []
    gold = reference(
        x, (w13, w2), cs, dims, tiling=tiling, out=sentinel.clone(), trace=ref_trace.append
    )
    ntok = int(cs[-1])
    a = out.view(torch.int16).numpy().view(ml_dtypes.bfloat16)[:ntok]
    b = gold.view(torch.int16).numpy().view(ml_dtypes.bfloat16)[:ntok]
    v = judge(a, b, TOLERANCE, kind="moe")
    err = np.abs(a.astype(np.float64) - b.astype(np.float64))
    # the clamp of swigluoai must be exercised (max gate and max |up| beyond the limit)
    gate_max = up_max = 0.0
    for e in range(dims.num_experts):
        gu = x[cs[e] : cs[e + 1]].double() @ w13[e * h : (e + 1) * h].double()
        if gu.numel():
            gate_max = max(gate_max, float(gu[:, :i].max()))
            up_max = max(up_max, float(gu[:, i:].abs().max()))
    active = int(sum(1 for e in range(dims.num_experts) if cs[e + 1] > cs[e]))
    return {
        "us": us,
        "bit_exact": float(np.mean(a.view(np.uint16) == b.view(np.uint16))),
        "max_ulp": v.max_ulp,
        "row_ulp": v.value("row ULP budget"),
        "judged": v.passed,
        "verdict": v.summary(),
        "max_abs": float(err.max()),
        "tail_kept": bool(torch.equal(out[ntok:], sentinel[ntok:])),
        "inputs_kept": all(
            torch.equal(p, q) for p, q in zip(before, (x, w13, w2, cs), strict=True)
        ),
        "same_trace": dev_trace == ref_trace and len(dev_trace) > 0,
        "gate_max": gate_max,
        "up_max": up_max,
        "activation": dims.activation,
        "hidden": h,
        "hbm_bytes": 2 * (2 * x.shape[0] * h + active * (h * 2 * i + i * h)),
        "flops": 2 * ntok * h * 2 * i + 2 * ntok * i * h,
        **(_floor(x, w13, w2, cs, dims, tiling, soc) if floor else {}),
    }


def _floor(x, w13, w2, cs, dims, tiling, soc) -> dict:
    """``{"floor_us"}``: the streaming floor of the op's bytes (``shared.moe.cost``)."""
    from probes.floor import floor_us
    from tilesim.shared import moe as contract

    args = contract.check_meta(x, (w13, w2), cs, dims, tiling, None, False, None)
    return {"floor_us": floor_us(contract.cost(contract.check_values(args))["bytes"], soc=soc)}


def _run_case(name, spec, soc, sim_report, floor=False):
    from tilesim.device import sim

    r = sim.isolated(check_moe, spec, soc, floor, soc=soc)
    sim_report.add(
        kernel="moe_grouped_gemm",
        soc=soc,
        case=name,
        bit_exact=r["bit_exact"],
        max_ulp=r["max_ulp"],
        max_abs=r["max_abs"],
        us=r["us"],
        cost={"flop": r["flops"], "bytes": r["hbm_bytes"]},  # the report derives the bounds
        extra={"row-wise ULP": r["row_ulp"], **({"floor µs": r["floor_us"]} if floor else {})},
    )
    assert r["inputs_kept"], "the wrapper changed an input tensor"
    assert r["tail_kept"], "rows no expert owns must keep the caller's values"
    assert r["same_trace"], "trace hook: device and reference chunk schedules differ"
    if r["activation"] == "swigluoai":
        assert r["gate_max"] > 7.0 and r["up_max"] > 7.0, "case does not exercise the clamp"
    assert r["bit_exact"] >= BUDGETS["bit_exact"], r
    assert r["judged"], r["verdict"]
    assert r["us"] > 0.0
    if r["hidden"] <= 256:
        assert r["max_ulp"] <= SMALL_CASE_MAX_ULP, r


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize("name", list(CASES))
def test_moe_kernel_matches_reference(name, sim_soc, sim_report):
    _run_case(name, CASES[name], sim_soc, sim_report)


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name", list(SLOW_CASES))
def test_moe_seed_case_full_size(name, sim_soc, sim_report):
    _run_case(name, SLOW_CASES[name], sim_soc, sim_report, floor=True)


_FRESH_PROCESS = """
import torch
from tilesim.device import moe_grouped_gemm
from tilesim.reference import moe_grouped_gemm as reference
from tilesim.shared.models import MoeDims
g = torch.Generator().manual_seed(5)
x = torch.randn(7, 128, generator=g).bfloat16()
w13 = (torch.randn(256, 128, generator=g) * 0.1).bfloat16()
w2 = (torch.randn(128, 128, generator=g) * 0.1).bfloat16()
cs = torch.tensor([0, 3, 7], dtype=torch.int32)
dims = MoeDims(2, 128, 64)
out, us = moe_grouped_gemm(x, (w13, w2), cs, dims, backend="sim", soc="950")
gold = reference(x, (w13, w2), cs, dims)
# bit-pattern distance: the ULP distance where signs agree, larger otherwise (conservative)
d = (out.view(torch.int16).int() - gold.view(torch.int16).int()).abs()
import pypto
print(pypto.platform.npuarch, us > 0, float((d == 0).float().mean()), int(d.max()))
"""


@pytest.mark.sim
@pytest.mark.soc_950
@pytest.mark.torch
def test_wrapper_sets_up_a_fresh_process():
    """backend='sim' without isolated(): the wrapper picks the SoC before pypto is imported."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    arch, cost_ok, exact, max_ulp = r.stdout.strip().splitlines()[-1].split()
    assert (arch, cost_ok) == ("DAV_3510", "True")
    assert float(exact) >= BUDGETS["bit_exact"] and int(max_ulp) <= SMALL_CASE_MAX_ULP, r.stdout


# ---------------------------------------------------------------- argument checks (no pypto)
@pytest.mark.torch
def test_bad_arguments_name_the_argument():
    import torch
    from tilesim.device import moe_grouped_gemm
    from tilesim.shared.models import MoeDims

    x, w13, w2, cs = _case_tensors([2, 1], 32, 16, 1.0, 1.0, 0)
    dims = MoeDims(2, 32, 16, "silu")
    with pytest.raises(ValueError, match="backend"):
        moe_grouped_gemm(x, (w13, w2), cs, dims, backend="gpu")
    with pytest.raises(ValueError, match="backend='sim'"):
        moe_grouped_gemm(x, (w13, w2), cs, dims)  # CPU tensors, no NPU
    with pytest.raises(TypeError, match="w2_flat: expected dtype"):
        moe_grouped_gemm(x, (w13, w2.float()), cs, dims, backend="sim")
    with pytest.raises(ValueError, match="w13_flat: expected shape"):
        moe_grouped_gemm(x, (w13[:-1], w2), cs, dims, backend="sim")
    bad = torch.tensor([0, 3, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="expert_cumsum"):
        moe_grouped_gemm(x, (w13, w2), bad, dims, backend="sim")
    with pytest.raises(ValueError, match="round_activation"):
        moe_grouped_gemm(x, (w13, w2), cs, dims, backend="sim", round_activation=False)
    with pytest.raises(TypeError, match="sorted_tokens: expected a numpy array or a torch"):
        moe_grouped_gemm(x.tolist(), (w13, w2), cs, dims, backend="sim")
    with pytest.raises(TypeError, match="trace: expected a callable"):
        moe_grouped_gemm(x, (w13, w2), cs, dims, backend="sim", trace="print")
    with pytest.raises(ValueError, match="out: expected memory of its own"):
        moe_grouped_gemm(x, (w13, w2), cs, dims, backend="sim", out=x)
    with pytest.raises(ValueError, match="gate_up_layout"):
        moe_grouped_gemm(
            x,
            (w13, w2),
            cs,
            MoeDims(2, 32, 16, "silu", gate_up_layout="interleaved"),
            backend="sim",
        )


@pytest.mark.torch
def test_no_tokens_launches_nothing():
    import torch
    from tilesim.device import moe_grouped_gemm
    from tilesim.shared.models import MoeDims

    x, w13, w2, _ = _case_tensors([0, 0], 32, 16, 1.0, 1.0, 0)
    cs = torch.zeros(3, dtype=torch.int32)
    out = torch.full_like(x, 2.0)
    got, us = moe_grouped_gemm(x, (w13, w2), cs, MoeDims(2, 32, 16), out=out, backend="sim")
    assert got is out and us == 0.0 and bool((out == 2.0).all())


@pytest.mark.torch
def test_numpy_in_numpy_out_without_tokens():
    from tilesim.device import moe_grouped_gemm
    from tilesim.shared.interop import to_numpy
    from tilesim.shared.models import MoeDims

    x, w13, w2, _ = _case_tensors([0, 0], 32, 16, 1.0, 1.0, 0)
    args = [to_numpy(t).copy() for t in (x, w13, w2)]
    cs = np.zeros(3, dtype=np.int32)
    seen = []
    got, us = moe_grouped_gemm(args[0], (args[1], args[2]), cs, MoeDims(2, 32, 16),
                               backend="sim", trace=seen.append)  # fmt: skip
    assert isinstance(got, np.ndarray) and got.shape == (3, 32) and us == 0.0
    assert not got.astype(np.float32).any() and seen == []
