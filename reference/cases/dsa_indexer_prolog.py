"""Named cases of the DeepSeek-V3.2 lightning-indexer prolog (``dsa_indexer_prolog``,
docs/ops/dsa_indexer_prolog.md).

``dsa_indexer_prolog_make_case(name)`` returns a
:func:`tilesim.shared.registry.case_schema.make_case` dict: ``getattr(tilesim.reference,
case["op"])(**case["inputs"], **case["params"])`` is the
golden. Every input is drawn from ``SeedSequence(seed)`` streams (same arguments, same arrays):

* the block table of :func:`tilesim.reference.cases.dsa.build_block_table` (a random
  permutation, unused entries -1); the new tokens are the last ``s1`` (decode) or
  ``q_lens[b]`` (prefill) positions of each sequence, their slots from
  :func:`tilesim.shared.layouts.slots.slots_from_block_table`; ``pad`` padding tokens
  with slot ``-1`` follow (vLLM's convention);
* the cache already holds every earlier token's key (standard normal keys quantized by
  :mod:`tilesim.shared.quant`, one batch at a time, so the 64K cases hold one batch of FP32
  keys at most); with ``poison_unused`` (default) every other row -- the new tokens' slots
  included -- holds NaN scales and the code 0x7F (E4M3 NaN; INT8 127), so a golden or kernel
  that reads or keeps a row it should not is visible;
* ``recipe="model"`` (default): ``x ~ U(-1, 1)`` BF16; ``w_k``, ``w_proj ~ U(-1, 1)`` (pypto-gym's
  ranges); LayerNorm ``gamma ~ U(0.5, 1.5)``, ``beta ~ U(-0.1, 0.1)``; the true Hadamard
  matrix (:mod:`tilesim.shared.hadamard`) and the YaRN table of :mod:`tilesim.shared.rope` at
  the tokens' positions (``max_seq_len`` 163840, DeepSeek-V3.2's ``max_position_embeddings``).
  INT8: ``q_norm`` is a standard normal ``[T, R]`` quantized per token with pypto-gym's rule,
  ``w_qb ~ U(-0.1, 0.1)`` quantized per output column (scale ``1 / (127 * (1/colmax))``), the
  table in BF16 halves ``[T, 64]``. FP8: ``q_norm`` a BF16 standard normal, ``w_qb`` and
  ``w_k`` E4M3 with power-of-two (UE8M0) FP32 scales per 128 x 128 block (``weight_scale=
  "amax448"``: ``amax / 448``), ``w_proj`` FP32,
  the table FP32 ``[T, 32]``.
* ``recipe="gym"`` (INT8): pypto-gym's stand-ins (``hicann/pypto-gym:tests/ops/
  deepseek_v32_exp/test_lightning_indexer_prolog_quant.py``): random int8 ``q_norm`` and
  ``w_qb``, scales ``U(-1, 1)`` (negative ones included), ``gamma = 1``, ``beta = 0``,
  ``cos``/``sin`` of random angles and Hadamard matrices ``U(-1, 1)``; NumPy streams, so the
  values differ from its torch runs, the recipe and shapes are its own.

Tolerance: pypto-gym's limits of its prolog test per output (:data:`GYM_TOLERANCES`); the
case's own tolerance is the q codes' (``atol 1, rtol 0, ratio 0``).
"""

from __future__ import annotations

