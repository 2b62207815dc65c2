"""Bad input to the sparse-attention golden and its generator: a clear error naming the argument."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tilesim.reference as R
from tilesim.shared.layouts.mla_cache import unpack_rows
from tilesim.shared.tiling import SaTileShapeConfig

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def case():
    # b 2, s1 2, nq 4, topk 64, block 16: act 100 -> 7 blocks, act 20 -> 2 blocks
    return R.dsa_make_case(actual_seq=[100, 20], s1=2, nq=4, topk=64, block_size=16, seed=1)


def call(case, **over):
    inputs = {k: over.pop(k) if k in over else v for k, v in case["inputs"].items()}
    return R.sparse_attention_antiquant(**inputs, **{**case["params"], **over})


def call_split(case, **over):
    f = unpack_rows(case["inputs"]["nope_cache"], "pypto")
    inputs = {k: v for k, v in case["inputs"].items() if k != "nope_cache"}
    inputs.update(kn_quant=f.nope, kr=f.rope, kn_scales=f.scales)
    inputs = {k: over.pop(k) if k in over else v for k, v in inputs.items()}
    prm = {k: v for k, v in case["params"].items() if k != "layout"}
    return R.sparse_attention_antiquant_kv_split(**inputs, **{**prm, **over})


def test_the_fixture_runs(case):
    assert call(case).shape == (2 * 2 * 4, 512)
    assert np.array_equal(call_split(case).view(np.uint16), call(case).view(np.uint16))


@pytest.mark.parametrize(
    "over, exc, match",
    [
        ({"query_nope": "f32"}, TypeError, "query_nope: expected dtype bfloat16, got float32"),
        ({"query_nope": "cols"}, ValueError, r"query_nope: expected shape \(16, 512\) \[T\*nq"),
        ({"query_rope": "rows"}, ValueError, r"query_rope: expected shape \(16, 64\)"),
        ({"query_rope": "f32"}, TypeError, "query_rope: expected dtype bfloat16"),
        ({"query_nope": "odd_rows"}, ValueError, "query_nope: expected rows = B"),
        ({"query_nope": None}, TypeError, "query_nope: expected a numpy array or a torch tensor"),
        ({"topk_indices": "list"}, TypeError, "topk_indices: expected a numpy array or a torch"),
        ({"topk_indices": "float"}, TypeError, "topk_indices: expected an integer dtype"),
        (
            {"topk_indices": "narrow"},
            ValueError,
            r"topk_indices: expected shape \(4, 64\) \[T, n_kv",
        ),
        ({"topk_indices": "1d"}, ValueError, r"topk_indices: expected shape \(4, 64\)"),
        ({"block_table": "1d"}, ValueError, "block_table: expected a 2-D array"),
        ({"block_table": "rows"}, ValueError, r"block_table: expected shape \(2, \*\)"),
        ({"kv_act_seqs": "neg"}, ValueError, r"kv_act_seqs\[1\]: expected a value in \[0, inf\]"),
        ({"kv_act_seqs": "empty"}, ValueError, "kv_act_seqs: expected at least one batch"),
        ({"kv_act_seqs": "float"}, TypeError, "kv_act_seqs: expected an integer dtype"),
        ({"nope_cache": "bf16"}, TypeError, "nope_cache: expected dtype float8_e4m3fn or int8"),
        ({"nope_cache": "pitch672"}, ValueError, r"nope_cache: expected shape \(\*, 656\)"),
        ({"nq": 0}, ValueError, r"nq: expected an int in \[1, inf\], got 0"),
        ({"nq": True}, TypeError, "nq: expected an int, got bool"),
        ({"nq": 3}, ValueError, "query_nope: expected rows = B"),
        ({"n_kv": 2}, ValueError, "n_kv: expected 1"),
        ({"topk": 0}, ValueError, r"topk: expected an int in \[1, inf\]"),
        ({"block_size": -16}, ValueError, r"block_size: expected an int in \[1, 2147483647\]"),
        ({"softmax_scale": 0.0}, ValueError, "softmax_scale: expected a number > 0"),
        ({"softmax_scale": float("nan")}, ValueError, "softmax_scale: expected a finite number"),
        ({"softmax_scale": 1e-60}, ValueError, "softmax_scale: expected a value FP32 can hold"),
        ({"softmax_scale": "1/24"}, TypeError, "softmax_scale: expected a real number"),
        ({"tiling": (128, 512)}, TypeError, "tiling: expected a SaTileShapeConfig"),
        ({"trace": 3}, TypeError, "trace: expected a callable or None"),
        ({"progress": 1}, TypeError, "progress: expected a bool"),
        ({"layout": "vllm"}, ValueError, "layout: expected one of"),
    ],
)
def test_bad_arguments(case, over, exc, match):
    inp = case["inputs"]
    bad = {
        ("query_nope", "f32"): inp["query_nope"].astype(np.float32),
        ("query_nope", "cols"): inp["query_nope"][:, :256],
        ("query_nope", "odd_rows"): inp["query_nope"][:-4],
        ("query_rope", "rows"): inp["query_rope"][:-4],
        ("query_rope", "f32"): inp["query_rope"].astype(np.float32),
        ("topk_indices", "float"): inp["topk_indices"].astype(np.float32),
        ("topk_indices", "list"): inp["topk_indices"].tolist(),
        ("topk_indices", "narrow"): inp["topk_indices"][:, :32],
        ("topk_indices", "1d"): inp["topk_indices"].reshape(-1),
        ("block_table", "1d"): inp["block_table"].reshape(-1),
        ("block_table", "rows"): inp["block_table"][:1],
        ("kv_act_seqs", "neg"): np.array([100, -1], dtype=np.int32),
        ("kv_act_seqs", "empty"): np.zeros(0, dtype=np.int32),
        ("kv_act_seqs", "float"): inp["kv_act_seqs"].astype(np.float64),
        ("nope_cache", "bf16"): inp["nope_cache"].view(np.uint16).view(BF16),
        ("nope_cache", "pitch672"): np.zeros((inp["nope_cache"].shape[0], 672), np.int8),
    }
    if over.get("query_nope") == "odd_rows":
        over["query_rope"] = inp["query_rope"][:-4]
    over = {k: bad.get((k, v), v) if isinstance(v, str) else v for k, v in over.items()}
    with pytest.raises(exc, match=match):
        call(case, **over)


@pytest.mark.parametrize(
    "name, make, exc, match",
    [
        ("kn_quant", lambda f: f.nope.view(np.uint8), TypeError, "kn_quant: expected dtype float8"),
        ("kn_quant", lambda f: f.nope[:, :256], ValueError, r"kn_quant: expected shape"),
        ("kr", lambda f: f.rope.astype(np.float32), TypeError, "kr: expected dtype bfloat16"),
        ("kr", lambda f: f.rope[:-1], ValueError, r"kr: expected shape"),
        ("kn_scales", lambda f: f.scales.astype(np.float64), TypeError, "kn_scales: expected dt"),
        ("kn_scales", lambda f: f.scales[:, :2], ValueError, r"kn_scales: expected shape"),
    ],
)
def test_bad_split_tensors(case, name, make, exc, match):
    f = unpack_rows(case["inputs"]["nope_cache"], "pypto")
    with pytest.raises(exc, match=match):
        call_split(case, **{name: make(f)})


def _with_entry(case, row, col, value, **more):
    ti = case["inputs"]["topk_indices"].copy()
    ti[row, col] = value
    return dict(topk_indices=ti, **more)


def test_negative_index_other_than_minus_one(case):
    with pytest.raises(ValueError, match=r"topk_indices\[0, 3\] = -2 .*position >= 0 or -1"):
        call(case, **_with_entry(case, 0, 3, -2))


def test_index_outside_the_sequence(case):
    # batch 1 has act 20: position 20 is outside even though its block (1) exists
    with pytest.raises(ValueError, match=r"topk_indices\[2, 5\] = 20 \(batch 1.*outside the seq"):
        call(case, **_with_entry(case, 2, 5, 20))


def test_length_beyond_the_block_table(case):
    # the table has 7 columns = 112 positions: a longer sequence has keys no block holds, so
    # it is refused before any index is looked at (an index past the table is then unreachable)
    acts = np.array([100, 200], dtype=np.int32)
    with pytest.raises(ValueError, match=r"kv_act_seqs\[1\]: expected a value in \[0, 112\]"):
        call(case, kv_act_seqs=acts, **_with_entry(case, 3, 0, 150))


def test_needed_block_table_entry_is_minus_one(case):
    acts = np.array([100, 100], dtype=np.int32)  # batch 1 only owns 2 blocks; block 3 is -1
    with pytest.raises(ValueError, match=r"needs block_table\[1, 3\] = -1"):
        call(case, kv_act_seqs=acts, **_with_entry(case, 2, 0, 50))


def test_physical_row_outside_the_cache(case):
    bt = case["inputs"]["block_table"].copy()
    bt[0, 0] = 10_000
    with pytest.raises(
        ValueError,
        match=r"needs block_table\[0, 0\] = 10000 \(expected a physical block < \d+: the cache "
        r"has 144 rows\)",
    ):
        call(case, block_table=bt)


def test_unused_bad_entries_are_fine(case):
    """-1 in block_table for blocks nobody reads and garbage past cur_seq raise nothing."""
    ti = case["inputs"]["topk_indices"].copy()
    ti[2, 19:] = -7  # batch 1, s 0: cur_seq = min(20 - 2 + 1 + 0, 64) = 19
    ti[3, 20:] = 999  # batch 1, s 1: cur_seq = 20
    out = call(case, topk_indices=ti)
    assert np.array_equal(out.view(np.uint16), call(case).view(np.uint16))


def test_errors_leave_inputs_untouched(case):
    snap = {k: v.copy() for k, v in case["inputs"].items()}
    with pytest.raises(ValueError):
        call(case, **_with_entry(case, 0, 0, -3))
    for k, v in case["inputs"].items():
        assert np.array_equal(v.view(np.uint8), snap[k].view(np.uint8))


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"name": "sfa_nope"}, ValueError, "name: unknown case 'sfa_nope'"),
        ({"batch": 3}, TypeError, r"unknown parameter\(s\) \['batch'\]"),
        ({"quant": "fp4"}, ValueError, "quant: expected one of"),
        ({"layout": "paged"}, ValueError, "layout: expected one of"),
        ({"topk_rule": "random"}, ValueError, "topk_rule: expected one of"),
        ({"invalid_frac": 1.5}, ValueError, "invalid_frac: expected a fraction"),
        ({"seed": -1}, ValueError, r"seed: expected an int in \[0, inf\]"),
        ({"seed": 1.5}, TypeError, "seed: expected an int"),
        ({"actual_seq": [10, -1]}, ValueError, "actual_seq: expected lengths >= 0"),
        ({"actual_seq": [10, 20], "b": 3}, ValueError, "actual_seq: expected 3 lengths"),
        ({"actual_seq": []}, ValueError, "actual_seq: expected at least one batch"),
        ({"s1": 0}, ValueError, r"s1: expected an int in \[1, inf\]"),
        ({"progress": "yes"}, TypeError, "progress: expected a bool"),
        ({"poison_unreached": 1}, TypeError, "poison_unreached: expected a bool"),
        ({"tiling": "decode"}, TypeError, "tiling: expected a SaTileShapeConfig"),
        ({"n_kv": 2}, ValueError, "n_kv: expected 1"),
        ({"tile_config": SaTileShapeConfig.decode()}, TypeError, "unknown parameter"),
        ({"preset": "train"}, ValueError, "preset: expected 'decode' or 'prefill'"),
    ],
)
def test_bad_generator_arguments(kwargs, exc, match):
    kwargs = dict(kwargs)
    name = kwargs.pop("name", None)
    with pytest.raises(exc, match=match):
        R.dsa_make_case(name, **kwargs)


def test_generator_accepts_a_tiling():
    cfg = SaTileShapeConfig.prefill().replace(s_kv_tile=64)
    kw = dict(actual_seq=[30], s1=1, nq=2, topk=64, block_size=16)
    c = R.dsa_make_case(**kw, tiling=cfg)
    assert c["params"]["tiling"] is cfg and "tile_config" not in c["params"]


@pytest.mark.parametrize("entry", [2**62, 2**55 + 3, 2**63 - 1])
def test_block_table_entries_that_would_overflow_int64_are_refused(entry):
    """``entry * block_size`` would wrap around in int64 and land inside the cache; the entry
    is range-checked before the multiply (reference and wrapper share the check)."""
    from tilesim.reference import dsa_make_case, sparse_attention_antiquant

    case = dsa_make_case(None, seed=1)
    bt = case["inputs"]["block_table"].astype(np.int64).copy()
    bt[0, 0] = entry
    with pytest.raises(
        ValueError, match=r"block_table\[0, 0\] = \d+ \(expected a physical block <"
    ):
        sparse_attention_antiquant(**{**case["inputs"], "block_table": bt}, **case["params"])
