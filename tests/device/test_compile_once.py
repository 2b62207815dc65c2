"""One compiled kernel per model configuration and tiling, on PyPTO's CPU simulator.

``tilesim.device.compile_stats()`` counts the kernels the compile registry
(``tilesim.device.backend.compiled``) built. Driving a wrapper over runtime sizes -- decode
``nb`` x batch, indexer ``nb``, MoE token counts -- must build ONE kernel per wrapper, and the
outputs must still meet the budgets of the wrappers' own sim tests (docs/device.md). The
second half compiles, without interpreting, every kernel at the exact shapes ``nox -s device``
runs on an NPU (the NPU paths' own padding included), so an NPU host never meets a compile
failure first (``slow``: the MSA kernels' shapes are built and interpreted in CI by their own
sim tests, see :func:`test_msa_kernels_compile_at_npu_test_shapes`).

Each check runs in a spawned process per SoC (``tilesim.device.sim.isolated``).
"""

from __future__ import annotations

import importlib

import pytest
from tilesim.shared.registry.ops import record

DECODE_NB = (17, 18, 40)
DECODE_BATCH = (1, 2, 4)
#: the (nb, batch) calls of the decode check: every nb and every batch (so every body of the
#: batch loop: 1, 2 and 4 rows) once, in CI; the full cross product is the ``slow`` variant
#: (each call compiles and interprets: ~10-20 s of the 2-core CI box per call and SoC)
DECODE_CALLS = {
    "each nb and batch": tuple(zip(DECODE_NB, DECODE_BATCH, strict=True)),
    "nb x batch": tuple((nb, b) for nb in DECODE_NB for b in DECODE_BATCH),
}
INDEXER_NB = (17, 18, 40)
MOE_COUNTS = ([5, 0, 12, 1], [1, 3, 0, 0], [16, 16, 16, 17])


def _bit_exact(out, gold) -> float:
    import torch

    return float((out.view(torch.int16) == gold.view(torch.int16)).float().mean())


def _decode_case(b, nb, seed):
    """``b`` rows of the M3 decode shape over ``nb`` blocks: 16 distinct ids per row with the
    current block among them, a partial current block and a different length per row."""
    import torch

    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, 64, 128, generator=g) * 0.5).bfloat16()
    kb = (torch.randn(b, 4, nb, 128, 128, generator=g) * 0.5).bfloat16()
    vb = torch.randn(b, 4, nb, 128, 128, generator=g).bfloat16()
    seq = torch.tensor([(nb - 1) * 128 + 1 + 37 * r % 127 for r in range(b)])
    rows = []
    for _ in range(b):
        perm = torch.randperm(nb - 1, generator=g)[:15]
        rows.append(torch.cat([perm, torch.tensor([nb - 1])])[torch.randperm(16, generator=g)])
    return q, kb, vb, torch.stack(rows).to(torch.int32), seq


def _judged(out, gold, kind) -> list[str]:
    """The judge's failures (empty when it passes) of a kernel output under the row-ULP budget
    and the default golden-aware rule (``kind``: the op, for the report's coordinates)."""
    from tilesim.reference import judge

    v = judge(out, gold, {"mode": "ulp", "row_ulp": record(kind).budgets["row_ulp"]}, kind=kind)
    return [] if v.passed else [v.summary()]


def check_decode_compiles_once(soc, calls=DECODE_CALLS["nb x batch"]) -> dict:
    """The wrapper's default tiling (``tiling=None``: the split rule of
    :mod:`tilesim.shared.msa_decode`, which may depend on the batch); the reference gets the
    same tiling. ``splits``: the distinct ``kv_splits`` the rule gave (one kernel each)."""
    from tilesim.device import compile_stats, reset_compile_stats
    from tilesim.device.msa_decode import msa_sparse_decode
    from tilesim.reference import msa_sparse_decode as reference
    from tilesim.shared.msa_decode import split_tiling
    from tilesim.shared.tiling import MsaTiling

    reset_compile_stats()
    worst = {"bit_exact": 1.0, "judged": []}
    splits, first = set(), None
    for i, (nb, b) in enumerate(calls):
        q, kb, vb, ids, seq = _decode_case(b, nb, seed=100 + i)
        out, _ = msa_sparse_decode(q, kb, vb, ids, seq, backend="sim", soc=soc)
        first = first or ((q, kb, vb, ids, seq), out)
        tiling = split_tiling(MsaTiling.from_env(), batch=b, hkv=4, topk=16, soc=soc)
        splits.add(tiling.kv_splits)
        gold = reference(q, kb, vb, ids, seq, tiling=tiling)
        worst["bit_exact"] = min(worst["bit_exact"], _bit_exact(out, gold))
        worst["judged"] += _judged(out, gold, "msa_decode")
    # validate=False: no value checks on the host (validate reaches only the wrapper's host
    # checks, not the launch), the same bits; rerun on the first (smallest) call
    args, out = first
    out_nv, _ = msa_sparse_decode(*args, backend="sim", soc=soc, validate=False)
    same = _bit_exact(out_nv, out) == 1.0
    return {"stats": compile_stats(), "validate_false_same": same, "splits": sorted(splits),
            **worst}  # fmt: skip