import numpy as np
from tilesim.reference.cases.dsa import build_block_table
from tilesim.reference.cases.dsa_common import (
    builder_arguments,
    check_paged_cache,
    index_key_cache,
    new_token_rows,
    table_case_info,
    yarn_rope_inputs,
)
from tilesim.reference.cases.mla_prolog import WEIGHT_SCALES
from tilesim.shared.casts import BF16, FP8_E4M3_MAX, to_bf16, to_fp8_e4m3
from tilesim.shared.dsa_indexer import INDEX_HEADS
from tilesim.shared.dsa_indexer_prolog import (
    FP8_BLOCK,
    PATHS,
    PROLOG_ROPE_PAIRINGS,
    QB_COLS,
)
from tilesim.shared.hadamard import scaled_hadamard_bf16
from tilesim.shared.layouts.index_cache import INDEX_DIM
from tilesim.shared.layouts.slots import slots_from_block_table
from tilesim.shared.quant import _ue8m0
from tilesim.shared.registry.case_schema import CASE_FAMILIES, CaseInfo, make_case, tolerance
from tilesim.shared.validate import (
    check_bool,
    check_choice,
    check_elements,
    check_int,
)

BUILDER = "tilesim.reference.cases.dsa_indexer_prolog:dsa_indexer_prolog_make_case"
OP = "dsa_indexer_prolog"
#: pypto-gym's per-output limits of its prolog test: name -> (atol, rtol, ratio)
GYM_TOLERANCES = {
    "q": (1.0, 0.0, 0.0),
    "q_scale": (2.5e-5, 0.0, 0.005),
    "k_cache": (1.0, 0.0, 0.0),
    "k_scale": (2.5e-5, 0.0, 0.0),
    "weights": (2.5e-5, 0.0, 0.0),
}
HIDDEN = 7168  #: DeepSeek-V3.2 ``dim``
Q_LORA_RANK = 1536  #: DeepSeek-V3.2 ``q_lora_rank``
MAX_POSITION = 163840  #: DeepSeek-V3.2 ``max_position_embeddings`` (the YaRN table's rows)
_GYM_64K = (65536,) * 4

_DEFAULTS = {
    "path": "int8", "seq_lens": (300, 1000), "s1": 2, "q_lens": None, "pad": 0,
    "block_size": 128, "rope_pairing": "halves", "recipe": "model", "hidden": HIDDEN,
    "rank": Q_LORA_RANK, "poison_unused": True, "spare_blocks": 0, "ue8m0": True,
    "weight_scale": "ue8m0",
}  # fmt: skip

# name -> (builder params, size, status, summary)
_TABLE = {
    "li_prolog_quant_b4_s1_2_64k": (dict(seq_lens=_GYM_64K, recipe="gym"), "medium",
                                    "skip: large", "pypto-gym shape: B 4, s1 2, s2 64K, INT8, "
                                    "its random stand-ins"),
    "dsa_indexer_prolog_b4_s2_64k_int8": (dict(seq_lens=_GYM_64K), "medium", "tilesim extra",
                                          "DeepSeek decode B 4, s1 2, 64K, INT8, true "
                                          "Hadamard + YaRN"),
    "dsa_indexer_prolog_b4_s2_64k_fp8": (dict(seq_lens=_GYM_64K, path="fp8"), "medium",
                                         "tilesim extra", "DeepSeek decode B 4, s1 2, 64K, "
                                         "FP8 UE8M0, 132-byte pages"),
    "dsa_indexer_prolog_short_int8": (dict(), "small", "tilesim extra",
                                      "B 2, s1 2, lengths 300 / 1000, INT8"),
    "dsa_indexer_prolog_short_fp8": (dict(path="fp8"), "small", "tilesim extra",
                                     "B 2, s1 2, lengths 300 / 1000, FP8"),
    "dsa_indexer_prolog_short_fp8_amax448": (dict(path="fp8", weight_scale="amax448"), "small",
                                             "tilesim extra", "B 2, s1 2, FP8, amax/448 "
                                             "weight block scales"),
    "dsa_indexer_prolog_pad_int8": (dict(seq_lens=(129, 1), s1=1, pad=2), "small",
                                    "tilesim extra", "B 2, s1 1, a 1-token sequence and 2 "
                                    "padding tokens (slot -1), INT8"),
    "dsa_indexer_prolog_prefill_fp8": (dict(seq_lens=(2049, 40), q_lens=(6, 3), path="fp8"),
                                       "small",
                                       "tilesim extra", "ragged prefill: 6 + 3 new tokens "
                                       "across a block boundary, FP8"),
    "dsa_indexer_prolog_prefix_rope_fp8": (dict(path="fp8", rope_pairing="interleaved"),
                                           "small", "tilesim extra", "DeepSeek's pre-fix "
                                           "interleaved indexer RoPE, FP8"),
}  # fmt: skip


