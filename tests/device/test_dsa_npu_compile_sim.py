"""Compile checks of the DeepSeek sparse-attention kernels at the NPU tests' exact shapes:
every case ``tests/device/test_dsa_npu_sim.py`` runs under ``nox -s device`` is compiled
through PyPTO's full pass pipeline for its SoC on the CPU, without interpreting.

The NPU test runs each :data:`tilesim.reference.DSA_CASES` entry whose SoC list holds the
device (FP8 only on a 950) with the case's tile preset and the wrapper's default
``validate=True``. Here the same wrapper prepares the same launch
(:func:`tilesim.device.dsa.prepared_launch`: the checks, the host index plan, the
bucketed block table, the pool's row count, the preset's tiles and the SoC's options) on inputs
of the cases' shapes, dtypes and lengths, and :func:`tilesim.device.sim.run_compile` compiles
it. No golden and no cache data is built (the 64-batch cases' caches are 2.75 GB): the caches
are uninitialised tensors a compile never reads, the queries zeros, every top-k entry 0 (an
allocated position, so the plan is the unmasked build the seeds' data gives). Each SoC runs in
its own spawned process (``tilesim.device.sim.isolated``).
"""

from __future__ import annotations

import math

import pytest

try:
    from tilesim.reference.cases.dsa import DSA_CASES
except ImportError:  # pragma: no cover - the reference is part of the package
    DSA_CASES = {}

BLOCK = 128
SOCS = ("910b", "950")
#: the cases compiled in the fast test (the others are ``slow``: a decode-preset compile takes
#: ~8 s of CPU, a prefill-preset one ~25 s, and the 950 has 14 cases): on the 950 each kernel
#: source (packed rows, kv_split) and softmax mode (online, per tile) at least once, and the
#: largest pool (the 64-batch caches, 4.2M rows -- 2.75 GB, beyond INT32 byte offsets) in both
#: dtypes; on the 910B its packed per-tile INT8 case. The 950's packed per-tile FP8 case
#: (``sfa_bf16_b4_s2_seq64K_total_fp8_d``) is ``slow``: its source and mode are compiled here,
#: and its build (FP8 packed rows, the prefill preset's tiles) is compiled and interpreted in CI
#: at a smaller pool (tests/device/test_dsa_sim.py, ``fp8-packed-prefill-s2-2tiles``)
FAST = {
    "910b": ("sfa_bf16_b4_s2_seq64K_total_int8_d",),
    "950": (
        "sfa_bf16_b64_s2_seq64K_per_fp8_d",
        "sfa_bf16_b64_s2_seq64K_per_int8_d_950",
        "sfa_bf16_b4_s2_seq64K_total_fp8_kv_split_d",
    ),
}


def npu_cases(soc: str) -> list[str]:
    """The DSA_CASES entries the NPU test runs on ``soc`` (its skip rules)."""
    return sorted(
        name
        for name, c in DSA_CASES.items()
        if soc in c.soc and (soc == "950" or not c.quant.startswith("fp8"))
    )


def shape_inputs(name: str) -> dict:
    """The case's wrapper arguments with its shapes, dtypes and lengths, and no data (see the
    module docstring); ``op`` is the wrapper's name."""
    import numpy as np
    import torch
    from tilesim.shared.models import DEEPSEEK_V32 as M

    c = DSA_CASES[name]
    nq, topk = M.num_q_heads, M.topk
    per = [math.ceil(a / BLOCK) for a in c.actual_seq]
    rows = sum(per) * BLOCK
    table = np.full((c.b, max(per)), -1, dtype=np.int32)
    start = np.cumsum([0, *per[:-1]])
    for b, n in enumerate(per):
        table[b, :n] = start[b] + np.arange(n)
    qdt = torch.int8 if c.quant == "int8" else torch.float8_e4m3fn
    t = c.b * c.s1
    bf = torch.bfloat16
    args = {
        "query_nope": torch.zeros(t * nq, 512, dtype=bf),
        "query_rope": torch.zeros(t * nq, 64, dtype=bf),
    }
    if c.layout == "kv_split":
        op = "sparse_attention_antiquant_kv_split"
        args |= {"kn_quant": torch.empty(rows, 512, dtype=qdt),
                 "kr": torch.empty(rows, 64, dtype=bf),
                 "kn_scales": torch.empty(rows, 4, dtype=torch.float32)}  # fmt: skip
    else:
        op = "sparse_attention_antiquant"
        args |= {"nope_cache": torch.empty(rows, 656, dtype=qdt), "layout": c.layout}
    args |= {
        "topk_indices": torch.zeros(t, topk, dtype=torch.int32),
        "block_table": torch.from_numpy(table),
        "kv_act_seqs": torch.tensor(c.actual_seq, dtype=torch.int32),
        "nq": nq, "n_kv": M.num_kv_heads, "softmax_scale": M.test_softmax_scale,
        "topk": topk, "block_size": BLOCK, "tiling": c.tiling,
    }  # fmt: skip
    return {
        "op": op,
        "args": args,
        "rows": rows,
        "bt_cols": max(8, 1 << (max(per) - 1).bit_length()),
    }


