"""The sparse-attention case generator: the seeds' recipe, the named matrix, speed and memory."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
import tilesim.reference as R
from tilesim.reference.cases import dsa as C
from tilesim.shared.layouts.mla_cache import unpack_kv_split, unpack_rows
from tilesim.shared.quant import (
    quantize_latent_fp8,
    quantize_latent_fp8_ue8m0,
    quantize_latent_int8,
)
from tilesim.shared.registry.case_schema import CASE_KEYS, CaseInfo
from tilesim.shared.tiling import SaTileShapeConfig

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def _direct_quant(quant, x):
    if quant == "fp8":
        return quantize_latent_fp8(x)
    if quant == "fp8_ue8m0":
        return quantize_latent_fp8_ue8m0(x)
    if quant == "int8":
        return quantize_latent_int8(x)
    q8, s = quantize_latent_int8(x)  # fp8_int8grid: integers, then E4M3 (RNE)
    return q8.astype(np.float32).astype(FP8), s


@pytest.mark.parametrize("quant", C.QUANT_RULES)
def test_table_quantization_equals_the_shared_quantizers(quant):
    """The lookup-table path == the shared quantizer on the same BF16 values, bit for bit,
    including groups with small amax (few distinct bytes) and all-zero groups."""
    rng = np.random.default_rng(5)
    u = rng.integers(0, 256, size=(3000, 512), dtype=np.uint8)
    u[:500] = rng.integers(126, 131, size=(500, 512), dtype=np.uint8)  # tiny |j|: A <= 2
    u[500:600, :128] = 0  # zero group
    u[600:700, 128:256] = 128  # j = -128 only (amax index 128)
    q, s = C.quantize_grid_rows(u, quant)
    x = (u.view(np.int8).astype(np.float32) / np.float32(128)).astype(BF16)
    q_ref, s_ref = _direct_quant(quant, x)
    assert q.dtype == q_ref.dtype
    assert np.array_equal(q.view(np.uint8), q_ref.view(np.uint8))
    assert np.array_equal(s.view(np.uint32), s_ref.view(np.uint32))


def test_grid_values_are_uniform_bf16_in_minus_one_one():
    c = R.dsa_make_case(actual_seq=[50], s1=1, nq=128, seed=3)
    q = c["inputs"]["query_nope"].astype(np.float64)
    assert q.min() >= -1 and q.max() < 1
    j = q * 128
    assert np.array_equal(j, np.round(j))
    counts = np.bincount((j + 128).astype(int).ravel(), minlength=256)
    assert counts.min() > 0.8 * counts.mean()  # all 256 values, roughly equally often


def test_cache_bytes_do_not_depend_on_chunking_or_topk_rule():
    kw = dict(actual_seq=[900, 300], s1=2, nq=4, topk=256, block_size=16, seed=6)
    a = R.dsa_make_case(**kw)
    b = R.dsa_make_case(chunk_rows=7, topk_rule="causal", **kw)
    assert np.array_equal(
        a["inputs"]["nope_cache"].view(np.uint8), b["inputs"]["nope_cache"].view(np.uint8)
    )
    assert np.array_equal(
        a["inputs"]["query_nope"].view(np.uint16), b["inputs"]["query_nope"].view(np.uint16)
    )
    assert not np.array_equal(a["inputs"]["topk_indices"], b["inputs"]["topk_indices"])


def test_same_seed_same_bytes_other_seed_other_bytes():
    kw = dict(actual_seq=[300], s1=2, nq=4, topk=256, block_size=16)
    a, b, c = (
        R.dsa_make_case(seed=1, **kw),
        R.dsa_make_case(seed=1, **kw),
        R.dsa_make_case(seed=2, **kw),
    )
    for k in a["inputs"]:
        assert np.array_equal(a["inputs"][k].view(np.uint8), b["inputs"][k].view(np.uint8)), k
    assert not np.array_equal(
        a["inputs"]["nope_cache"].view(np.uint8), c["inputs"]["nope_cache"].view(np.uint8)
    )


def test_layout_and_quant_fields():
    kw = dict(actual_seq=[200], s1=1, nq=4, topk=128, block_size=16, seed=4)
    fields = {}
    for layout in ("pypto", "flashmla"):
        c = R.dsa_make_case(layout=layout, **kw)
        assert c["op"] == "sparse_attention_antiquant" and c["params"]["layout"] == layout
        fields[layout] = unpack_rows(c["inputs"]["nope_cache"], layout)
    c = R.dsa_make_case(layout="kv_split", **kw)
    assert c["op"] == "sparse_attention_antiquant_kv_split" and "layout" not in c["params"]
    fields["kv_split"] = unpack_kv_split(
        c["inputs"]["kn_quant"], c["inputs"]["kr"], c["inputs"]["kn_scales"]
    )
    for k in ("flashmla", "kv_split"):
        for a, b in zip(fields["pypto"], fields[k], strict=True):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    assert R.dsa_make_case(quant="int8", **kw)["inputs"]["nope_cache"].dtype == np.int8
    ue = unpack_rows(R.dsa_make_case(quant="fp8_ue8m0", **kw)["inputs"]["nope_cache"], "pypto")
    m, _ = np.frexp(ue.scales)
    assert (m == 0.5).all()  # powers of two


def test_block_table_seeds_rule():
    acts = [65536, 16381, 666, 15]
    bt, n = C.build_block_table(acts, 128, np.random.default_rng(0))
    per = [math.ceil(a / 128) for a in acts]
    assert n == sum(per) == 647 and bt.shape == (4, 512) and bt.dtype == np.int32
    used = np.concatenate([bt[b, :k] for b, k in enumerate(per)])
    assert np.array_equal(np.sort(used), np.arange(647))  # a permutation of all blocks
    for b, k in enumerate(per):
        assert (bt[b, k:] == -1).all()
    assert not np.array_equal(used, np.arange(647))  # shuffled


def test_topk_seeds_rule():
    ti = C.build_topk_indices([4096, 700, 1], 2, 2048, "seeds", np.random.default_rng(0))
    assert ti.shape == (6, 2048) and ti.dtype == np.int32
    for r in (0, 1):
        assert np.array_equal(np.sort(ti[r]), np.arange(2048))
    assert not np.array_equal(ti[0], ti[1])  # fresh permutation per token
    for r in (2, 3):
        assert np.array_equal(ti[r, :700], np.arange(700)) and (ti[r, 700:] == 0).all()
    assert ti[4, 0] == 0 and (ti[5] == 0).all()


def test_topk_causal_rule_covers_the_whole_range():
    acts, s1, topk = [50_000, 100, 1], 4, 256
    ti = C.build_topk_indices(acts, s1, topk, "causal", np.random.default_rng(0))
    for b, act in enumerate(acts):
        for s in range(s1):
            span = max(act - s1 + 1 + s, 0)
            cur = min(span, topk)
            row = ti[b * s1 + s]
            assert (row[cur:] == -1).all()
            used = row[:cur]
            assert len(set(used.tolist())) == cur and (used >= 0).all() and (used < span).all()
    assert ti[0, :256].max() > 40_000  # far beyond the first topk positions


def test_invalid_fraction_marks_used_entries():
    c = R.dsa_make_case(actual_seq=[5000], s1=1, nq=2, topk=2048, invalid_frac=0.25, seed=3)
    frac = (c["inputs"]["topk_indices"] == -1).mean()
    assert 0.2 < frac < 0.3


def test_poisoning_hits_exactly_the_unreached_rows():
    c = R.dsa_make_case(actual_seq=[600, 40], s1=2, nq=4, topk=256, block_size=16,
                        poison_unreached=True, seed=2)  # fmt: skip
    f = unpack_rows(c["inputs"]["nope_cache"], "pypto")
    poisoned = np.isnan(f.scales).all(axis=1)
    assert poisoned.sum() == c["meta"]["poisoned_rows"] > 0
    assert np.isnan(f.rope[poisoned].astype(np.float32)).all()
    assert np.isnan(f.nope[poisoned].astype(np.float32)).all()
    assert np.isfinite(f.scales[~poisoned]).all()
    # batch 0 (act 600 >= topk) reaches positions 0..255 only; batch 1 reaches 0..39
    bt = c["inputs"]["block_table"]
    reached = {int(bt[0, p // 16]) * 16 + p % 16 for p in range(256)}
    reached |= {int(bt[1, p // 16]) * 16 + p % 16 for p in range(40)}
    assert set(np.flatnonzero(~poisoned).tolist()) == reached


def test_named_cases_match_the_seeds_matrix():
    cases = R.DSA_CASES
    P, G, PT, ON, SL, SP = (
        "sfa_bf16_",
        "fp8_int8grid",
        "per_tile",
        "online",
        "skip: large",
        "skip: perf",
    )
    expect = {  # name: (b, s1, blocks, table width, quant, softmax, s_kv_tile, status)
        P + "b4_s2_seq64K_total_fp8_d": (4, 2, 647, 512, "fp8", PT, 2048, "runs"),
        P + "b4_s2_seq64K_per_fp8_d": (4, 2, 2048, 512, "fp8", ON, 512, SL),
        P + "b64_s2_seq64K_per_fp8_d": (64, 2, 32768, 512, "fp8", ON, 512, "runs"),
        P + "b64_s2_seq64K_uniform_per_fp8_d": (64, 2, 32768, 896, "fp8", ON, 512, SL),
        P + "b1_s256_seq64K_fp8_p": (1, 256, 512, 512, "fp8", PT, 2048, SL),
        P + "b4_s2_seq64K_total_int8_d": (4, 2, 647, 512, "int8", PT, 2048, "runs"),
        P + "b4_s2_seq64K_per_int8_d": (4, 2, 2048, 512, "int8", PT, 2048, SP),
        P + "b1_s256_seq64K_int8_p": (1, 256, 512, 512, "int8", PT, 2048, SL),
        P + "b64_s2_seq64K_uniform_per_int8_d_950": (64, 2, 32768, 896, "int8", ON, 512, SL),
        P + "b4_s2_seq64K_per_int8_d_950": (4, 2, 2048, 512, "int8", ON, 512, SL),
        P + "b64_s2_seq64K_per_int8_d_950": (64, 2, 32768, 512, "int8", ON, 512, "runs"),
        P + "b4_s2_seq64K_total_fp8_kv_split_d": (4, 2, 647, 512, G, PT, 2048, "runs"),
        P + "b4_s2_seq64K_per_fp8_kv_split_d": (4, 2, 2048, 512, G, PT, 2048, SP),
        P + "b1_s256_seq64K_fp8_kv_split_p": (1, 256, 512, 512, G, PT, 2048, SL),
    }  # fmt: skip
    assert set(cases) == set(expect)
    for name, (b, s1, blocks, width, quant, softmax, tile, status) in expect.items():
        c = cases[name]
        assert (c.b, c.s1, c.quant, c.status) == (b, s1, quant, status), name
        assert len(c.actual_seq) == b
        assert sum(math.ceil(a / 128) for a in c.actual_seq) == blocks, name
        assert math.ceil(max(c.actual_seq) / 128) == width, name
        assert (c.tiling.softmax, c.tiling.s_kv_tile) == (softmax, tile), name
        assert not hasattr(c, "tile_config")  # the removed alias
        assert c.tolerance == {"atol": 1e-4, "rtol": 5e-3, "ratio": 0.005}
        assert "950" in c.soc
    uni = cases["sfa_bf16_b64_s2_seq64K_uniform_per_fp8_d"].actual_seq
    assert sorted(set(uni)) == [16384 * k for k in (1, 2, 3, 4, 5, 6, 7)]
    assert uni.count(65536) == 16


def test_small_named_case_is_runnable_as_documented():
    c = R.dsa_make_case("sfa_bf16_b4_s2_seq64K_total_int8_d", seed=1)
    assert tuple(c) == CASE_KEYS
    assert c["name"] == "sfa_bf16_b4_s2_seq64K_total_int8_d"
    assert c["op"] == "sparse_attention_antiquant"
    assert c["params"]["tiling"] == SaTileShapeConfig.prefill()
    assert c["tolerance"] == {"atol": 1e-4, "rtol": 5e-3, "ratio": 0.005, "mode": "compare"}
    assert c["meta"]["seed"] == 1 and c["meta"]["soc"] == ("950", "910b")
    assert c["meta"]["status"] == "runs"
    assert c["meta"]["entry"] == "sparse_attention_antiquant_d"
    assert c["inputs"]["nope_cache"].shape == (647 * 128, 656)
    assert c["inputs"]["topk_indices"].shape == (8, 2048)
    out = getattr(R, c["op"])(**c["inputs"], **c["params"])
    assert out.shape == (1024, 512) and out.dtype == BF16
    json.dumps(c["meta"])  # plain data


def test_case_info_describes_every_named_case():
    assert set(C.CASE_INFO) == set(C.DSA_CASES)
    for name, info in C.CASE_INFO.items():
        spec = C.DSA_CASES[name]
        assert isinstance(info, CaseInfo) and info.name == name and info.family == "dsa"
        assert info.op == ("sparse_attention_antiquant_kv_split" if spec.layout == "kv_split"
                           else "sparse_attention_antiquant")  # fmt: skip
        assert (info.soc, info.status, info.seed) == (spec.soc, spec.status, 0)
        assert info.size == ("medium" if "total" in name else "large")
        assert info.tolerance == {"atol": 1e-4, "rtol": 5e-3, "ratio": 0.005, "mode": "compare"}
        assert "seed_note" in info.notes and info.model == "DeepSeek-V3.2"
        module, func = info.builder.split(":")
        assert getattr(importlib.import_module(module), func) is R.dsa_make_case
    # the summary states the shape written out by hand for two cases
    total = C.CASE_INFO["sfa_bf16_b4_s2_seq64K_total_fp8_kv_split_d"].summary
    assert total == (
        "b 4, s1 2, nq 128, act [65536,16381,666,15], 647 blocks, FP8 (INT8-grid quirk) "
        "kv_split tensors, per-tile softmax, s_kv_tile 2048 (seeds' entry "
        "sparse_attention_antiquant_kv_split_d)"
    )
    uni = C.CASE_INFO["sfa_bf16_b64_s2_seq64K_uniform_per_int8_d_950"].summary
    assert uni.startswith("b 64, s1 2, nq 128, act 8x16K,8x32K,8x48K,16x64K,8x80K,8x96K,8x112K, ")
    assert "32768 blocks, INT8 pypto packed cache, online softmax, s_kv_tile 512" in uni


def test_progress_is_validated_and_accepted():
    kw = dict(actual_seq=[30], s1=1, nq=2, topk=64, block_size=16)
    for progress in (None, False, True):
        assert R.dsa_make_case(**kw, progress=progress)["op"] == "sparse_attention_antiquant"
    with pytest.raises(TypeError, match="progress: expected a bool"):
        R.dsa_make_case(**kw, progress=1)


_BIG = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import tilesim.reference as R
    t0 = time.perf_counter()
    c = R.dsa_make_case(sys.argv[1], progress=False)
    t1 = time.perf_counter()
    out = getattr(R, c["op"])(**c["inputs"], **c["params"], progress=False)
    t2 = time.perf_counter()
    # VmHWM: peak RSS of this process image (ru_maxrss would carry the parent's peak over exec)
    hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM")][0].split()[1]
    print(json.dumps({"build_s": t1 - t0, "run_s": t2 - t1,
                      "finite": bool(np.isfinite(out.astype(np.float32)).all()),
                      "rss_kb": int(hwm)}))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    ["sfa_bf16_b64_s2_seq64K_per_fp8_d", "sfa_bf16_b64_s2_seq64K_uniform_per_int8_d_950"],
)
def test_large_case_fits_8_gib(name):
    """Build + run of a 64-batch case (4.2M cache rows) in a fresh process: < 8 GiB peak RSS,
    output finite. Its wall time is the bench's to measure (docs/perf/reference.md), not a
    test's: a time bound fails on a loaded machine."""
    res = subprocess.run(
        [sys.executable, "-c", _BIG, name], capture_output=True, text=True, check=True
    )
    stats = json.loads(res.stdout.strip().splitlines()[-1])
    print(name, stats)
    assert stats["finite"]
    assert stats["rss_kb"] < 8 * 1024 * 1024
