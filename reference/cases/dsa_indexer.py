"""Runnable cases of the DeepSeek-V3.2 lightning indexer (``dsa_indexer``).

``dsa_indexer_make_case(name)`` returns a :func:`tilesim.shared.registry.case_schema.make_case`
dict: ``tilesim.reference.dsa_indexer(**case["inputs"], **case["params"])`` is the golden.
:data:`CASE_INFO` describes every named case for the registry (family ``"dsa_indexer"``, kind
``"indexer"``). The decode step's cases (``dsa_step_*``: the layer step entered at the
indexer) are the layer step's family, :mod:`tilesim.reference.cases.dsa_attention_step`,
which builds their indexer half with this builder.

Data recipe (deterministic from ``seed``; ``SeedSequence(seed).spawn`` gives one stream per
component): the block table of :func:`tilesim.reference.cases.dsa.build_block_table` (a random
permutation of the blocks, unused entries -1); index q ``[T, 64, 128]`` and index k (one vector
per token) drawn standard normal in FP32 and quantized with :mod:`tilesim.shared.quant`
(``quantize_index_int8`` per token-head / token, or ``quantize_index_fp8`` with plain or UE8M0
scales); INT8 weights ``fp16(N(0, 1))``, FP8 weights ``fp32(N(0, 1) * q_scale * 64^-0.5 *
128^-0.5)`` (the scale folded in as DeepSeek does). pypto-gym's own generator draws
``int8(trunc(randn))`` codes and re-quantizes them; the recipe here follows the producers'
quantizers instead (``docs/ops/dsa_indexer.md``, "Cases"). The key cache is generated one
batch at a time, so a 64-batch 64K case never holds more than one batch of FP32 keys.

``all_tie=True`` gives every token of batch 0 the same key (so all its scores tie: the ids are
``0 .. k-1``); ``spare_blocks`` appends physical blocks no table entry selects;
``poison_unused=True`` fills every slot no visible token occupies (those blocks, and the slots
past ``seq_lens`` in each batch's last block) with NaN scales (FP16 / FP32) and the code 0x7F
(the E4M3 NaN; INT8: 127).
"""

from __future__ import annotations

import numpy as np
from tilesim.reference.cases.dsa import DSA_CASES, build_block_table
from tilesim.reference.cases.dsa_common import (
    builder_arguments,
    check_paged_cache,
    index_key_cache,
    new_token_rows,
)
from tilesim.shared.dsa_indexer import (
    INDEX_HEADS,
    INT8_ORDERS,
    MAX_DECODE_S1,
    MAX_POSITIONS,
    PATHS,
    TOPK,
)
from tilesim.shared.layouts.index_cache import INDEX_DIM
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.quant import quantize_index_fp8, quantize_index_int8
from tilesim.shared.registry.case_schema import CaseInfo, make_case, tolerance
from tilesim.shared.registry.ops import golden_calls
from tilesim.shared.validate import (
    check_bool,
    check_choice,
    check_elements,
    check_int,
)

BUILDER = "tilesim.reference.cases.dsa_indexer:dsa_indexer_make_case"
#: the ops a case of this family calls (the registry of ops)
OPS = golden_calls("dsa_indexer")
#: ids are judged as sets per row (order free); the judge's score-aware rule reads ``scores``
ID_TOLERANCE = tolerance(mode="set")
#: DeepSeek-V3.2's folded weight constants ``64^-0.5 * 128^-0.5``
WEIGHT_FOLD = float(INDEX_HEADS**-0.5 * INDEX_DIM**-0.5)
#: the seeds' uniform DeepSeek decode lengths, 16K .. 112K (``tilesim.reference.cases.dsa``)
UNIFORM_64 = DSA_CASES["sfa_bf16_b64_s2_seq64K_uniform_per_fp8_d"].actual_seq
_GYM_B4 = (64 * 1024, 971, 32 * 1024 + 101, 16 * 1024 - 1)
_GYM_B8 = (32767, 32656, 384, 2000, 64 * 1024, 971, 32 * 1024 + 101, 129090)

#: the builder's parameters and their defaults
DEFAULTS = {
    "op": "dsa_indexer", "path": "int8", "int8_order": "gym", "seq_lens": (300, 1000),
    "s1": 2, "q_lens": None, "topk": TOPK, "block_size": DEEPSEEK_V32.block_size,
    "ue8m0": False, "all_tie": False, "poison_unused": False, "spare_blocks": 0,
}  # fmt: skip