def compile_npu_cases(soc: str, names: list[str]) -> dict:
    """Child process: prepare and compile each case; ``{name: {"seconds", "shapes"}}`` plus
    ``"_stats"``, the compile registry's counts."""
    from tilesim.device import compile_stats, reset_compile_stats, sim
    from tilesim.device import dsa as dev

    reset_compile_stats()
    res = {}
    for name in names:
        case = shape_inputs(name)
        run = dev.prepared_launch(case["op"], **case["args"], backend="sim", soc=soc)
        tensors = [*run["inputs"], *run["outputs"]]
        seconds = sim.run_compile(run["kernel"], tensors)
        res[name] = {
            "seconds": seconds,
            "shapes": [tuple(x.shape) for x in tensors],
            "want": (case["rows"], case["bt_cols"]),
        }
    res["_stats"] = compile_stats()
    return res


def _check(r: dict, names: list[str]) -> None:
    stats = r.pop("_stats")
    assert sorted(r) == names, r
    assert sum(stats.values()) == len(names), stats  # one distinct kernel per case
    for name, got in r.items():
        c = DSA_CASES[name]
        rows, bt_cols = got["want"]
        shapes = got["shapes"]
        t = c.b * c.s1
        assert got["seconds"] > 0, name
        assert shapes[0] == (t * 128, 576), (name, shapes)  # the concatenated query
        assert shapes[1][0] == rows, (name, shapes)  # the pool's rows, compiled in
        assert shapes[-4] == (t, 2048) and shapes[-3] == (c.b, bt_cols), (name, shapes)
        assert shapes[-1] == (t * 128, 512), (name, shapes)


def _soc_params():
    return [pytest.param(s, marks=getattr(pytest.mark, f"soc_{s}"), id=s) for s in SOCS]


def _compile_and_check(soc: str, names: list[str]) -> None:
    from tilesim.device import sim

    assert names, soc
    r = sim.isolated(compile_npu_cases, soc, names, soc=soc, timeout=1800)
    _check(r, names)


@pytest.mark.sim
@pytest.mark.torch
@pytest.mark.parametrize("soc", _soc_params())
def test_dsa_kernels_compile_at_npu_test_shapes(soc):
    """The fast group (:data:`FAST`), all of them cases the NPU test runs on ``soc``."""
    assert set(FAST[soc]) <= set(npu_cases(soc)), soc
    _compile_and_check(soc, sorted(FAST[soc]))


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("soc", _soc_params())
def test_dsa_kernels_compile_at_the_other_npu_test_shapes(soc):
    """Every other case the NPU test runs on ``soc`` (910B 2 cases ~1 min, 950 10 cases ~3 min)."""
    _compile_and_check(soc, [n for n in npu_cases(soc) if n not in FAST[soc]])


@pytest.mark.torch
@pytest.mark.parametrize("name", [n for n, c in sorted(DSA_CASES.items()) if c.size == "medium"])
def test_shape_inputs_match_the_case_builder(name):
    """The data-free inputs have the shapes, dtypes and integer arguments of the real case
    (checked where building it is cheap: the medium cases)."""
    import numpy as np
    import tilesim.reference as reference
    from tilesim.shared.interop import to_numpy

    got = shape_inputs(name)
    case = reference.dsa_make_case(name)
    assert got["op"] == case["op"]
    assert sorted(got["args"]) == sorted({**case["inputs"], **case["params"]})
    for k, v in case["inputs"].items():
        g = to_numpy(got["args"][k])
        assert (g.shape, g.dtype) == (v.shape, v.dtype), k
    for k in ("block_table", "kv_act_seqs"):
        assert np.array_equal(got["args"][k].numpy() >= 0, case["inputs"][k] >= 0), k
    for k, v in case["params"].items():
        assert got["args"][k] == v, k
