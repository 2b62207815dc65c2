"""The seeds' headline decode shapes on PyPTO 0.2.0's cost model, costed without interpreting.

Shapes, each through its public wrapper's own argument building, inside
:func:`tilesim.device.sim.cost_only` (compile + cost model, no host interpreter: the outputs are
NOT computed, so these rows carry no numerics):

* DeepSeek sparse attention decode, b 4 and b 64, s1 2, top-2048 of a 4096-key context per
  batch row (every query token attends exactly 2048 keys), decode preset: the 950 with the FP8
  packed cache, the 910B with the INT8 packed cache;
* MSA block-sparse decode, the registered case ``msa_decode_b64_nb17`` (B 64, nb 17, seq_len
  2176, top-16 blocks), ``gather="device"`` (the default).

Each row goes to the cost-model report with the contract cost of its shape (``flop``,
``bytes``; the report derives the bounds) and its streaming floor. What is asserted: the cost
is a positive finite number, the shapes are what they claim (keys per token), each row is
within 2 % of its committed figure (``tests/device/cost_figures.json``, checked as the row is
added), and -- on a small case per SoC and kernel -- that the cost-only path gives exactly
the µs of the interpreted one while leaving the output unwritten. No bound is asserted: the
cost model's matmul charge is not tied to FLOPs
(docs/device.md#what-the-cost-model-does-not-model), so not even "µs >= cube bound" is a
property of the model.

CPU cost (2 shared cores): b 4 ~10-30 s per SoC; the MSA case ~1 min and b 64 ~100 s of
cost-model CPU per SoC (PyPTO's model steps every task of ~30 000 through its pipes), hence
``slow``.
"""

from __future__ import annotations

import contextlib
import math

import pytest

pytestmark = [pytest.mark.sim, pytest.mark.torch]

CONTEXT = 4096  # keys in each batch row's cache (> TOPK + s1: every token selects TOPK keys)
TOPK = 2048
S1 = 2
MSA_CASE = "msa_decode_b64_nb17"


# ----------------------------------------------------------------------------- child processes
def _dsa_case(quant: str, b: int, s1: int = S1, context: int = CONTEXT):
    import tilesim.reference as reference
    from tilesim.shared.tiling import SaTileShapeConfig

    case = reference.dsa_make_case(
        seed=5, b=b, s1=s1, actual_seq=[context] * b, topk=TOPK, quant=quant, layout="pypto",
        tiling=SaTileShapeConfig.decode(), topk_rule="causal",
    )  # fmt: skip
    return case["inputs"], case["params"]


def cost_dsa_decode(soc: str, quant: str, b: int) -> dict:
    """Child: the DeepSeek decode kernel at ``b`` x s1 2 through the wrapper, cost only."""
    from probes.floor import floor_us
    from tilesim.device import dsa as dev
    from tilesim.device import sim
    from tilesim.shared.dsa import cost_of_indices

    inp, prm = _dsa_case(quant, b)
    with sim.cost_only():
        _, us = dev.sparse_attention_antiquant(**inp, **prm, backend="sim", soc=soc)
    t = dev.sparse_attention_traffic(inp["topk_indices"], inp["kv_act_seqs"])
    ti, acts = inp["topk_indices"], inp["kv_act_seqs"]
    op_bytes = cost_of_indices(ti, acts, nq=prm["nq"], topk=TOPK)["bytes"]
    return {"us": us, "kv_splits": prm["tiling"].kv_splits, "floor_us": floor_us(op_bytes, soc=soc),
            **t}  # fmt: skip


def _msa_case(batch: int | None = None, **over):
    import tilesim.reference as reference
    from tilesim.reference.cases.msa import CASE_INFO

    info = CASE_INFO[MSA_CASE]
    params = {k: v for k, v in info.builder_params.items() if k != "case"}
    if batch is not None:
        params["batch"] = batch
    params.update(over)
    case = reference.msa_make_case(None, seed=info.seed, **params)
    return case["inputs"], case["params"]


def msa_decode_traffic(batch: int, hq: int, hkv: int, topk: int, dim: int) -> dict:
    """HBM bytes and cube FLOPs of one MSA decode call (``gather="device"``), no reuse: Q in
    and the output out (``batch*hq*dim`` BF16 each), and per (batch row, KV head) the
    ``topk*128`` selected K and V rows (``dim`` BF16 each) read once; the keep-masks and the
    page table (under 0.3 % of it at B 64) are left out. FLOPs: per (batch row, KV head)
    ``Q_g K^T`` and ``P V`` over every selected key (the kernel computes masked keys too),
    ``2 * 2 * (hq/hkv) * keys * dim``: the op's one counter,
    :func:`tilesim.shared.msa_decode.cost`."""
    from tilesim.shared.msa_decode import cost, sized_args

    c = cost(sized_args(batch, hq, dim, hkv=hkv, topk=topk))
    return {"bytes": c["bytes"], "flop": c["flop"], "keys": batch * hkv * topk * 128}


def cost_msa_decode(soc: str) -> dict:
    """Child: MSA decode at the registered B 64 case through the wrapper, cost only."""
    from probes.floor import floor_us
    from tilesim.device import sim
    from tilesim.device.msa_decode import msa_sparse_decode

    inp, prm = _msa_case()
    with sim.cost_only():
        _, us = msa_sparse_decode(**inp, **prm, backend="sim", soc=soc)
    b, hq, dim = inp["q"].shape
    hkv, topk = inp["k_blocks"].shape[1], inp["block_ids"].shape[1]
    t = msa_decode_traffic(b, hq, hkv, topk, dim)
    return {"us": us, "shape": (b, hq, hkv, topk, dim), "floor_us": floor_us(t["bytes"], soc=soc),
            **t}  # fmt: skip


