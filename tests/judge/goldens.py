"""Small goldens of every op for the judge's calibration: the reference output, the op's
independent float64 oracle (``tests/oracles``), the case's tolerance, and what the mutations
need (a way to re-run the reference with one input changed).

Each builder returns a dict ``{"op", "golden", "oracle", "tol", "rerun", "case"}``; ``rerun(**
changes)`` runs the reference with ``changes`` applied to the case's inputs / params.
"""

from __future__ import annotations

import functools

import numpy as np
import tilesim.reference as R

#: the tolerance of the DeepSeek cases (every named DSA case states it)
DSA_TOL = {"atol": 1e-4, "rtol": 5e-3, "ratio": 5e-3, "mode": "compare"}


def _runner(case: dict):
    op = getattr(R, case["op"])

    def rerun(**changes):
        inputs = {**case["inputs"], **{k: v for k, v in changes.items() if k in case["inputs"]}}
        params = {**case["params"], **{k: v for k, v in changes.items() if k not in inputs}}
        return op(**inputs, **params)

    return rerun


@functools.cache
def msa_decode(named: bool = False) -> dict:
    """The named ``msa_decode_partial_nb17`` case (``named``), or the same shape with inputs of
    scale 1: the named case's inputs (scale 0.05) make every softmax near uniform, so its heads
    agree to about one BF16 ULP and a softmax-scale error moves no output by more than that."""
    from oracles.msa import dense_oracle

    if named:
        case = R.msa_make_case("msa_decode_partial_nb17")
    else:
        case = R.msa_make_case(None, op="msa_sparse_decode", seed=3, nb=17, seq_len=2085,
                               scale=1.0)  # fmt: skip
        case["tolerance"] = R.msa_make_case("msa_decode_partial_nb17")["tolerance"]
    rerun = _runner(case)
    i = case["inputs"]
    ref, _, _ = dense_oracle(i["q"], i["k_blocks"], i["v_blocks"], i["block_ids"],
                             case["params"]["seq_len"])  # fmt: skip
    return {"op": "msa_decode", "golden": rerun(), "oracle": ref, "tol": case["tolerance"],
            "rerun": rerun, "case": case}  # fmt: skip


@functools.cache
def msa_main() -> dict:
    from oracles.msa_main import dense_oracle

    case = R.msa_make_case("msa_main_unaligned_100")
    rerun = _runner(case)
    orc = dense_oracle(case["inputs"], case["meta"]["topk_indices"])
    return {"op": "msa_main", "golden": rerun(), "oracle": orc[0],
            "tol": case["tolerance"], "rerun": rerun, "case": case}  # fmt: skip


@functools.cache
def dsa() -> dict:
    from oracles.dsa import oracle

    case = R.dsa_make_case(actual_seq=[700, 90, 3, 256], s1=2, quant="fp8", topk_rule="causal",
                           invalid_frac=0.1, seed=7, nq=16, topk=256, block_size=16)  # fmt: skip
    rerun = _runner(case)
    return {"op": "dsa", "golden": rerun(), "oracle": oracle(case)[0], "tol": DSA_TOL,
            "rerun": rerun, "case": case}  # fmt: skip


@functools.cache
def moe() -> dict:
    from oracles.moe import oracle64

    case = R.moe_make_case("m3_case_smoke_edge")
    rerun = _runner(case)
    return {"op": "moe", "golden": rerun(), "oracle": oracle64(case)[0], "tol": case["tolerance"],
            "rerun": rerun, "case": case}  # fmt: skip


@functools.cache
def msa_indexer() -> dict:
    case = R.msa_make_case("msa_indexer_nb17")
    rerun = _runner(case)
    return {"op": "msa_indexer", "golden": rerun(), "oracle": None, "tol": case["tolerance"],
            "rerun": rerun, "case": case}  # fmt: skip


FLOAT_OPS = {"moe": moe, "msa_decode": msa_decode, "msa_main": msa_main, "dsa": dsa}


def indexer_block_scores(case: dict) -> np.ndarray:
    """FP32 ``[1, nb]`` block scores of an indexer case, written from the op's definition:
    the max over each block's 128 keys of the FP32 kernel scores, then over the 4 heads."""
    i, nb = case["inputs"], case["params"]["nb"]
    s = np.asarray(R.msa_indexer_scores(i["idx_q"], i["idx_k"], nb), dtype=np.float32)
    return s.reshape(4, nb, 128).max(axis=2).max(axis=0, keepdims=True)
