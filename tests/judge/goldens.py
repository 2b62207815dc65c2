"""Small goldens of every op for the judge's calibration: the reference output, the op's
independent float64 oracle (``tests/oracles``), the case's tolerance, and what the mutations
need (a way to re-run the reference with one input changed).

Each builder returns a dict ``{"op", "golden", "oracle", "tol", "rerun", "case", "precision"}``;
``rerun(**changes)`` runs the reference with ``changes`` applied to the case's inputs / params;
``precision`` is the judge's ``precision`` (the rounding an FP32 output carries), else ``None``.

The worst correct output of an op is measured on more than one golden: :func:`oracle_pairs`
gives ``(name, golden, float64 oracle)`` over a few cases of the op, :func:`variants` the
case's golden rerun under the other legal tile configurations and rounding choices a correct
kernel may make (each a correct output the golden does not model).
"""

from __future__ import annotations

import dataclasses
import functools

import ml_dtypes
import numpy as np
import tilesim.reference as R
from tilesim.shared.tiling import MsaTiling

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
            "rerun": rerun, "case": case, "precision": None}  # fmt: skip


#: the judge's ``precision`` of each main-branch mode (its FP32 output carries P's rounding)
MAIN_PRECISION = {"fp32": None, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}


def _main(name: str, dtype: str) -> dict:
    from oracles.msa_main import dense_oracle

    case = R.msa_make_case(name, **({} if dtype == "fp32" else {"dtype": dtype}))
    rerun = _runner(case)
    orc = dense_oracle(case["inputs"], case["meta"]["topk_indices"], dtype=dtype)
    return {"op": "msa_main", "golden": rerun(), "oracle": orc[0],
            "tol": case["tolerance"], "rerun": rerun, "case": case,
            "precision": MAIN_PRECISION[dtype]}  # fmt: skip


@functools.cache
def msa_main() -> dict:
    """``msa_main_unaligned_100`` in the FP32 mode (an FP32 output)."""
    return _main("msa_main_unaligned_100", "fp32")


@functools.cache
def msa_main_bf16() -> dict:
    """``msa_main_unaligned_100`` in the BF16 mode: FP32 output carrying P's BF16 rounding
    (judged with ``precision`` BF16, as the sim test judges the kernel)."""
    return _main("msa_main_unaligned_100", "bf16")


@functools.cache
def dsa() -> dict:
    from oracles.dsa import oracle

    case = _dsa_case("fp8", 7)
    rerun = _runner(case)
    return {"op": "dsa", "golden": rerun(), "oracle": oracle(case)[0], "tol": DSA_TOL,
            "rerun": rerun, "case": case, "precision": None}  # fmt: skip


@functools.cache
def moe() -> dict:
    from oracles.moe import oracle64

    case = R.moe_make_case("m3_case_smoke_edge")
    rerun = _runner(case)
    return {"op": "moe", "golden": rerun(), "oracle": oracle64(case)[0], "tol": case["tolerance"],
            "rerun": rerun, "case": case, "precision": None}  # fmt: skip


@functools.cache
def msa_indexer() -> dict:
    case = R.msa_make_case("msa_indexer_nb17")
    rerun = _runner(case)
    return {"op": "msa_indexer", "golden": rerun(), "oracle": None, "tol": case["tolerance"],
            "rerun": rerun, "case": case}  # fmt: skip


#: the calibration goldens of the float outputs: ``{name: builder}`` (``d["op"]`` is the
#: judge's ``kind``)
FLOAT_OPS = {"moe": moe, "msa_decode": msa_decode, "msa_main": msa_main,
             "msa_main_bf16": msa_main_bf16, "dsa": dsa}  # fmt: skip


def _dsa_case(quant: str, seed: int) -> dict:
    return R.dsa_make_case(actual_seq=[700, 90, 3, 256], s1=2, quant=quant, topk_rule="causal",
                           invalid_frac=0.1, seed=seed, nq=16, topk=256, block_size=16)  # fmt: skip