def cost_vs_interpreted(soc: str, quant: str) -> dict:
    """Child: one small case per kernel, interpreted (``run_kernel``) and cost only
    (``run_cost``) through the same wrapper call, the output pre-filled with NaN."""
    import numpy as np
    import torch
    from tilesim.device import dsa as dev
    from tilesim.device import sim
    from tilesim.device.msa_decode import msa_sparse_decode

    inp, prm = _dsa_case(quant, b=1, context=2100)
    res = {}
    for mode in ("interpreted", "cost"):
        out = torch.full((S1 * 128, 512), float("nan"), dtype=torch.bfloat16)
        with sim.cost_only() if mode == "cost" else contextlib.nullcontext():
            _, us = dev.sparse_attention_antiquant(**inp, **prm, out=out, backend="sim", soc=soc)
        res[f"dsa_{mode}"] = (us, int(torch.isnan(out.float()).sum()), out.numel())
    minp, mprm = _msa_case(batch=2, nb=5, seq_len=600, select="random")
    for mode in ("interpreted", "cost"):
        with sim.cost_only() if mode == "cost" else contextlib.nullcontext():
            out, us = msa_sparse_decode(**minp, **mprm, backend="sim", soc=soc)
        # the wrapper's output buffer starts as zeros: cost only leaves every element +0
        bits = np.asarray(out).view(np.uint16)
        res[f"msa_{mode}"] = (us, int((bits != 0).sum()), bits.size)
    return res


# ----------------------------------------------------------------------------- report rows
def _add_cost_row(sim_report, *, kernel: str, soc: str, case: str, r: dict):
    """A row without numerics (the outputs were not computed): bit-exact / ULP / abs error
    are ``None`` (printed "—"); the report derives the bounds from the op's ``flop`` /
    ``bytes`` and the SoC, next to the row's streaming floor (``tests/probes/floor.py``)."""
    sim_report.add(
        kernel=kernel, soc=soc, case=case, bit_exact=None, max_ulp=None, max_abs=None,
        us=r["us"], cost={"flop": r["flop"], "bytes": r["bytes"]},
        extra={"floor µs": r["floor_us"]},
    )  # fmt: skip


def _check_cost(us) -> None:
    assert us is not None and math.isfinite(us) and us > 0, us


# ----------------------------------------------------------------------------- tests
_DSA = [
    pytest.param("910b", "int8", 4, marks=pytest.mark.soc_910b, id="910b-int8-b4"),
    pytest.param("950", "fp8", 4, marks=pytest.mark.soc_950, id="950-fp8-b4"),
    pytest.param("910b", "int8", 64, marks=[pytest.mark.soc_910b, pytest.mark.slow],
                 id="910b-int8-b64"),
    pytest.param("950", "fp8", 64, marks=[pytest.mark.soc_950, pytest.mark.slow],
                 id="950-fp8-b64"),
]  # fmt: skip


@pytest.mark.parametrize("soc,quant,b", _DSA)
def test_dsa_decode_headline(soc, quant, b, sim_report):
    from tilesim.device import sim

    r = sim.isolated(cost_dsa_decode, soc, quant, b, soc=soc, timeout=2400)
    _check_cost(r["us"])
    assert r["keys"] == b * S1 * TOPK  # every token attends exactly TOPK keys
    assert r["kv_splits"] == 1  # the decode preset
    _add_cost_row(
        sim_report, kernel="sparse_attention_antiquant", soc=soc,
        case=f"headline {quant} pypto decode b{b} s{S1} context {CONTEXT} topk {TOPK} "
        "(cost only, not interpreted)",
        r=r,
    )  # fmt: skip


@pytest.mark.slow  # B 64: ~1 min of cost model per SoC; a report row, no numerics
def test_msa_decode_headline(sim_soc, sim_report):
    from tilesim.device import sim

    r = sim.isolated(cost_msa_decode, sim_soc, soc=sim_soc, timeout=2400)
    _check_cost(r["us"])
    b, hq, hkv, topk, dim = r["shape"]
    assert (b, hkv, topk) == (64, 4, 16)  # the registered B 64 case
    _add_cost_row(
        sim_report, kernel="msa_sparse_decode", soc=sim_soc,
        case=f"headline {MSA_CASE} B{b} nb17 seq2176 topk{topk} gather=device "
        "(cost only, not interpreted)",
        r=r,
    )  # fmt: skip


@pytest.mark.parametrize(
    "soc,quant",
    [
        pytest.param("910b", "int8", marks=pytest.mark.soc_910b, id="910b-int8"),
        # the cost-only path is the backend's, one for both SoCs: CI runs the 910B's
        pytest.param("950", "fp8", marks=[pytest.mark.soc_950, pytest.mark.slow], id="950-fp8"),
    ],
)
def test_cost_only_equals_interpreted(soc, quant):
    """The path the headline rows use gives the interpreted run's µs exactly, and really does
    not interpret (the output stays as it was), for both kernels."""
    from tilesim.device import sim

    r = sim.isolated(cost_vs_interpreted, soc, quant, soc=soc, timeout=1200)
    for k in ("dsa", "msa"):
        us_i, count_i, n = r[f"{k}_interpreted"]
        us_c, count_c, _ = r[f"{k}_cost"]
        _check_cost(us_i)
        assert us_c == us_i, (k, us_i, us_c)
        if k == "dsa":  # counts of NaN (the fill)
            assert count_i == 0  # interpreted: every output element written
            assert count_c == n  # cost only: every element still the NaN fill
        else:  # counts of non-zero elements (the wrapper's buffer starts as +0)
            assert count_i > 0  # interpreted: the outputs were computed
            assert count_c == 0  # cost only: every element still +0
