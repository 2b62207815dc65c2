"""Bad input to ``dsa_indexer``: each is a ``ValueError`` / ``TypeError`` naming the argument,
raised before any work, and the caller's arrays are never written."""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.reference import dsa_indexer, dsa_indexer_make_case

BS = 16


def _case(path="int8", **kw):
    return dsa_indexer_make_case(None, seed=1, path=path, seq_lens=(37, 20), block_size=BS,
                                 topk=8, **kw)  # fmt: skip


def _call(case, **over):
    args = {**case["inputs"], **case["params"], **over}
    return dsa_indexer(**args)


def _set(case, name, fn):
    a = case["inputs"][name].copy()
    fn(a)
    return {name: a}


BAD_INT8 = [
    ("q dtype", lambda c: {"q": c["inputs"]["q"].astype(np.int16)}, TypeError, "q: expected dtype"),
    ("q heads", lambda c: {"q": c["inputs"]["q"][:, :32]}, ValueError, r"q: expected shape"),
    ("weights dtype", lambda c: {"weights": c["inputs"]["weights"].astype(np.float32)},
     TypeError, "weights"),
    ("q_scale missing", lambda c: {"q_scale": None}, TypeError, "q_scale"),
    ("k_scale shape", lambda c: {"k_scale": c["inputs"]["k_scale"][:, :8]}, ValueError, "k_scale"),
    ("k_cache block size", lambda c: {"block_size": 32}, ValueError, "k_cache"),
    ("path", lambda c: {"path": "bf16"}, ValueError, "path"),
    ("order", lambda c: {"int8_order": "cann"}, ValueError, "int8_order"),
    ("topk", lambda c: {"topk": 0}, ValueError, "topk"),
    ("table dtype", lambda c: {"block_table": c["inputs"]["block_table"].astype(np.float32)},
     TypeError, "block_table"),
    ("table rows", lambda c: {"block_table": c["inputs"]["block_table"][:1]}, ValueError,
     "block_table"),
    ("decode s1 > 4", lambda c: {"q": np.concatenate([c["inputs"]["q"]] * 3),
                                 "q_scale": np.concatenate([c["inputs"]["q_scale"]] * 3),
                                 "weights": np.concatenate([c["inputs"]["weights"]] * 3)},
     ValueError, "1 <= s1 <= 4"),
    ("-1 in a visible block", lambda c: _set(c, "block_table", lambda a: a.__setitem__((0, 2), -1)),
     ValueError, r"block_table\[0, 2\]"),
    ("block out of range", lambda c: _set(c, "block_table", lambda a: a.__setitem__((1, 0), 99)),
     ValueError, r"block_table\[1, 0\]"),
    ("seq_lens > capacity", lambda c: _set(c, "seq_lens", lambda a: a.__setitem__(1, 999)),
     ValueError, r"seq_lens\[1\]"),
    ("seq_lens < s1", lambda c: _set(c, "seq_lens", lambda a: a.__setitem__(1, 1)),
     ValueError, r"seq_lens\[1\]"),
    ("q_lens sum", lambda c: {"q_lens": np.array([1, 1], np.int32)}, ValueError, "q_lens"),
    ("q_lens negative", lambda c: {"q_lens": np.array([5, -1], np.int32)}, ValueError, "q_lens"),
    ("NaN weight", lambda c: _set(c, "weights", lambda a: a.__setitem__((1, 3), np.nan)),
     ValueError, "weights"),
    ("inf q_scale", lambda c: _set(c, "q_scale", lambda a: a.__setitem__((0, 0), np.inf)),
     ValueError, "q_scale"),
    ("negative q_scale", lambda c: _set(c, "q_scale", lambda a: a.__setitem__((0, 5), -0.5)),
     ValueError, "q_scale: expected scales >= 0"),
    ("NaN k_scale read", lambda c: _set(c, "k_scale", lambda a: a.__setitem__(
        (int(c["inputs"]["block_table"][0, 1]), 3), np.nan)), ValueError, "k_scale"),
    ("negative k_scale read", lambda c: _set(c, "k_scale", lambda a: a.__setitem__(
        (int(c["inputs"]["block_table"][1, 0]), 0), -1.0)), ValueError, "expected scales >= 0"),
    ("trace", lambda c: {"trace": 3}, TypeError, "trace"),
    ("progress", lambda c: {"progress": "yes"}, TypeError, "progress"),
]  # fmt: skip


@pytest.mark.parametrize("what, over, exc, match", BAD_INT8, ids=[b[0] for b in BAD_INT8])
def test_int8_bad_input_is_named(what, over, exc, match):
    case = _case()
    before = {k: v.copy() for k, v in case["inputs"].items()}
    with pytest.raises(exc, match=match):
        _call(case, **over(case))
    for k, v in before.items():
        np.testing.assert_array_equal(case["inputs"][k], v)


def test_fp8_bad_input_is_named():
    case = _case("fp8")
    kc = case["inputs"]["k_cache"]
    with pytest.raises(ValueError, match="q_scale: expected None"):
        _call(case, q_scale=np.ones((4, 64), np.float16))
    with pytest.raises(TypeError, match="weights"):
        _call(case, weights=case["inputs"]["weights"].astype(np.float16))
    with pytest.raises(ValueError, match="k_cache"):
        _call(case, k_cache=kc[:, :-4])
    q = case["inputs"]["q"].copy()
    q.view(np.uint8)[2, 7, 9] = 0x7F
    with pytest.raises(ValueError, match="q: expected finite"):
        _call(case, q=q)
    blk = int(case["inputs"]["block_table"][0, 0])
    bad = kc.copy()
    bad[blk, 5 * 128 + 1] = 0xFF  # token 5's codes: a NaN code in a read token
    with pytest.raises(ValueError, match="NaN code in token 5"):
        _call(case, k_cache=bad)
    bad = kc.copy()
    bad[blk, BS * 128 + 4 * 2 : BS * 128 + 4 * 3] = np.array([-1.0], "<f4").view(np.uint8)
    with pytest.raises(ValueError, match="expected scales >= 0"):
        _call(case, k_cache=bad)


def test_values_never_read_are_not_checked():
    """Table entries past the visible blocks and slots past seq_lens may hold anything."""
    case = _case()
    bt = case["inputs"]["block_table"].copy()
    bt[1, 2:] = 12345  # batch 1 has 20 tokens: blocks 0, 1
    ks = case["inputs"]["k_scale"].copy()
    ks[int(bt[1, 1]), 4:] = np.nan  # slots 20.. of batch 1's last block
    a = _call(case)
    b = _call(case, block_table=bt, k_scale=ks)
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.topk_indices, b.topk_indices)