# ----------------------------------------------------------------------------- parameters
def _checked(p: dict) -> dict:
    """``p`` (the merged builder parameters) checked, in place; returns ``p``."""
    check_choice(p["path"], "path", PATHS)
    check_choice(p["rope_pairing"], "rope_pairing", PROLOG_ROPE_PAIRINGS)
    check_choice(p["recipe"], "recipe", ("model", "gym"))
    if p["recipe"] == "gym" and p["path"] != "int8":
        raise ValueError("recipe: 'gym' (pypto-gym's stand-ins) is an INT8-path recipe")
    ql = new_token_rows(p, unit="sequence", seq_lo=1, q_lo=0)
    p["rows_per_batch"] = ql
    p["pad"] = check_int(p["pad"], "pad", lo=0)
    check_paged_cache(p, INDEX_DIM, "k_cache")
    for k in ("hidden", "rank"):
        p[k] = check_int(p[k], k, lo=FP8_BLOCK)
        if p[k] % FP8_BLOCK:
            raise ValueError(f"{k}: expected a multiple of 128, got {p[k]}")
    for k in ("poison_unused", "ue8m0"):
        check_bool(p[k], k)
    check_choice(p["weight_scale"], "weight_scale", WEIGHT_SCALES)
    if max(p["seq_lens"]) > MAX_POSITION:
        raise ValueError(f"seq_lens: expected lengths <= {MAX_POSITION}, got {max(p['seq_lens'])}")
    check_elements((sum(ql) + p["pad"], p["hidden"]), "seq_lens, pad, hidden", "x")
    check_elements((p["rank"], QB_COLS), "rank", "w_qb")
    check_elements((sum(ql) + p["pad"], p["rank"]), "seq_lens, pad, rank", "q_norm")
    return p


# ----------------------------------------------------------------------------- weights
def _uniform_bf16(rng, lo: float, hi: float, shape) -> np.ndarray:
    return to_bf16(rng.uniform(lo, hi, shape).astype(np.float32))


