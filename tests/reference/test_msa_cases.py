"""MSA case builders: the seeds' matrices, published block ids, runnable case dicts."""

from __future__ import annotations

import numpy as np
import pytest
import tilesim.reference as ref
from tilesim.reference import MSA_CASES, build_msa_block_mask, msa_make_case
from tilesim.reference.cases.msa import CASE_INFO, seeds_topk_indices
from tilesim.shared.registry.case_schema import CASE_KEYS, CaseInfo

# (n, seed) -> selected block ids in slot order, as published by the seeds' main-branch test
# (hicann/pypto-gym; docs/ops/msa.md, "Cases")
PUBLISHED_IDS = {
    (4096, 55): [19, 21, 14, 3, 7, 13, 1, 22, 28, 0, 10, 8, 31, 20, 24, 16],
    (2048, 42): [7, 9, 5, 6, 14, 10, 12, 8, 1, 2, 13, 15, 4, 11, 0, 3],
    (1024, 43): [6, 7, 4, 3, 1, 5, 2, 0],
    (1500, 45): [5, 3, 9, 8, 0, 10, 2, 1, 11, 7, 6, 4],
    (500, 47): [3, 1, 0, 2],
    (1, 52): [0],
    (64, 53): [0],
    (100, 54): [0],
}


@pytest.mark.parametrize("n, seed", sorted(PUBLISHED_IDS))
def test_seeds_topk_procedure_reproduces_published_ids(n, seed):
    ids = seeds_topk_indices(n, seed)
    assert ids.dtype == np.int32
    assert ids.tolist() == PUBLISHED_IDS[(n, seed)]


def test_case_table_matches_the_seeds_matrix():
    main = {k: v for k, v in MSA_CASES.items() if v["op"] == "msa_main_branch"}
    got = {(v["params"]["n"], v["seed"]) for v in main.values()}
    assert got == set(PUBLISHED_IDS)
    for v in main.values():
        assert v["tolerance"] == {"atol": 1e-3, "rtol": 1e-3, "ratio": 0.0, "mode": "compare"}
        assert v["params"]["max_n"] == (4096 if v["params"]["n"] == 4096 else 2048)
    for name in ("msa_indexer_nb8", "msa_indexer_nb17"):
        assert MSA_CASES[name]["tolerance"] == {
            "atol": None,
            "rtol": None,
            "ratio": 0.0,
            "mode": "set",
        }
    assert MSA_CASES["msa_decode_e2e_nb17"]["params"]["seq_len"] == 2176
    assert MSA_CASES["msa_decode_e2e_nb17"]["tolerance"] == {
        "atol": 5e-2,
        "rtol": 0.0,
        "ratio": 0.0,
        "mode": "compare",
    }
    assert MSA_CASES["msa_decode_partial_nb17"]["params"]["seq_len"] % 128 != 0


@pytest.mark.parametrize(
    "name",
    [
        "msa_indexer_nb8",
        "msa_indexer_nb17",
        "msa_decode_e2e_nb17",
        "msa_decode_partial_nb17",
        "msa_main_unaligned_1",
        "msa_main_unaligned_64",
        "msa_main_unaligned_100",
    ],
)
def test_cases_are_runnable_and_deterministic(name):
    a = msa_make_case(name)
    b = msa_make_case(name, progress=False)
    assert tuple(a) == CASE_KEYS
    assert a["op"] == MSA_CASES[name]["op"] and a["name"] == name
    assert a["tolerance"] == MSA_CASES[name]["tolerance"] == CASE_INFO[name].tolerance
    op = getattr(ref, a["op"])
    out = op(**a["inputs"], **a["params"])
    assert np.asarray(out).size > 0
    for k in a["inputs"]:
        assert a["inputs"][k].tobytes() == b["inputs"][k].tobytes()
    c = msa_make_case(name, seed=MSA_CASES[name]["seed"] + 1)
    assert any(a["inputs"][k].tobytes() != c["inputs"][k].tobytes() for k in a["inputs"])
    assert a["meta"]["seed"] == MSA_CASES[name]["seed"]


def test_main_case_layout_follows_the_seeds():
    c = msa_make_case("msa_main_unaligned_500")
    inp, ids = c["inputs"], c["meta"]["topk_indices"]
    assert ids.tolist() == PUBLISHED_IDS[(500, 47)]
    assert inp["query"].shape == (500, 64, 128) and inp["query"].dtype == np.float32
    assert inp["key_blocks"].shape == (2048, 4, 128)
    np.testing.assert_array_equal(inp["block_mask"], build_msa_block_mask(500, ids))
    # data stream: numpy default_rng(seed), query then key then value
    rng = np.random.default_rng(47)
    q = rng.standard_normal((500, 64, 128), dtype=np.float32)
    k = rng.standard_normal((500, 4, 128), dtype=np.float32)
    np.testing.assert_array_equal(inp["query"], q)
    kb = inp["key_blocks"].reshape(16, 128, 4, 128)
    for slot, blk in enumerate(ids):
        rows = k[blk * 128 : blk * 128 + 128]
        np.testing.assert_array_equal(kb[slot, : len(rows)], rows)
        assert not kb[slot, len(rows) :].any()  # zero padding of the partial last block
    assert not kb[len(ids) :].any()  # padding slots
    assert c["params"] == {"dtype": "fp32", "max_n": 2048}


