"""MoE grouped-GEMM kernel on PyPTO's CPU simulator (910B and 950) vs tilesim.reference.

Budget (docs/device.md): at least 99 % of output elements bit-identical to
``tilesim.reference.moe_grouped_gemm`` and every element within 1 BF16 ULP. The checks run in
a spawned process per case (``tilesim.device.sim.isolated``) and return plain numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

BUDGET_BIT_EXACT = 0.99
BUDGET_MAX_ULP = 1

# (name, activation, counts, H, I, x scale, w scale, unroll or None, vec_tile or None)
CASES = [
    # uneven experts: an empty one, 5 and 12 (not powers of two: chunks 4+1, 8+4), a single row
    ("silu E4 [5,0,12,1]", "silu", [5, 0, 12, 1], 256, 128, 0.5, 0.3, None, None),
    # scales large enough that the gate and up clamps at +-7 are both exercised
    ("swigluoai E4 [5,0,12,1]", "swigluoai", [5, 0, 12, 1], 256, 128, 0.5, 0.3, None, None),
    # the M3 smoke-edge shape and unroll list "1,2,4" (chunks 2+1, 4), vec tile 128
    (
        "swigluoai E4 [1,0,3,4] unroll 4,2,1",
        "swigluoai",
        [1, 0, 3, 4],
        256,
        128,
        0.5,
        0.3,
        (4, 2, 1),
        128,
    ),
]


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


def check_moe(activation, counts, h, i, xs, ws, unroll, vec_tile, soc, seed=1234) -> dict:
    """Runs in the isolated child: kernel in the simulator, reference, metrics."""
    import ml_dtypes
    import torch
    from tilesim.device import moe_grouped_gemm
    from tilesim.reference import moe_grouped_gemm as reference
    from tilesim.reference.numerics import ulp_distance
    from tilesim.shared.models import MoeDims
    from tilesim.shared.soc import moe_tiling

    x, w13, w2, cs = _case_tensors(counts, h, i, xs, ws, seed)
    dims = MoeDims(len(counts), h, i, activation)
    tiling = moe_tiling(activation, soc)
    if unroll is not None:
        tiling = tiling.replace(unroll=unroll)
    if vec_tile is not None:
        tiling = tiling.replace(vec_tile=vec_tile)
    before = [t.clone() for t in (x, w13, w2, cs)]
    sentinel = torch.full_like(x, -3.0)
    dev_trace, ref_trace = [], []
    out, us = moe_grouped_gemm(
        x,
        (w13, w2),
        cs,
        dims,
        tiling=tiling,
        out=sentinel.clone(),
        backend="sim",
        soc=soc,
        trace=dev_trace.append,
    )
    gold = reference(
        x, (w13, w2), cs, dims, tiling=tiling, out=sentinel.clone(), trace=ref_trace.append
    )
    a = out.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    b = gold.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    ulp = ulp_distance(a, b)
    # the clamp of swigluoai must be exercised (max gate and max |up| beyond the limit)
    gu_max = up_max = 0.0
    for e in range(len(counts)):
        rows = x[cs[e] : cs[e + 1]].double()
        gu = rows @ w13[e * h : (e + 1) * h].double()
        if gu.numel():
            gu_max = max(gu_max, float(gu[:, :i].max()))
            up_max = max(up_max, float(gu[:, i:].abs().max()))
    ntok = int(cs[-1])
    active = sum(1 for c in counts if c)
    return {
        "us": us,
        "bit_exact": float(np.mean(a.view(np.uint16) == b.view(np.uint16))),
        "max_ulp": int(ulp.max()),
        "max_abs": float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))),
        "tail_kept": bool(torch.equal(out[ntok:], sentinel[ntok:])),
        "inputs_kept": all(
            torch.equal(p, q) for p, q in zip(before, (x, w13, w2, cs), strict=True)
        ),
        "same_trace": dev_trace == ref_trace and len(dev_trace) > 0,
        "gate_max": gu_max,
        "up_max": up_max,
        "hbm_bytes": 2 * (2 * x.shape[0] * h + active * (h * 2 * i + i * h)),
        "flops": 2 * ntok * h * 2 * i + 2 * ntok * i * h,
    }


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_moe_kernel_matches_reference(case, sim_soc, sim_report):
    from tilesim.device import sim
    from tilesim.shared.soc import get_soc

    name, activation, counts, h, i, xs, ws, unroll, vt = case
    r = sim.isolated(check_moe, activation, counts, h, i, xs, ws, unroll, vt, sim_soc, soc=sim_soc)
    spec = get_soc(sim_soc)
    sim_report.add(
        kernel="moe_grouped_gemm",
        soc=sim_soc,
        case=f"{name} H{h} I{i}",
        bit_exact=r["bit_exact"],
        max_ulp=r["max_ulp"],
        max_abs=r["max_abs"],
        us=r["us"],
        extra={
            "HBM-bound µs": spec.hbm_bound_us(r["hbm_bytes"]),
            "cube-peak µs": spec.cube_bound_us(r["flops"]),
        },
    )
    assert r["inputs_kept"], "the wrapper changed an input tensor"
    assert r["tail_kept"], "rows no expert owns must keep the caller's values"
    assert r["same_trace"], "trace hook: device and reference chunk schedules differ"
    if activation == "swigluoai":
        assert r["gate_max"] > 7.0 and r["up_max"] > 7.0, "case does not exercise the clamp"
    assert r["bit_exact"] >= BUDGET_BIT_EXACT, r
    assert r["max_ulp"] <= BUDGET_MAX_ULP, r
    assert r["us"] > 0.0


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