def check_indexer_compiles_once(soc) -> dict:
    import torch
    from tilesim.device import compile_stats, reset_compile_stats
    from tilesim.device.msa_indexer import msa_indexer, msa_indexer_scores
    from tilesim.reference import msa_indexer as ref_ids
    from tilesim.reference import msa_indexer_scores as ref_scores

    reset_compile_stats()
    res = {"bound_ratio": 0.0, "same_ids": True}
    for nb in INDEXER_NB:
        g = torch.Generator().manual_seed(nb)
        q = (torch.randn(4, 128, generator=g) * 0.1).bfloat16()
        k = (torch.randn(nb * 128, 128, generator=g) * 0.1).bfloat16()
        s, _ = msa_indexer_scores(q, k, nb, backend="sim", soc=soc)
        bound = 128 * 2.0**-24 * (q.double().abs() @ k.double().abs().T)
        err = (s.double() - ref_scores(q, k, nb).double()).abs()
        res["bound_ratio"] = max(
            res["bound_ratio"], float((err / bound.clamp_min(2.0**-149)).max())
        )
        seq_len = nb * 128 - 77
        for block_max in ("host", "device"):
            ids, _ = msa_indexer(q, k, nb, seq_len=seq_len, block_max=block_max, backend="sim",
                                 soc=soc, validate=block_max == "host")  # fmt: skip
            res["same_ids"] &= bool(torch.equal(ids, ref_ids(q, k, nb, seq_len=seq_len)))
    res["stats"] = compile_stats()
    return res


def _moe_case(counts, seed, h=256, inter=128):
    """silu experts E = len(counts) at H 256 / I 128, tokens grouped by expert."""
    import numpy as np
    import torch
    from tilesim.shared.models import MoeDims

    g = torch.Generator().manual_seed(seed)
    e = len(counts)
    x = (torch.randn(sum(counts), h, generator=g) * 0.5).bfloat16()
    w13 = (torch.randn(e * h, 2 * inter, generator=g) * 0.1).bfloat16()
    w2 = (torch.randn(e * inter, h, generator=g) * 0.1).bfloat16()
    cs = torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32)
    return x, w13, w2, cs, MoeDims(e, h, inter, "silu")


def check_moe_compiles_once(soc) -> dict:
    from tilesim.device import compile_stats, reset_compile_stats
    from tilesim.device.moe import moe_grouped_gemm
    from tilesim.reference import moe_grouped_gemm as reference
    from tilesim.shared.soc import moe_tiling

    reset_compile_stats()
    worst = {"bit_exact": 1.0, "judged": []}
    tiling = moe_tiling("silu", soc)
    for i, counts in enumerate(MOE_COUNTS):
        x, w13, w2, cs, dims = _moe_case(counts, seed=40 + i)
        out, _ = moe_grouped_gemm(x, (w13, w2), cs, dims, tiling=tiling, backend="sim",
                                  soc=soc, validate=i != 1)  # fmt: skip
        gold = reference(x, (w13, w2), cs, dims, tiling=tiling)
        worst["bit_exact"] = min(worst["bit_exact"], _bit_exact(out, gold))
        worst["judged"] += _judged(out, gold, "moe")
    return {"stats": compile_stats(), **worst}


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize(
    "calls", [pytest.param("each nb and batch"), pytest.param("nb x batch", marks=pytest.mark.slow)]
)
def test_decode_one_compile_over_nb_and_batch(compile_soc, calls):
    from tilesim.device import sim

    assert {nb for nb, _ in DECODE_CALLS[calls]} == set(DECODE_NB)
    assert {b for _, b in DECODE_CALLS[calls]} == set(DECODE_BATCH)
    r = sim.isolated(check_decode_compiles_once, compile_soc, DECODE_CALLS[calls], soc=compile_soc)
    # one kernel per kv_splits value (a tiling field, part of the key), none per nb or batch
    assert r["stats"] == {"msa_sparse_decode": len(r["splits"])}, r
    assert r["bit_exact"] >= record("msa_decode").budgets["bit_exact"] and not r["judged"], r
    assert r["validate_false_same"], r


@pytest.mark.sim
@pytest.mark.torch
def test_indexer_one_compile_over_nb(compile_soc):
    from tilesim.device import sim

    r = sim.isolated(check_indexer_compiles_once, compile_soc, soc=compile_soc)
    assert r["stats"] == {"msa_indexer_scores": 1, "msa_indexer_select": 1}, r  # device rank
    assert r["bound_ratio"] <= 1.0 and r["same_ids"], r


@pytest.mark.sim
@pytest.mark.torch
def test_moe_one_compile_over_token_counts(compile_soc):
    from tilesim.device import sim

    r = sim.isolated(check_moe_compiles_once, compile_soc, soc=compile_soc)
    assert r["stats"] == {"moe_grouped_gemm": 1}, r
    assert r["bit_exact"] >= record("moe").budgets["bit_exact"] and not r["judged"], r