def oracle_pairs(name: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(case, golden, float64 oracle)`` of the calibration golden ``name`` and of a few more
    cases of its op (other seeds, shapes, quantizations, input scales)."""
    d = FLOAT_OPS[name]()
    out = [("calibration case", d["golden"], d["oracle"])]
    if d["op"] == "moe":
        from oracles.moe import oracle64

        for nm, kw in (("m27_case_001", {}), ("swigluoai seed 2", {"activation": "swigluoai"})):
            c = R.moe_make_case(nm, **kw) if not kw else R.moe_make_case(None, seed=2, **kw)
            out.append((nm, R.moe_grouped_gemm(**c["inputs"], **c["params"]), oracle64(c)[0]))
    elif d["op"] == "msa_decode":
        from oracles.msa import dense_oracle

        more = {"msa_decode_partial_nb17": None,
                "batch 4, nb 9, scale 1": dict(seed=6, batch=4, nb=9, seq_len=1100),
                "seed 5, scale 0.3": dict(seed=5, nb=17, seq_len=2085, scale=0.3)}  # fmt: skip
        for nm, kw in more.items():
            c = R.msa_make_case(nm) if kw is None else R.msa_make_case(
                None, op="msa_sparse_decode", **{"scale": 1.0, **kw})  # fmt: skip
            i = c["inputs"]
            ref = dense_oracle(i["q"], i["k_blocks"], i["v_blocks"], i["block_ids"],
                               c["params"]["seq_len"])[0]  # fmt: skip
            out.append((nm, R.msa_sparse_decode(**i, **c["params"]), ref))
    elif d["op"] == "msa_main":
        e = _main("msa_main_unaligned_64", d["case"]["params"]["dtype"])
        out.append(("msa_main_unaligned_64", e["golden"], e["oracle"]))
    elif d["op"] == "dsa":
        from oracles.dsa import oracle

        for quant, seed in (("int8", 8), ("fp8", 8)):
            c = _dsa_case(quant, seed)
            out.append((f"{quant} seed {seed}", R.sparse_attention_antiquant(**c["inputs"],
                        **c["params"]), oracle(c)[0]))  # fmt: skip
    return out


def variants(name: str) -> dict:
    """``{what: output}``: the calibration golden ``name`` rerun under another legal tile
    configuration or rounding choice (a correct kernel's output that the golden does not
    model); configurations that give the golden's bits are left in (a variant of zero
    spread)."""
    d = FLOAT_OPS[name]()
    if d["op"] == "moe":
        return {"activation kept in FP32 (no BF16 rounding before mm2)":
                d["rerun"](round_activation=False)}  # fmt: skip
    if d["op"] == "msa_decode":
        return {f"tiling {kw}": d["rerun"](tiling=MsaTiling(**kw))
                for kw in ({"ntile": 128}, {"ntile": 256}, {"kv_splits": 2})}  # fmt: skip
    if d["op"] == "msa_main":
        mode = d["case"]["params"]["dtype"]
        return {f"tiling ntile {n}": d["rerun"](tiling=MsaTiling(ntile=n, dtype=mode), dtype=None)
                for n in (128, 256)}  # fmt: skip
    t0 = d["case"]["params"]["tiling"]
    return {f"tiling {kw}": d["rerun"](tiling=dataclasses.replace(t0, **kw))
            for kw in ({"softmax": "per_tile", "s_kv_tile": 2048}, {"s_kv_tile": 128},
                       {"kv_splits": 2})}  # fmt: skip


def indexer_block_scores(case: dict) -> np.ndarray:
    """FP32 ``[1, nb]`` block scores of an indexer case, written from the op's definition:
    the max over each block's 128 keys of the FP32 kernel scores, then over the 4 heads."""
    i, nb = case["inputs"], case["params"]["nb"]
    s = np.asarray(R.msa_indexer_scores(i["idx_q"], i["idx_k"], nb), dtype=np.float32)
    return s.reshape(4, nb, 128).max(axis=2).max(axis=0, keepdims=True)