# name -> (builder params, size, status, summary)
_TABLE = {
    "li_quant_b4_s1_2_64k": (dict(seq_lens=_GYM_B4), "large", "skip: large",
                             "pypto-gym shape: B 4, s1 2, lengths 64K/971/32869/16383, INT8"),
    "li_quant_b8_s1_2_64k": (dict(seq_lens=_GYM_B8), "large", "skip: large",
                             "pypto-gym shape: B 8, s1 2, lengths up to 129090, INT8"),
    "li_quant_b4_s1_2_64k_perf": (dict(seq_lens=(65536,) * 4), "large", "skip: large",
                                  "pypto-gym perf shape: B 4, s1 2, 64K each, INT8"),
    "dsa_indexer_b4_s2_64k_int8": (dict(seq_lens=(65536,) * 4), "large", "tilesim extra",
                                   "DeepSeek decode: B 4, s1 2, 64K each, INT8"),
    "dsa_indexer_b4_s2_64k_fp8": (dict(seq_lens=(65536,) * 4, path="fp8", ue8m0=True), "large",
                                  "tilesim extra", "DeepSeek decode: B 4, s1 2, 64K, FP8 UE8M0"),
    "dsa_indexer_b64_s2_uniform_int8": (dict(seq_lens=UNIFORM_64), "large", "tilesim extra",
                                        "DeepSeek decode: B 64, s1 2, the seeds' 16K..112K, INT8"),
    "dsa_indexer_b64_s2_uniform_fp8": (dict(seq_lens=UNIFORM_64, path="fp8", ue8m0=True),
                                       "large", "tilesim extra",
                                       "DeepSeek decode: B 64, s1 2, 16K..112K, FP8 UE8M0"),
    "dsa_indexer_short_int8": (dict(seq_lens=(300, 1000)), "small", "tilesim extra",
                               "B 2, s1 2, rows with < 2048 visible (-1 padding), INT8"),
    "dsa_indexer_short_fp8": (dict(seq_lens=(300, 1000), path="fp8"), "small", "tilesim extra",
                              "B 2, s1 2, rows with < 2048 visible, FP8 amax/448"),
    "dsa_indexer_boundary_int8": (dict(seq_lens=(2049,), s1=3), "small", "tilesim extra",
                                  "B 1, s1 3: rows see 2047 / 2048 / 2049 tokens, INT8"),
    "dsa_indexer_boundary_fp8": (dict(seq_lens=(2049,), s1=3, path="fp8", ue8m0=True), "small",
                                 "tilesim extra", "B 1, s1 3: rows at 2047/2048/2049, FP8"),
    "dsa_indexer_prefill_int8": (dict(seq_lens=(2052, 40), q_lens=(8, 3)), "small",
                                 "tilesim extra", "ragged prefill: 8 rows crossing 2048 "
                                 "(2045..2052 visible) + 3 short rows, INT8"),
    "dsa_indexer_prefill_fp8": (dict(seq_lens=(2052, 40), q_lens=(8, 3), path="fp8"), "small",
                                "tilesim extra", "ragged prefill crossing 2048, FP8"),
    "dsa_indexer_all_tie_int8": (dict(seq_lens=(2100, 500), all_tie=True), "small",
                                 "tilesim extra", "batch 0: one key for every token (all "
                                 "scores tie: ids 0..2047), INT8"),
    "dsa_indexer_pypto_order_int8": (dict(seq_lens=(300, 2100), int8_order="pypto"), "small",
                                     "tilesim extra", "B 2, s1 2, PyPTO's INT8 rounding order"),
}  # fmt: skip


# ----------------------------------------------------------------------------- inputs
def _checked(p: dict) -> dict:
    """``p`` (the merged builder parameters) checked, in place; returns ``p``."""
    if p["op"] not in OPS:
        raise ValueError(f"op: expected one of {OPS}, got {p['op']!r} (the decode step's cases "
                         "are built by dsa_attention_step_make_case)")  # fmt: skip
    check_choice(p["path"], "path", PATHS)
    check_choice(p["int8_order"], "int8_order", INT8_ORDERS)
    ql = new_token_rows(p, unit="batch", seq_lo=0, s1_hi=MAX_DECODE_S1, q_lo=0)
    if p["q_lens"] is not None:
        p["q_lens"] = ql
    p["topk"] = check_int(p["topk"], "topk", lo=1, hi=MAX_POSITIONS)
    check_paged_cache(p, INDEX_DIM, "k_cache")
    for k in ("ue8m0", "all_tie", "poison_unused"):
        check_bool(p[k], k)
    check_elements((sum(ql), INDEX_HEADS, INDEX_DIM), "q_lens, s1", "q")
    p["rows_per_batch"] = ql
    return p


def _quant(p: dict, x: np.ndarray):
    if p["path"] == "int8":
        return quantize_index_int8(x)
    return quantize_index_fp8(x, ue8m0=p["ue8m0"])


