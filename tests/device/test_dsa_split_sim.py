"""DeepSeek sparse attention on the cost model: the decode shapes of the split-KV rule against
the matmul-only probe.

Per SoC (910B INT8, 950 FP8 packed cache, decode preset, one query token per batch row, 2048
keys): B 1 and B 8 through the kernel with ``tiling = split_tiling(decode, ...)`` (the default
rule of :mod:`tilesim.shared.layouts.dsa_split_rule`) and the build the wrapper picks by token count
(:func:`tilesim.shared.dsa.kernel_build`: the seeds' at B 1, the large-batch build at B 8;
at B 8 the wrapper also runs the large-batch tiling, :func:`tilesim.shared.dsa.kernel_tiling`),
compared with the reference twin of the call (:func:`tilesim.shared.dsa.golden_keywords`:
the same tiling, ``accumulation="k_steps"`` with the large-batch one; >= 99 % bit-exact,
:func:`tilesim.reference.judge` passing under the cases' tolerance with a 1 row-ULP budget),
and the probe (``tests/probes/dsa_probe.py`` ``matmul_probe``: the same C1/C2 matmuls on the
tiles the call runs, nothing else) and the streaming floor of the op's bytes
(``tests/probes/floor.py``) in the same process. The rows go to the cost-model report with
the op's cost (``flop``, ``bytes``), "floor µs" and "probe µs" (the report derives the bounds
and the kernel's multiples); the test asserts numbers (agreement, split counts, and -- for
the B 1 rows -- the cost-model µs within 2 % of its committed figure,
``tests/device/cost_figures.json``), never a wall-clock time. CI runs the B 1 rows; the B 8
rows are ``slow`` (see :data:`_SHAPES`).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_dsa_sim import BUDGETS, judged


def run_decode(soc: str, quant: str, b: int) -> dict:
    """Child process: kernel + reference twin + probe for one shape."""
    import tilesim.reference as reference
    from probes.dsa_probe import matmul_probe
    from probes.floor import floor_us
    from tilesim.device import dsa as dev
    from tilesim.reference.util.numerics import ulp_distance
    from tilesim.shared.dsa import cost_of_indices, golden_keywords, kernel_build
    from tilesim.shared.layouts.dsa_split_rule import split_tiling
    from tilesim.shared.tiling import SaTileShapeConfig

    cfg = split_tiling(SaTileShapeConfig.decode(), tokens=b, nq=128, topk=2048, soc=soc)
    case = reference.dsa_make_case(
        seed=3, b=b, s1=1, actual_seq=[2048] * b, topk=2048, quant=quant, layout="pypto",
        tiling=cfg, topk_rule="causal",
    )  # fmt: skip
    inp, prm = case["inputs"], case["params"]
    got, us = dev.sparse_attention_antiquant(**inp, **prm, backend="sim", soc=soc)
    twin = golden_keywords(tokens=b, nq=128, tiling=cfg, soc=soc)  # the tiling the call runs
    ref = reference.sparse_attention_antiquant(**inp, **{**prm, **twin})
    _, probe_us = matmul_probe(b, nq=128, topk=2048, tiling=twin["tiling"], backend="sim",
                               soc=soc)  # fmt: skip
    traffic = dev.sparse_attention_traffic(inp["topk_indices"], inp["kv_act_seqs"])
    op_bytes = cost_of_indices(inp["topk_indices"], inp["kv_act_seqs"], nq=128, topk=2048)["bytes"]
    build = kernel_build(tokens=b, nq=128, tiling=twin["tiling"], soc=soc)
    return {
        "kv_splits": prm["tiling"].kv_splits,
        "build": build,
        "large_tiling": twin["tiling"] == SaTileShapeConfig.large_batch(),
        "us": us,
        "probe_us": probe_us,
        "floor_us": floor_us(op_bytes, soc=soc),
        "bit_exact": float(np.mean(got.view(np.uint16) == ref.view(np.uint16))),
        **judged(got, ref, case["tolerance"], BUDGETS["row_ulp"]),
        "max_ulp": int(ulp_distance(got, ref).max()),
        "max_abs": float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).max()),
        "nan": int(np.isnan(got.astype(np.float32)).sum()),
        "bytes": traffic["bytes"],
        "flop": traffic["flop"],
    }


#: the B 8 rows are ``slow`` (no guarded figure): what they add to the B 1 rows, CI checks
#: elsewhere -- the large-batch build's bits (tests/device/test_dsa_compile_sim.py: that build
#: forced on the kernel-digest cases ``dsa/int8_pypto@910b`` and ``dsa/fp8_kv_split@950``, the
#: wrapper switching builds at the 910B's threshold against the golden), the build rule
#: (``test_kernel_build_rule``) and the split rule (tests/reference/test_dsa_split.py)
_SHAPES = [
    pytest.param("910b", "int8", 1, 1, "seeds", marks=pytest.mark.soc_910b, id="910b-int8-b1"),
    pytest.param("910b", "int8", 8, 1, "large_batch", marks=[pytest.mark.soc_910b,
                 pytest.mark.slow], id="910b-int8-b8"),
    pytest.param("950", "fp8", 1, 1, "seeds", marks=pytest.mark.soc_950, id="950-fp8-b1"),
    pytest.param("950", "fp8", 8, 1, "large_batch", marks=[pytest.mark.soc_950,
                 pytest.mark.slow], id="950-fp8-b8"),
]  # fmt: skip


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize("soc,quant,b,splits,build", _SHAPES)
def test_decode_against_probe(soc, quant, b, splits, build, sim_report):
    from tilesim.device import sim

    r = sim.isolated(run_decode, soc, quant, b, soc=soc, timeout=2400)
    assert r["kv_splits"] == splits  # the default rule (worked out in test_dsa_split.py)
    assert r["build"] == build  # the build rule (test_dsa_compile_sim.py)
    assert r["large_tiling"] == (b > 4)  # the tiling rule (LARGE_TILING_ITEMS 5)
    assert r["nan"] == 0
    assert r["bit_exact"] >= BUDGETS["bit_exact"], f"{r['bit_exact']:.4%} bit-exact"
    assert r["judged"], r["verdict"]
    assert r["us"] > 0 and r["probe_us"] > 0 and r["floor_us"] > 0
    sim_report.add(
        kernel="sparse_attention_antiquant",
        soc=soc,
        case=f"{quant} pypto decode b{b} s1 acts 2048 topk 2048 kv_splits {splits} (default rule)",
        bit_exact=r["bit_exact"],
        max_ulp=r["max_ulp"],
        max_abs=r["max_abs"],
        us=r["us"],
        cost={"flop": r["flop"], "bytes": r["bytes"]},  # the report derives the bounds
        extra={"row-wise ULP": r["row_ulps"], "floor µs": r["floor_us"], "probe µs": r["probe_us"]},
    )