def _int8_gym_rule(v: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """pypto-gym's INT8 rule along ``axis``: factor ``FP32(FP32(1/amax) * 127)``, codes
    ``rint(v * factor)``, dequant scale ``FP32(1 / factor)`` (FP32, keepdims)."""
    f = (np.float32(1) / np.abs(v).max(axis=axis, keepdims=True)) * np.float32(127)
    return np.rint(v * f).astype(np.int8), (np.float32(1) / f).astype(np.float32)


def _fp8_blocks(w: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """FP32 ``w [K, N]`` -> E4M3 codes and FP32 scales ``[K/128, N/128]``: UE8M0 (``kind
    "ue8m0"``, the power of two at or above ``amax / 448``) or ``amax / 448`` itself."""
    k, n = w.shape
    g = w.reshape(k // FP8_BLOCK, FP8_BLOCK, n // FP8_BLOCK, FP8_BLOCK)
    amax = np.maximum(np.abs(g).max(axis=(1, 3)), np.float32(1e-4))
    s = amax / np.float32(FP8_E4M3_MAX)
    if kind == "ue8m0":
        s = _ue8m0(s)
    codes = to_fp8_e4m3(g / s[:, None, :, None]).reshape(k, n)
    return codes, s.astype(np.float32)


def _int8_weights(p: dict, rng, t: int) -> dict:
    r = p["rank"]
    if p["recipe"] == "gym":
        return {
            "q_norm": rng.integers(-128, 128, (t, r)).astype(np.int8),
            "q_norm_scale": rng.uniform(-1, 1, (t, 1)).astype(np.float32),
            "w_qb": rng.integers(-128, 128, (r, QB_COLS)).astype(np.int8),
            "w_qb_scale": rng.uniform(-1, 1, (QB_COLS, 1)).astype(np.float32),
            "hadamard_q": _uniform_bf16(rng, -1, 1, (INDEX_DIM, INDEX_DIM)),
            "hadamard_k": _uniform_bf16(rng, -1, 1, (INDEX_DIM, INDEX_DIM)),
            "ln_gamma": np.ones(INDEX_DIM, BF16), "ln_beta": np.zeros(INDEX_DIM, BF16),
        }  # fmt: skip
    qn, qs = _int8_gym_rule(rng.standard_normal((t, r), dtype=np.float32), axis=1)
    wq, ws = _int8_gym_rule(rng.uniform(-0.1, 0.1, (r, QB_COLS)).astype(np.float32), axis=0)
    return {"q_norm": qn, "q_norm_scale": qs, "w_qb": wq, "w_qb_scale": ws.reshape(QB_COLS, 1),
            "hadamard_q": scaled_hadamard_bf16(), "hadamard_k": scaled_hadamard_bf16()}  # fmt: skip


def _weights(p: dict, rng, t: int) -> dict:
    h, r = p["hidden"], p["rank"]
    out = {
        "x": _uniform_bf16(rng, -1, 1, (t, h)),
        "ln_gamma": _uniform_bf16(rng, 0.5, 1.5, (INDEX_DIM,)),
        "ln_beta": _uniform_bf16(rng, -0.1, 0.1, (INDEX_DIM,)),
    }
    if p["path"] == "int8":
        out["w_k"] = _uniform_bf16(rng, -1, 1, (h, INDEX_DIM))
        out["w_proj"] = _uniform_bf16(rng, -1, 1, (h, INDEX_HEADS))
        return {**out, **_int8_weights(p, rng, t)}
    out["ln_gamma"], out["ln_beta"] = (out[k].astype(np.float32) for k in ("ln_gamma", "ln_beta"))
    out["q_norm"] = to_bf16(rng.standard_normal((t, r), dtype=np.float32))
    kind = p["weight_scale"]
    out["w_qb"], out["w_qb_scale"] = _fp8_blocks(rng.standard_normal((r, QB_COLS), np.float32),
                                                 kind)  # fmt: skip
    out["w_k"], out["w_k_scale"] = _fp8_blocks(rng.standard_normal((h, INDEX_DIM), np.float32),
                                               kind)  # fmt: skip
    out["w_proj"] = rng.uniform(-1, 1, (h, INDEX_HEADS)).astype(np.float32)
    return out


def _rope(p: dict, rng, positions: np.ndarray) -> dict:
    if p["recipe"] == "gym":  # cos / sin of independent random angles, BF16 [T, 64]
        ang = rng.random((positions.size, 64), dtype=np.float32) * np.float32(2 * np.pi)
        return {"cos": to_bf16(np.cos(ang)), "sin": to_bf16(np.sin(ang))}
    return yarn_rope_inputs(p["path"], positions, MAX_POSITION)


# ----------------------------------------------------------------------------- the cache
def _cache(p: dict, rng, table: np.ndarray, n_blocks: int, progress) -> dict:
    """The index-key cache holding every earlier token's key (module docstring)."""
    earlier = [n - new for n, new in zip(p["seq_lens"], p["rows_per_batch"], strict=True)]
    return index_key_cache(p["path"], earlier, table, n_blocks, p["block_size"], rng,
                           ue8m0=p["ue8m0"], poison=p["poison_unused"], progress=progress,
                           desc="dsa_indexer_prolog cache", unit="seq")  # fmt: skip


# ----------------------------------------------------------------------------- entry point
def dsa_indexer_prolog_make_case(name: str | None = None, *, seed: int = 0, progress=None,
                                 **params) -> dict:  # fmt: skip
    """Build one case: a named entry of :data:`CASE_INFO` (``params`` override its builder
    parameters) or, with ``name=None``, an ad-hoc one.

    Builder parameters: ``path`` (``"int8"`` / ``"fp8"``), ``seq_lens`` (lengths including
    the new tokens), ``s1`` (new tokens per sequence) or ``q_lens`` (per sequence: prefill),
    ``pad`` (padding tokens, slot ``-1``), ``block_size``, ``rope_pairing``, ``recipe``
    (``"model"`` / ``"gym"``), ``hidden`` / ``rank`` (7168 / 1536; smaller multiples of 128
    for quick tests), ``poison_unused``, ``spare_blocks``, ``ue8m0`` (FP8), ``weight_scale``
    (FP8 weight block scales: ``"ue8m0"`` powers of two, ``"amax448"`` ``amax / 448``;
    :data:`tilesim.reference.cases.mla_prolog.WEIGHT_SCALES`). ``progress``: the
    cache bar (a bool or None). Returns the case dict; ``meta`` holds the seed, the builder
    parameters, the block table, ``seq_lens``, ``q_lens`` and the tokens' positions (what
    the indexer reading the cache afterwards needs)."""
    seed, p = builder_arguments("dsa_indexer_prolog_make_case", name, seed, progress, params,
                                _DEFAULTS, _TABLE)  # fmt: skip
    p = _checked(p)
    rng_bt, rng_w, rng_k = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    table, n_blocks = build_block_table(p["seq_lens"], p["block_size"], rng_bt)
    n_blocks += p["spare_blocks"]
    lens, ql = np.asarray(p["seq_lens"]), np.asarray(p["rows_per_batch"])
    slots = slots_from_block_table(table, lens, q_lens=ql, block_size=p["block_size"])
    pos = np.concatenate([np.arange(n - q, n) for n, q in zip(lens, ql, strict=True)])
    slots = np.concatenate([slots, np.full(p["pad"], -1, np.int64)])
    pos = np.concatenate([pos, np.zeros(p["pad"], np.int64)]).astype(np.int64)
    inputs = _weights(p, rng_w, slots.size)
    inputs.update(_rope(p, rng_w, pos))
    inputs.update(_cache(p, rng_k, table, n_blocks, progress))
    inputs["slot_mapping"] = slots
    op_params = {"path": p["path"], "rope_pairing": p["rope_pairing"],
                 "block_size": p["block_size"]}  # fmt: skip
    if p["path"] == "fp8":
        op_params["ue8m0"] = p["ue8m0"]
    meta = {"seed": seed, "builder_params": {k: v for k, v in p.items() if k != "rows_per_batch"},
            "block_table": table, "seq_lens": lens.astype(np.int32), "q_lens": ql.astype(np.int32),
            "positions": pos, "n_blocks": n_blocks}  # fmt: skip
    return make_case(name=name, op=OP, inputs=inputs, params=op_params, tolerance=_tol(),
                     meta=meta)  # fmt: skip


def _tol() -> dict:
    atol, rtol, ratio = GYM_TOLERANCES["q"]
    return tolerance(atol=atol, rtol=rtol, ratio=ratio, mode="compare")


def _case_info(name: str) -> CaseInfo:
    return table_case_info(name, _TABLE, op=OP, builder=BUILDER, tolerance=_tol(),
                           rule="pypto-gym's per-output limits (GYM_TOLERANCES); the q codes' "
                                "limit shown")  # fmt: skip


#: every named case (``dsa_indexer_prolog_make_case(name)`` builds it); registered once the
#: family is listed in ``tilesim.shared.registry.case_schema.CASE_FAMILIES``
CASE_INFO: dict[str, CaseInfo] = {n: _case_info(n) for n in _TABLE} if OP in CASE_FAMILIES else {}

__all__ = ["CASE_INFO", "GYM_TOLERANCES", "dsa_indexer_prolog_make_case"]
