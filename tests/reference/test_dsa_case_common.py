"""The DeepSeek case builders' shared helpers: the merged builder parameters, the new-token
rows, the table's CaseInfo and the index-key cache of the earlier tokens."""

from __future__ import annotations

import numpy as np
import pytest
from tilesim.reference.cases.dsa_common import (
    builder_arguments,
    index_key_cache,
    new_token_rows,
    table_case_info,
)
from tilesim.shared.layouts.index_cache import fp8_page_views
from tilesim.shared.registry.case_schema import tolerance

DEFAULTS = {"path": "int8", "seq_lens": (5,), "s1": 1, "q_lens": None}
TABLE = {"x_fp8": (dict(path="fp8"), "small", "tilesim extra", "one FP8 case")}


def test_builder_arguments_merge_defaults_entry_and_overrides():
    seed, p = builder_arguments("make", "x_fp8", 3, None, {"s1": 2}, DEFAULTS, TABLE)
    assert seed == 3
    assert p == {"path": "fp8", "seq_lens": (5,), "s1": 2, "q_lens": None}
    assert DEFAULTS["path"] == "int8" and TABLE["x_fp8"][0] == {"path": "fp8"}


@pytest.mark.parametrize(
    ("name", "seed", "progress", "params", "exc", "match"),
    [
        (None, 0, None, {"bogus": 1}, TypeError, r"make: unknown parameter\(s\) \['bogus'\]"),
        ("nope", 0, None, {}, ValueError, "name"),
        (None, -1, None, {}, ValueError, "seed"),
        (None, 0, "yes", {}, TypeError, "progress"),
    ],
)
def test_builder_arguments_name_the_bad_argument(name, seed, progress, params, exc, match):
    with pytest.raises(exc, match=match):
        builder_arguments("make", name, seed, progress, params, DEFAULTS, TABLE)


def test_new_token_rows_decode_and_prefill():
    p = {"seq_lens": [4, 9], "s1": np.int64(2), "q_lens": None}
    assert new_token_rows(p, unit="sequence", seq_lo=1, q_lo=0) == (2, 2)
    assert p["seq_lens"] == (4, 9) and type(p["s1"]) is int
    p = {"seq_lens": (4, 9), "s1": 1, "q_lens": (0, 9)}
    assert new_token_rows(p, unit="batch", seq_lo=0, q_lo=0) == (0, 9)


@pytest.mark.parametrize(
    ("p", "match"),
    [
        ({"seq_lens": (), "s1": 1, "q_lens": None}, r"seq_lens: expected at least one batch"),
        ({"seq_lens": (1,), "s1": 2, "q_lens": None}, r"seq_lens\[0\]: expected >= 2 .*got 1"),
        ({"seq_lens": (4, 4), "s1": 1, "q_lens": (1,)}, r"q_lens: expected 2 values .*got 1"),
        ({"seq_lens": (4,), "s1": 3, "q_lens": None}, r"s1: expected an int in \[1, 2\], got 3"),
    ],
)
def test_new_token_rows_name_the_bad_argument(p, match):
    with pytest.raises(ValueError, match=match):
        new_token_rows(p, unit="batch", seq_lo=0, s1_hi=2, q_lo=0)


def test_table_case_info_marks_fp8_for_the_950():
    tol = tolerance(atol=1.0, rtol=0.0)
    info = table_case_info("x_fp8", TABLE, op="mla_prolog", builder="m:f", tolerance=tol,
                           rule="r")  # fmt: skip
    assert (info.family, info.op, info.soc, info.summary) == ("mla_prolog", "mla_prolog",
                                                              ("950",), "one FP8 case")  # fmt: skip
    assert info.notes == {"rule": "r"} and info.model == "DeepSeek-V3.2"


@pytest.mark.parametrize("path", ["int8", "fp8"])
def test_index_key_cache_holds_the_keys_and_poisons_the_rest(path):
    table = np.array([[2, 0], [1, -1]], dtype=np.int32)
    kw = dict(ue8m0=True, progress=False, desc="t", unit="seq")
    out = index_key_cache(path, (5, 2), table, 4, 4, np.random.default_rng(0), poison=True,
                          all_tie=True, **kw)  # fmt: skip
    clean = index_key_cache(path, (5, 2), table, 4, 4, np.random.default_rng(0), poison=False,
                            all_tie=True, **kw)  # fmt: skip
    assert sorted(out) == (["k_cache", "k_scale"] if path == "int8" else ["k_cache"])
    if path == "int8":
        codes, scales = out["k_cache"], out["k_scale"]
    else:
        codes, scales = fp8_page_views(out["k_cache"], block_size=4)
    used = np.zeros((4, 4), dtype=bool)
    used[2, :4] = used[0, :1] = used[1, :2] = True  # 5 keys of sequence 0, 2 of sequence 1
    assert np.isfinite(scales[used]).all() and np.isnan(scales[~used]).all()
    assert (codes.view(np.uint8)[~used] == 0x7F).all()
    assert (codes[2, 1:].view(np.uint8) == codes[2, :1].view(np.uint8)).all()  # all tie
    ref = (
        clean["k_cache"] if path == "int8" else fp8_page_views(clean["k_cache"], block_size=4).codes
    )
    assert np.array_equal(codes.view(np.uint8)[used], ref.view(np.uint8)[used])