# ----------------------------------------------------------------------------- NPU shapes
def _compile_msa_npu_shapes(soc) -> dict:
    """The indexer at the seeds' nb 17 (their nb 8 launches no kernel), both block-max
    variants; the decode at the seeds' e2e shape (B 1, nb 17, seq_len 2176), every variant."""
    import torch
    from tilesim.device import msa_decode as md
    from tilesim.device import sim

    # the module, not the op of the same name the package exports
    mi = importlib.import_module("tilesim.device.msa_indexer")
    from tilesim.shared.msa_indexer import check_meta, check_values
    from tilesim.shared.tiling import MsaTiling

    nb, bf = 17, torch.bfloat16
    seconds = {}
    q, k = torch.zeros(4, 128, dtype=bf), torch.zeros(nb * 128, 128, dtype=bf)
    kernel, ins, outs = mi.score_launch(q, k, nb, soc)
    seconds["indexer nb17 scores"] = sim.run_compile(kernel, [*ins, *outs])
    kernel, ins, outs = mi.block_max_launch(q, k, check_values(check_meta(q, k, nb)), soc)
    seconds["indexer nb17 block max"] = sim.run_compile(kernel, [*ins, *outs])
    for hr in ("max", "none"):  # the device-ranked kernel, per head mode
        kernel, ins, outs = mi.select_launch(
            q, k, check_values(check_meta(q, k, nb, head_reduce=hr)), soc
        )
        seconds[f"indexer nb17 select {hr}"] = sim.run_compile(kernel, [*ins, *outs])
    q = torch.zeros(1, 64, 128, dtype=bf)
    kb = torch.zeros(1, 4, nb, 128, 128, dtype=bf)
    ids = torch.arange(16, dtype=torch.int32)[None]
    shape = md.CallShape(batch=1, hq=64, hkv=4, nb=nb, dim=128, topk=16)
    for gather in md.GATHERS:
        kernel, ins, outs = md.decode_launch(q, kb, kb, ids, torch.tensor([2176]), shape,
                                             MsaTiling.from_env().ntile, gather, soc)  # fmt: skip
        seconds[f"decode nb17 B1 {gather}"] = sim.run_compile(kernel, [*ins, *outs])
    return seconds


def _compile_moe_npu_shapes(soc) -> dict:
    """The grouped GEMM at the two seed cases of test_moe_npu.py, with the NPU path's
    padding rows and the cases' own tilings."""
    import numpy as np
    import torch
    from tilesim.device import sim
    from tilesim.device.moe import kernel_config, npu_buffers
    from tilesim.reference.cases.moe import moe_make_case

    seconds = {}
    for name in ("m3_case_smoke_edge", "m27_case_001"):
        case = moe_make_case(name)
        inp, p = case["inputs"], case["params"]

        def bf16(a):
            return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(
                torch.bfloat16
            )

        x = bf16(inp["sorted_tokens"])
        args = [x, *(bf16(w) for w in inp["weights"]), torch.from_numpy(inp["expert_cumsum"])]
        padded, res = npu_buffers(args, torch.zeros_like(x))
        from tilesim.device._moe_kernel import build_kernel

        kernel = build_kernel(*kernel_config(p["dims"], p["tiling"]))
        seconds[f"moe {name}"] = sim.run_compile(kernel, [*padded, res])
    return seconds


def compile_npu_shapes(soc, which: str) -> dict:
    """Compile (no interpretation) the kernels at the shapes of the ``npu`` tests of
    tests/device, with the NPU paths' arguments; {what: compile seconds}."""
    return _compile_msa_npu_shapes(soc) if which == "msa" else _compile_moe_npu_shapes(soc)


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.torch
def test_msa_kernels_compile_at_npu_test_shapes(compile_soc):
    """``slow``: CI builds and interprets these seven kernels at these shapes already, on both
    SoCs -- the same builder arguments (the compile keys; ``nb``, batch and the lengths are
    runtime values of the kernels), the NPU tests' shapes: tests/device/test_msa_indexer_sim.py
    ``nb17 seq2100`` (q ``[4, 128]``, nb 17: the score, block-max and both select kernels) and
    tests/device/test_msa_decode_sim.py ``nb17 B1 topk16 seq2100`` (B 1, nb 17, every gather,
    the wrapper's ``kv_splits`` 1). Only the length differs (2176 on the NPU), a runtime value."""
    from tilesim.device import sim

    r = sim.isolated(compile_npu_shapes, compile_soc, "msa", soc=compile_soc)
    assert len(r) == 7 and all(s > 0 for s in r.values()), r  # 4 indexer + 3 decode kernels


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.torch
def test_moe_kernel_compiles_at_npu_test_shapes(sim_soc):
    from tilesim.device import sim

    r = sim.isolated(compile_npu_shapes, sim_soc, "moe", soc=sim_soc)
    assert len(r) == 2 and all(s > 0 for s in r.values()), r
