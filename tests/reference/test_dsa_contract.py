"""The one-contract shape of the DeepSeek-V3.2 sparse attention (``tilesim.shared.dsa``).

``check_meta`` reads metadata only (it runs on ``meta`` tensors, which hold no data),
``check_values`` catches what needs the data, ``host_plan`` plans the physical rows and the
split, and ``cost`` is the one FLOP / byte counter (hand counts here, not the code's formula).
"""

from __future__ import annotations

import numpy as np
import pytest
import tilesim.reference as R
from tilesim.shared import dsa
from tilesim.shared.layouts import dsa_split_rule
from tilesim.shared.tiling import SaTileShapeConfig

SMALL = dict(nq=2, topk=8, block_size=4)


def _case(**over):
    return R.dsa_make_case(None, seed=3, actual_seq=[10, 6], s1=1, **{**SMALL, **over})


def _meta_args(case, **inputs):
    inp, prm = {**case["inputs"], **inputs}, case["params"]
    cache = (inp["nope_cache"],) if "nope_cache" in inp else (inp["kn_quant"], inp["kr"],
                                                               inp["kn_scales"])  # fmt: skip
    return dsa.check_meta(
        inp["query_nope"], inp["query_rope"], cache, inp["topk_indices"], inp["block_table"],
        inp["kv_act_seqs"], layout=prm.get("layout", "kv_split"), nq=prm["nq"], n_kv=1,
        softmax_scale=prm["softmax_scale"], topk=prm["topk"], block_size=prm["block_size"],
        tiling=prm["tiling"],
    )  # fmt: skip


def test_the_contract_module_exports_the_five_things():
    for name in ("Args", "check_meta", "check_values", "host_plan", "cost"):
        assert name in dsa.__all__ and hasattr(dsa, name), name
    assert "tile_config" not in dsa.resolve_tiling.__code__.co_varnames


@pytest.mark.parametrize("layout", ["pypto", "kv_split"])
def test_check_meta_runs_on_meta_tensors(layout):
    torch = pytest.importorskip("torch")
    case = _case(layout=layout)

    def meta(x):
        dt = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn}.get(
            x.dtype.name, getattr(torch, x.dtype.name, None)
        )
        return torch.empty(x.shape, dtype=dt, device="meta")

    inputs = {k: meta(v) for k, v in case["inputs"].items()}
    a = _meta_args(case, **inputs)
    assert isinstance(a, dsa.Args) and not a.values
    cache = case["inputs"]["nope_cache" if layout == "pypto" else "kn_quant"]
    assert (a.n_b, a.s1, a.rows, a.cache_rows) == (2, 1, 4, cache.shape[0])
    assert a.quant == "fp8" and a.topk_indices is inputs["topk_indices"]
    # a wrong dtype is still caught without data
    bad = {**inputs, "topk_indices": inputs["topk_indices"].to(torch.float32)}
    with pytest.raises(TypeError, match="topk_indices: expected an integer dtype"):
        _meta_args(case, **bad)


def test_check_values_catches_what_check_meta_cannot():
    case = _case()
    ti = case["inputs"]["topk_indices"].copy()
    ti[0, 0] = 10  # position 10 of a 10-key sequence: outside it
    a = _meta_args(case, topk_indices=ti)  # shapes and dtypes are fine
    with pytest.raises(ValueError, match=r"topk_indices\[0, 0\] = 10 .*outside the sequence"):
        dsa.check_values(a)
    acts = case["inputs"]["kv_act_seqs"].copy()
    acts[1] = -1
    a = _meta_args(case, kv_act_seqs=acts)
    with pytest.raises(ValueError, match="kv_act_seqs"):
        dsa.check_values(a)
    with pytest.raises(TypeError, match="args: host_plan needs the Args of check_values"):
        dsa.host_plan(_meta_args(case))


def test_host_plan_maps_positions_to_physical_rows():
    case = _case()
    a = dsa.check_values(_meta_args(case))
    plan = dsa.host_plan(a)
    ti, bt = case["inputs"]["topk_indices"], case["inputs"]["block_table"]
    # by hand: row = block_table[b, p // 4] * 4 + p % 4 for the used, non -1 entries
    for r in range(2):
        cur = min(int(case["inputs"]["kv_act_seqs"][r]), 8)
        assert plan.cur_seq[r] == cur
        for c in range(8):
            p = int(ti[r, c])
            want = -1 if c >= cur or p == -1 else int(bt[r, p // 4]) * 4 + p % 4
            assert plan.phys[r, c] == want
    assert plan.tiles_per_split == dsa_split_rule.kv_tiles(8, a.tiling.s_kv_tile)


def test_cost_counts_by_hand():
    ti = np.array([[0, 1, -1, 3], [5, -1, -1, -1]], dtype=np.int32)
    acts = np.array([10, 6], dtype=np.int32)
    c = dsa.cost_of_indices(ti, acts, nq=2, topk=4, s1=1, g_tile=1)
    # 4 used entries (all columns), 3 of them not -1
    assert (c["keys"], c["attended"]) == (8, 4)
    assert c["flop"] == 2 * 2 * 4 * (576 + 512)
    qo = 2 * 2 * (576 + 512) * 2  # 2 tokens x 2 heads, BF16 Q in and O out
    assert c["bytes"] == qo + 4 * 656
    assert c["kernel_flop"] == 2 * (2 * 1 * 8 * (576 + 512))  # 2 group tiles of 1 head
    assert c["kernel_bytes"] == qo + 2 * 8 * (656 + 4)


def test_the_two_old_counters_are_thin_calls_of_cost():
    from tilesim.reference.dsa import sparse_attention_cost

    case = _case()
    ti, acts = case["inputs"]["topk_indices"], case["inputs"]["kv_act_seqs"]
    c = dsa.cost_of_indices(ti, acts, nq=2, topk=8)
    old = sparse_attention_cost(ti, acts, nq=2, topk=8)
    assert old == {k: c[k] for k in ("flop", "attended", "bytes", "unique_kv_bytes")}


def test_tiling_none_is_one_rule():
    assert dsa.resolve_tiling(None) == SaTileShapeConfig.from_env()
    with pytest.raises(TypeError, match="tiling: expected a SaTileShapeConfig"):
        dsa.resolve_tiling((128, 512))


def test_a_packed_op_with_the_split_layout_names_the_layout():
    """``layout="kv_split"`` on the packed op (one ``nope_cache``) is a ``ValueError`` naming
    ``layout`` and the packed layouts, raised by the contract before any work -- not an
    internal error from the split cache's checks."""
    case = _case(layout="pypto")
    with pytest.raises(ValueError, match=r"^layout: expected one of \('pypto', 'flashmla'\)"):
        R.sparse_attention_antiquant(**case["inputs"], **{**case["params"], "layout": "kv_split"})
