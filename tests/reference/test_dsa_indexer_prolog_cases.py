"""The named cases of ``dsa_indexer_prolog``: registered in the family table, deterministic,
built as described (slots through the block table, padding, poisoned rows, true Hadamard and
YaRN inputs), and their goldens run."""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.reference import dsa_indexer_prolog, dsa_indexer_prolog_make_case
from tilesim.reference.cases.dsa_indexer_prolog import CASE_INFO
from tilesim.shared.hadamard import scaled_hadamard_bf16
from tilesim.shared.registry.case_schema import CASE_FAMILIES
from tilesim.shared.rope import halves_table, yarn_rope_table

SMALL = sorted(n for n, info in CASE_INFO.items() if info.size == "small")


def test_family_is_registered_with_its_cases():
    assert "dsa_indexer_prolog" in CASE_FAMILIES
    assert len(CASE_INFO) == 9 and len(SMALL) == 6
    for name, info in CASE_INFO.items():
        assert info.family == info.op == "dsa_indexer_prolog" and info.name == name


@pytest.mark.parametrize("name", SMALL)
def test_small_cases_are_deterministic_and_run(name):
    a = dsa_indexer_prolog_make_case(name, progress=False)
    b = dsa_indexer_prolog_make_case(name)
    for k, v in a["inputs"].items():
        assert np.array_equal(
            np.asarray(v).view(np.uint8), np.asarray(b["inputs"][k]).view(np.uint8)
        ), k
    res = dsa_indexer_prolog(**a["inputs"], **a["params"])
    slots = a["inputs"]["slot_mapping"]
    assert res.q.shape == (slots.size, 64, 128)
    assert np.isfinite(np.asarray(res.weights, np.float64)).all()


def test_model_recipe_uses_the_true_hadamard_and_the_yarn_table():
    c = dsa_indexer_prolog_make_case("dsa_indexer_prolog_short_int8")
    inp, meta = c["inputs"], c["meta"]
    np.testing.assert_array_equal(inp["hadamard_q"].view(np.uint16),
                                  scaled_hadamard_bf16().view(np.uint16))  # fmt: skip
    cos, sin = halves_table(*yarn_rope_table(meta["positions"], max_seq_len=163840))
    np.testing.assert_array_equal(inp["cos"].view(np.uint16), cos.view(np.uint16))
    np.testing.assert_array_equal(inp["sin"].view(np.uint16), sin.view(np.uint16))
    assert meta["positions"].tolist() == [298, 299, 998, 999]  # the last s1 of each sequence
    bt, slots = meta["block_table"], inp["slot_mapping"]
    for p, (b, pos) in zip(slots, [(0, 298), (0, 299), (1, 998), (1, 999)], strict=True):
        assert p == bt[b, pos // 128] * 128 + pos % 128


def test_cache_holds_the_earlier_tokens_and_poison_elsewhere():
    c = dsa_indexer_prolog_make_case(None, seq_lens=(20, 9), s1=2, block_size=8, hidden=128,
                                     rank=128, spare_blocks=1)  # fmt: skip
    scale, bt = c["inputs"]["k_scale"], c["meta"]["block_table"]
    held = np.zeros(scale.shape, bool)
    for b, n in enumerate((18, 7)):  # earlier tokens: all but the 2 new ones
        for p in range(n):
            held[bt[b, p // 8], p % 8] = True
    assert np.isfinite(scale[held]).all() and np.isnan(scale[~held]).all()
    s = c["inputs"]["slot_mapping"]
    assert np.isnan(scale.reshape(-1)[s]).all()  # the new tokens' slots are poisoned too