def test_decode_case_builder_options():
    c = msa_make_case(
        None,
        op="msa_sparse_decode",
        batch=3,
        nb=20,
        seq_len=[2560, 2500, 2049],
        select="random",
        seed=4,
    )
    ids, seq = c["inputs"]["block_ids"], c["params"]["seq_len"]
    assert ids.shape == (3, 16) and seq.tolist() == [2560, 2500, 2049]
    assert (ids[:, -1] == (seq - 1) // 128).all()  # the current block last
    kb = c["inputs"]["k_blocks"].astype(np.float32).reshape(3, 4, -1, 128)
    assert not kb[2, :, 2049:].any() and kb[2, :, :2049].any()
    out = ref.msa_sparse_decode(**c["inputs"], **c["params"])
    assert out.shape == (3, 64, 128)
    with pytest.raises(ValueError, match="same number of blocks"):
        msa_make_case(None, op="msa_sparse_decode", batch=2, nb=20, seq_len=[2560, 1000])


def test_bad_requests():
    with pytest.raises(ValueError, match="name: expected one of"):
        msa_make_case("msa_nope")
    with pytest.raises(ValueError, match="op: expected one of"):
        msa_make_case(None, n=5)
    with pytest.raises(ValueError, match="params"):
        msa_make_case("msa_indexer_nb8", bogus=1)
    with pytest.raises(ValueError, match="seed"):
        msa_make_case("msa_indexer_nb8", seed=-1)
    with pytest.raises(ValueError, match="runs 'msa_indexer'"):
        msa_make_case("msa_indexer_nb8", op="msa_main_branch")
    with pytest.raises(ValueError, match="select"):
        msa_make_case(None, op="msa_sparse_decode", select="best")


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        (dict(op="msa_indexer", nb=0), ValueError, "nb: expected an int in"),
        (dict(op="msa_indexer", nb="3"), TypeError, "nb: expected an int"),
        (dict(op="msa_indexer", nb=3, scale=float("nan")), ValueError, "scale: expected a finite"),
        (dict(op="msa_indexer", nb=3, scale=-0.1), ValueError, "scale: expected a number > 0"),
        (dict(op="msa_indexer", nb=3, seq_len=200), ValueError, "seq_len: expected an int with"),
        (dict(op="msa_indexer", nb=3, head_reduce="mean"), ValueError, "head_reduce"),
        (dict(op="msa_sparse_decode", batch=1.5), TypeError, "batch: expected an int"),
        (dict(op="msa_sparse_decode", nb=17, seq_len=2000.5), TypeError, "seq_len"),
        (
            dict(op="msa_sparse_decode", nb=17, seq_len=[2000, 2.5], batch=2),
            TypeError,
            r"seq_len\[1\]",
        ),
        (dict(op="msa_sparse_decode", nb=17, seq_len=0), ValueError, "seq_len: expected 1 <="),
        (
            dict(op="msa_sparse_decode", batch=2, seq_len=[2176]),
            ValueError,
            "seq_len: expected one",
        ),
        (dict(op="msa_sparse_decode", idx_scale=float("inf")), ValueError, "idx_scale"),
        (dict(op="msa_main_branch", n=10.5), TypeError, "n: expected an int"),
        (dict(op="msa_main_branch", n=100, hq=6, hkv=4), ValueError, "hq: expected a multiple"),
        (dict(op="msa_main_branch", n=100, dtype="fp64"), ValueError, "dtype: expected one of"),
        (dict(op="msa_main_branch", n=300, max_n=256), ValueError, "max_n: expected an int in"),
        (dict(op="msa_main_branch", n=100, topk="16"), TypeError, "topk: expected an int"),
        (dict(op="msa_indexer", nb=3, seed=True), TypeError, "seed: expected an int"),
        (dict(op="msa_indexer", nb=3, progress="yes"), TypeError, "progress: expected a bool"),
        (dict(op="msa_nope"), ValueError, "op: expected one of"),
    ],
)
def test_builder_parameters_are_checked(kw, exc, match):
    with pytest.raises(exc, match=match):
        msa_make_case(None, **kw)


def test_case_info_covers_every_named_case():
    assert set(MSA_CASES) < set(CASE_INFO)
    assert set(CASE_INFO) - set(MSA_CASES) == {"msa_decode_b64_nb17"}
    kinds = {"msa_indexer": "indexer", "msa_sparse_decode": "decode"}
    for name, info in CASE_INFO.items():
        assert isinstance(info, CaseInfo) and info.name == name and info.family == "msa"
        assert info.builder == "tilesim.reference.cases.msa:msa_make_case"
        assert info.kind == kinds.get(info.op, "main_branch")
        if name in MSA_CASES:
            assert (info.op, info.seed) == (MSA_CASES[name]["op"], MSA_CASES[name]["seed"])
    b64 = CASE_INFO["msa_decode_b64_nb17"]
    assert b64.size == "medium" and b64.builder_params["batch"] == 64
    # the registered build as the CLI runner makes it ("case": None = no name), reduced to 2 rows
    small = dict(b64.builder_params, batch=2)
    assert small.pop("case") is None
    case = msa_make_case(None, seed=b64.seed, **small)
    assert case["inputs"]["q"].shape == (2, 64, 128) and case["params"]["seq_len"] == 2176
    assert CASE_INFO["msa_main_aligned_4096"].soc == ("950", "910b")
    assert CASE_INFO["msa_main_aligned_4096"].size == "large"
    assert CASE_INFO["msa_indexer_nb8"].tolerance["mode"] == "set"
