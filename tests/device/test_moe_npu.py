"""MoE grouped GEMM on an Ascend NPU (``nox -s device``): the seeds' cases at their tolerances.

Skipped with a reason on machines without an NPU (tests/device/conftest.py). The comparison is
against ``tilesim.reference.moe_grouped_gemm`` with the kernel's rounding points
(``round_activation=True``); the seeds' rtol/atol apply to every element.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.npu, pytest.mark.torch]


@pytest.mark.parametrize("name", ["m27_case_001", "m3_case_smoke_edge"])
def test_seed_case_on_npu(name):
    import torch
    import torch_npu  # noqa: F401
    from tilesim.device import moe_grouped_gemm
    from tilesim.reference import moe_grouped_gemm as reference
    from tilesim.reference.cases.moe import moe_make_case

    case = moe_make_case(name)
    inp, p, tol = case["inputs"], case["params"], case["tolerance"]

    def bf16(a):
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)

    x = bf16(inp["sorted_tokens"])
    w13, w2 = (bf16(w) for w in inp["weights"])
    cs = torch.from_numpy(inp["expert_cumsum"].copy())
    out = moe_grouped_gemm(
        x.npu(), (w13.npu(), w2.npu()), cs.npu(), p["dims"], tiling=p["tiling"]
    ).cpu()
    gold = reference(x, (w13, w2), cs, p["dims"], tiling=p["tiling"])
    np.testing.assert_allclose(
        out.float().numpy(), gold.float().numpy(), rtol=tol["rtol"], atol=tol["atol"]
    )
