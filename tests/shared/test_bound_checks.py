"""Sizes at the edge of the input policy: each fails with a ``ValueError`` that names the
argument, the bound and where the bound comes from, before any work or allocation.

* ``build_msa_block_mask``: a huge ``n`` (a typo) meets a bound check on ``n``
  (``MAX_PREFILL_ROWS``) and one on the mask's element count, not a ``MemoryError`` from the
  ``[ceil(n/bk), topk, bk, bk]`` allocation.
* ``sparse_attention_antiquant`` with a ``block_size`` that does not match the cache's block
  layout: the capacity check on ``kv_act_seqs`` names ``block_size``, the block table's
  width it multiplies and the cache's row count.
* The argument lists the goldens and the wrappers write out (held equal to their contract's
  prototypes by tests/test_op_records.py): the published signatures are the parameter lists
  written out here, and a wrong call fails as Python's own does, naming the op.

Oracles: the bounds are recomputed here from the case's shapes (table width times the
``block_size`` passed), not read from the code under test.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tilesim.reference as R
from tilesim.shared import dsa
from tilesim.shared.msa_main import MAX_PREFILL_ROWS, build_msa_block_mask
from tilesim.shared.validate import MAX_ELEMENTS


# ----------------------------------------------------------------------------- MSA block mask
@pytest.mark.parametrize("n", [2**40, MAX_PREFILL_ROWS + 1])
def test_block_mask_refuses_a_huge_n_by_name_and_bound(n):
    msg = rf"n: expected an int in \[1, {MAX_PREFILL_ROWS}\] \(MAX_PREFILL_ROWS of tilesim\."
    with pytest.raises(ValueError, match=msg + rf".*\), got {n}$"):
        build_msa_block_mask(n, np.array([0]))


def test_block_mask_at_the_row_bound_is_refused_only_for_its_element_count():
    # n = MAX_PREFILL_ROWS passes the row bound; bk = 2**20 makes 16 * 2**40 mask elements
    n, bk, topk = MAX_PREFILL_ROWS, 2**20, 16
    count = 1 * topk * bk * bk
    assert count > MAX_ELEMENTS
    with pytest.raises(ValueError, match=rf"^n, topk, bk: expected at most {MAX_ELEMENTS} .*"
                       rf"\({count} elements\)$"):  # fmt: skip
        build_msa_block_mask(n, np.array([0]), bk=bk, topk=topk)


def test_block_mask_small_n_still_builds_and_zero_keeps_its_message():
    m = build_msa_block_mask(5, np.array([0]), bk=4, topk=2)
    assert m.shape == (2, 2, 4, 4) and m.dtype == np.float32
    with pytest.raises(ValueError, match=r"^n: expected an int in \[1, inf\], got 0$"):
        build_msa_block_mask(0, np.array([0]))


# ----------------------------------------------------------------------------- DSA block_size
def _dsa_case(layout="pypto"):
    # a cache laid out in blocks of 128; token 0 attends 300 keys (3 blocks)
    return R.dsa_make_case(
        None, seed=3, actual_seq=[300, 6], s1=1, nq=2, topk=8, block_size=128, layout=layout
    )


def _capacity_message(case, block_size):
    width = case["inputs"]["block_table"].shape[1]
    rows = (case["inputs"].get("nope_cache", case["inputs"].get("kn_quant"))).shape[0]
    fit = "" if rows % block_size == 0 else ", not a multiple of block_size"
    return (
        f"kv_act_seqs[0]: expected a value in [0, {width * block_size}] (block_table width "
        f"{width} blocks * block_size {block_size}; the cache holds {rows} rows{fit}: check "
        f"block_size against the cache's block layout), got 300"
    )


@pytest.mark.parametrize("layout", ["pypto", "kv_split"])
@pytest.mark.parametrize("block_size", [7, 64])
def test_wrong_block_size_names_block_size_table_width_and_cache_rows(layout, block_size):
    case = _dsa_case(layout)
    assert case["inputs"]["block_table"].shape[1] == 3  # the shape the message is about
    params = {**case["params"], "block_size": block_size}
    op = R.sparse_attention_antiquant_kv_split if layout == "kv_split" else (
        R.sparse_attention_antiquant)  # fmt: skip
    before = {k: v.copy() for k, v in case["inputs"].items()}
    with pytest.raises(ValueError, match=f"^{re.escape(_capacity_message(case, block_size))}$"):
        op(**case["inputs"], **params)
    for k, v in case["inputs"].items():  # nothing the caller passed is written
        np.testing.assert_array_equal(v.view(np.uint8), before[k].view(np.uint8))


def test_the_device_wrapper_fails_the_same_check_before_any_kernel():
    pytest.importorskip("torch")
    from tilesim.device.dsa import sparse_attention_antiquant

    case = _dsa_case()
    params = {**case["params"], "block_size": 7}
    with pytest.raises(ValueError, match=f"^{re.escape(_capacity_message(case, 7))}$"):
        sparse_attention_antiquant(**case["inputs"], **params, backend="sim")


def test_check_values_accepts_a_length_at_the_capacity():
    case = _dsa_case()
    inp, prm = case["inputs"], case["params"]
    acts = inp["kv_act_seqs"].copy()
    acts[0] = 3 * 128  # exactly the table's capacity: allowed
    a = dsa.check_meta(
        inp["query_nope"], inp["query_rope"], (inp["nope_cache"],), inp["topk_indices"],
        inp["block_table"], acts, layout="pypto", nq=prm["nq"], n_kv=1,
        softmax_scale=prm["softmax_scale"], topk=prm["topk"], block_size=128,
        tiling=prm["tiling"],
    )  # fmt: skip
    assert dsa.check_values(a).values
    acts[0] += 1
    with pytest.raises(ValueError, match=r"^kv_act_seqs\[0\]: expected a value in \[0, 384\] "):
        dsa.check_values(a._replace(kv_act_seqs=acts))


# ----------------------------------------------------------------------------- argument lists
_DSA_ARRAYS = ["query_nope", "query_rope", "nope_cache", "topk_indices", "block_table",
               "kv_act_seqs"]  # fmt: skip
_DSA_SIZES = [("nq", 128), ("n_kv", 1), ("softmax_scale", None), ("topk", 2048),
              ("block_size", 128), ("tiling", None)]  # fmt: skip
_DEVICE = [("out", None), ("backend", "auto"), ("soc", "910b"), ("validate", True)]
#: op -> (positional parameters, golden keywords, wrapper keywords) as (name, default)
_SIGNATURES = {
    "sparse_attention_antiquant": (
        _DSA_ARRAYS,
        [*_DSA_SIZES, ("layout", "pypto"), ("accumulation", "exact"), ("trace", None),
         ("progress", None)],
        [*_DSA_SIZES, ("layout", "pypto"), *_DEVICE, ("unmasked", False)],
    ),
    "sparse_attention_antiquant_kv_split": (
        ["query_nope", "query_rope", "kn_quant", "kr", "kn_scales", *_DSA_ARRAYS[3:]],
        [*_DSA_SIZES, ("accumulation", "exact"), ("trace", None), ("progress", None)],
        [*_DSA_SIZES, *_DEVICE, ("unmasked", False)],
    ),
    "moe_grouped_gemm": (
        ["sorted_tokens", "weights", "expert_cumsum", "dims"],
        [("tiling", None), ("out", None), ("round_activation", True), ("trace", None)],
        [("tiling", None), ("out", None), ("round_activation", True), ("trace", None),
         *_DEVICE[1:]],
    ),
    "msa_main_branch": (
        ["query", "key_blocks", "value_blocks", "block_mask"],
        [("dtype", None), ("max_n", None), ("tiling", None), ("seeds_compat", False),
         ("trace", None), ("_fast", None)],
        [("dtype", None), ("max_n", None), ("tiling", None), *_DEVICE[1:]],
    ),
    "msa_sparse_decode": (
        ["q", "k_blocks", "v_blocks", "block_ids", "seq_len"],
        [("tiling", None), ("soc", "910b"), ("seeds_compat", False), ("trace", None)],
        [("tiling", None), ("gather", "device"), *_DEVICE[1:]],
    ),
}  # fmt: skip


def _listed(fn):
    import inspect

    sig = inspect.signature(fn)
    pos = [p.name for p in sig.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    kws = [(p.name, None if p.default is p.empty else p.default)
           for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY]  # fmt: skip
    return pos, kws


@pytest.mark.parametrize("op", sorted(_SIGNATURES))
def test_golden_and_wrapper_publish_the_written_out_argument_lists(op):
    pytest.importorskip("torch")
    import tilesim.device as D

    pos, golden_kw, device_kw = _SIGNATURES[op]
    assert _listed(getattr(R, op)) == (pos, golden_kw)
    assert _listed(getattr(D, op)) == (pos, device_kw)
    assert getattr(R, op).__name__ == getattr(D, op).__name__ == op


def test_a_wrong_argument_list_fails_as_a_python_call_would():
    case = _dsa_case()
    inp, prm = case["inputs"], case["params"]
    args = [inp[k] for k in _DSA_ARRAYS]
    op = R.sparse_attention_antiquant
    with pytest.raises(TypeError, match=r"^sparse_attention_antiquant\(\) missing 1 required "
                       r"keyword-only argument: 'softmax_scale'$"):  # fmt: skip
        op(*args)
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'scale'"):
        op(*args, softmax_scale=1.0, scale=2.0)
    with pytest.raises(TypeError, match="multiple values for argument 'query_nope'"):
        op(*args, query_nope=args[0], softmax_scale=1.0)
    with pytest.raises(TypeError, match="takes 6 positional arguments but 7"):
        op(*args, 7, softmax_scale=1.0)
    # positional and keyword spellings of one call give the same bits
    by_name = op(**dict(zip(_DSA_ARRAYS, args, strict=True)), **prm)
    np.testing.assert_array_equal(op(*args, **prm).view(np.uint16), by_name.view(np.uint16))