def _queries(p: dict, rng: np.random.Generator) -> dict:
    t = sum(p["rows_per_batch"])
    x = rng.standard_normal((t, INDEX_HEADS, INDEX_DIM), dtype=np.float32)
    codes, qs = _quant(p, x)
    w = rng.standard_normal((t, INDEX_HEADS), dtype=np.float32)
    if p["path"] == "int8":
        return {"q": codes, "q_scale": qs, "weights": w.astype(np.float16)}
    return {"q": codes, "weights": (w * qs * np.float32(WEIGHT_FOLD)).astype(np.float32)}


def _keys(p: dict, rng, table: np.ndarray, n_blocks: int, progress) -> dict:
    """The paged index-key cache, one batch at a time (module docstring)."""
    return index_key_cache(p["path"], p["seq_lens"], table, n_blocks, p["block_size"], rng,
                           ue8m0=p["ue8m0"], poison=p["poison_unused"], progress=progress,
                           desc="dsa_indexer keys", unit="batch", all_tie=p["all_tie"])  # fmt: skip


def _indexer_inputs(p: dict, seed: int, progress) -> tuple[dict, dict]:
    rng_bt, rng_q, rng_k = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    table, n_blocks = build_block_table(p["seq_lens"], p["block_size"], rng_bt)
    n_blocks += p["spare_blocks"]  # physical blocks no table entry selects
    inputs = {**_queries(p, rng_q), **_keys(p, rng_k, table, n_blocks, progress)}
    inputs["block_table"] = table
    inputs["seq_lens"] = np.asarray(p["seq_lens"], dtype=np.int32)
    params = {"path": p["path"], "topk": p["topk"], "block_size": p["block_size"]}
    if p["path"] == "int8":
        params["int8_order"] = p["int8_order"]
    if p["q_lens"] is not None:
        inputs["q_lens"] = np.asarray(p["q_lens"], dtype=np.int32)
    return inputs, params | {"n_blocks": n_blocks}


# ----------------------------------------------------------------------------- entry point
def dsa_indexer_make_case(name: str | None = None, *, seed: int = 0, progress=None,
                          **params) -> dict:  # fmt: skip
    """Build one case: a named entry of :data:`CASE_INFO` (``params`` override its builder
    parameters) or, with ``name=None``, an ad-hoc one.

    Builder parameters (:data:`DEFAULTS`): ``op`` (``"dsa_indexer"``), ``path`` (``"int8"`` /
    ``"fp8"``), ``int8_order``, ``seq_lens`` (ints), ``s1`` (decode rows per batch, 1..4) or
    ``q_lens`` (rows per batch: prefill), ``topk``, ``block_size``, ``ue8m0`` (FP8
    power-of-two scales), ``all_tie``, ``spare_blocks``, ``poison_unused`` (module docstring).
    ``progress``: the key-cache bar (a bool or None). Same arguments, same arrays. Returns the
    case dict; ``meta`` holds the seed, the builder parameters and the block count."""
    seed, p = builder_arguments(
        "dsa_indexer_make_case", name, seed, progress, params, DEFAULTS, _TABLE
    )
    p = _checked(p)
    inputs, op_params = _indexer_inputs(p, seed, progress)
    n_blocks = op_params.pop("n_blocks")
    meta = {"seed": seed, "builder_params": {k: v for k, v in p.items() if k != "rows_per_batch"},
            "n_blocks": n_blocks}  # fmt: skip
    return make_case(name=name, op="dsa_indexer", inputs=inputs, params=op_params,
                     tolerance=dict(ID_TOLERANCE), meta=meta)  # fmt: skip


# ----------------------------------------------------------------------------- registry
def _case_info(name: str) -> CaseInfo:
    build, size, status, summary = _TABLE[name]
    rule = ("set equality of ids per row (order free); equal scores: tilesim picks the lower "
            "position, no source defines a tie order (the golden stores the scores)")  # fmt: skip
    return CaseInfo(
        name=name, family="dsa_indexer", op="dsa_indexer", model="DeepSeek-V3.2",
        summary=summary, seed=0, size=size, tolerance=dict(ID_TOLERANCE), builder=BUILDER,
        kind="indexer", soc=("910b", "950") if build.get("path", "int8") == "int8" else ("950",),
        status=status, notes={"rule": rule},
    )  # fmt: skip


#: every named case (``dsa_indexer_make_case(name)`` builds it)
CASE_INFO: dict[str, CaseInfo] = {n: _case_info(n) for n in _TABLE}

__all__ = ["CASE_INFO", "DEFAULTS", "ID_TOLERANCE", "OPS", "UNIFORM_64", "WEIGHT_FOLD",
           "dsa_indexer_make_case"]  # fmt: skip
