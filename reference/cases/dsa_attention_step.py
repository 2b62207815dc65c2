"""Named cases of one DeepSeek-V3.2 attention layer step (``dsa_attention_step``,
docs/ops/dsa_attention_step.md).

``dsa_attention_step_make_case(name)`` returns a
:func:`tilesim.shared.registry.case_schema.make_case` dict:
``tilesim.reference.dsa_attention_step(**case["inputs"], **case["params"])`` is the
golden. Every array is drawn from ``SeedSequence(seed)`` streams (same arguments, same arrays),
weights included -- they are part of the case:

* the block table of :func:`tilesim.reference.cases.dsa.build_block_table`; the new tokens are
  the last ``s1`` (decode) or ``q_lens[b]`` (prefill rows, the same in every batch) positions of
  each sequence;
* ``x``: BF16 on the 256-value grid ``j / 128`` (:func:`tilesim.reference.cases.dsa.grid_bf16`,
  one random byte per value, so the 7168-wide rows cost no FP32 copy);
* weights: BF16 on the same grid times a power of two (exact); INT8 codes uniform in
  ``[-127, 127]`` with per-column FP32 scales ``U(0.05, 0.1) / 127`` (what an ``amax / 127``
  quantizer of such a column gives); E4M3 codes of the grid times 448 with FP32 block scales
  (MLA: ``U(0.05, 0.1) / 448``, or with ``weight_scale="ue8m0"`` the power of two at or
  above each; indexer: UE8M0 ``2^-10``); the true Hadamard matrix
  (:func:`tilesim.shared.hadamard.scaled_hadamard_bf16`) on the INT8 path; LayerNorm
  ``gamma ~ U(0.5, 1.5)``, ``beta ~ U(-0.1, 0.1)``;
* ``cos``/``sin``: the YaRN table of :mod:`tilesim.shared.rope` at the new tokens' positions
  (``max_seq_len`` 163840, DeepSeek-V3.2's ``max_position_embeddings``): FP32 ``[T, 32]`` on
  the FP8 path, BF16 halves ``[T, 64]`` on the INT8 path, one table for both prologs;
* the caches hold every earlier token: the latent cache grid rows quantized by
  :func:`tilesim.reference.cases.dsa.build_cache` (INT8 ``"int8"`` in the ``kv_split``
  triple; FP8 ``"fp8_ue8m0"`` in 656-byte ``"pypto"`` rows), the index cache standard normal
  keys quantized by :mod:`tilesim.shared.quant` (INT8 + FP16 scales; FP8 UE8M0 pages), one
  sequence at a time; with ``poison_unused`` (default) every other row -- the new tokens' slots
  included -- holds NaN, so a stage that reads or keeps a row it should not is visible.

``progress=``: the caches' bars (``True`` always, ``None`` after 3 s, ``False`` never). The
64K cases build in chunks: the latent cache ``CHUNK_ROWS`` rows at a time, the index cache one
sequence at a time.

The decode step's cases (``dsa_step_*``, op ``dsa_decode_step``, kind ``"decode_step"``: the
step entered at the indexer) are this family's too: their indexer half is a case of
:func:`tilesim.reference.cases.dsa_indexer.dsa_indexer_make_case` (index q, weights and
index cache drawn as the indexer's cases draw them), their attention half grid-uniform BF16
queries and a latent cache of :func:`tilesim.reference.cases.dsa.build_cache`
(:func:`decode_attention_inputs`). ``dsa_attention_step_make_case(op="dsa_decode_step",
...)`` builds an ad-hoc one.
"""

from __future__ import annotations

import numpy as np
from tilesim.reference.cases.dsa import (
    SEEDS_TOLERANCE,
    build_block_table,
    build_cache,
    grid_bf16,
    grid_bf16_bits,
    poison_rows,
    random_bytes,
)
from tilesim.reference.cases.dsa_common import (
    builder_arguments,
    check_paged_cache,
    index_key_cache,
    new_token_rows,
    table_case_info,
    yarn_rope_inputs,
)
from tilesim.reference.cases.dsa_indexer import DEFAULTS as INDEXER_DEFAULTS
from tilesim.reference.cases.dsa_indexer import UNIFORM_64, dsa_indexer_make_case
from tilesim.reference.cases.mla_prolog import WEIGHT_SCALES
from tilesim.shared.casts import BF16, FP8_E4M3_MAX, to_bf16, to_fp8_e4m3
from tilesim.shared.dsa_attention_step import DECODE_LAYOUTS, PATHS
from tilesim.shared.dsa_indexer import INDEX_HEADS, MAX_DECODE_S1, MAX_POSITIONS
from tilesim.shared.dsa_indexer_prolog import QB_COLS
from tilesim.shared.hadamard import scaled_hadamard_bf16
from tilesim.shared.layouts.index_cache import INDEX_DIM
from tilesim.shared.layouts.mla_cache import CACHE_LAYOUTS, NOPE, PATH_CACHE_LAYOUT, ROPE, is_packed
from tilesim.shared.layouts.slots import slots_from_block_table
from tilesim.shared.mla_prolog import BLOCK, HEADS, HIDDEN, KV_A, KV_LORA, Q_HEAD, Q_LORA, QK_NOPE
from tilesim.shared.models import DEEPSEEK_V32
from tilesim.shared.quant import _ue8m0
from tilesim.shared.registry.case_schema import CaseInfo, make_case, tolerance
from tilesim.shared.soc import SIM_SOCS, fp8_socs
from tilesim.shared.tiling import SaTileShapeConfig
from tilesim.shared.validate import check_bool, check_choice, check_int

BUILDER = "tilesim.reference.cases.dsa_attention_step:dsa_attention_step_make_case"
OP = "dsa_attention_step"
#: the decode step's op: the layer step entered at the indexer
DECODE_OP = "dsa_decode_step"
MAX_POSITION = 163840  #: DeepSeek-V3.2 ``max_position_embeddings`` (the YaRN table's rows)
#: the latent cache's quantizer of the earlier tokens (``tilesim.reference.cases.dsa``)
HISTORY_QUANT = {"int8": "int8", "fp8": "fp8_ue8m0"}
_64K = (65536,) * 4

_DEFAULTS = {"path": "int8", "seq_lens": (300, 1000), "s1": 2, "q_lens": None,
             "block_size": 128, "topk": 2048, "poison_unused": True, "spare_blocks": 0,
             "cache_layout": None, "weight_scale": "amax448"}  # fmt: skip


def _twins(stem: str, build: dict, size: str, status: str, summary: str,
           tails=(", INT8", ", FP8")) -> dict:  # fmt: skip
    """The INT8 and FP8 table entries of one shape: ``dsa_attention_step_{stem}_int8`` and
    ``..._fp8`` (``path="fp8"`` added to ``build``), ``tails`` ending their summaries."""
    name = f"dsa_attention_step_{stem}"
    fp8 = {**build, "path": "fp8"}
    return {f"{name}_int8": (build, size, status, summary + tails[0]),
            f"{name}_fp8": (fp8, size, status, summary + tails[1])}  # fmt: skip


# name -> (builder params, size, status, summary)
_TABLE = {
    **_twins("b4_s2_64k", dict(seq_lens=_64K), "medium", "tilesim extra",
             "seeds' decode shape B 4, s1 2, 64K", tails=(", INT8 (910B)", ", FP8 (950)")),
    **_twins("b64_s2_uniform", dict(seq_lens=UNIFORM_64), "large", "skip: large",
             "B 64, s1 2, the seeds' uniform lengths 16K..112K"),
    **_twins("short", dict(), "small", "tilesim extra",
             "B 2, s1 2, lengths 300 / 1000 (< 2048 visible)"),
    **_twins("boundary", dict(seq_lens=(2049,), s1=3), "small", "tilesim extra",
             "B 1, s1 3: rows see 2047 / 2048 / 2049 tokens"),
    **_twins("prefill", dict(seq_lens=(2052, 700), q_lens=(8, 8)), "small", "tilesim extra",
             "prefill rows: 8 new tokens per sequence, 2045..2052 and 693..700 visible"),
    "dsa_attention_step_short_fp8_ue8m0": (dict(path="fp8", weight_scale="ue8m0"), "small",
                                           "tilesim extra", "B 2, s1 2, FP8 with power-of-two "
                                           "(UE8M0) weight block scales everywhere"),
}  # fmt: skip


#: the decode step's builder parameters: the indexer builder's, the attention's latent cache
#: quant (``attn_quant``, None: the indexer's ``path``) and ``layout`` (None: ``"pypto"``)
_DECODE_DEFAULTS = {**INDEXER_DEFAULTS, "op": DECODE_OP, "attn_quant": None, "layout": None}
# name -> (builder params, size, status, summary)
_DECODE_TABLE = {
    "dsa_step_b2_s2_int8": (dict(seq_lens=(300, 2100), attn_quant="int8", layout="kv_split"),
                            "small", "tilesim extra",
                            "decode step: INT8 indexer -> top-k -> INT8 kv_split attention"),
    "dsa_step_b2_s2_fp8": (dict(seq_lens=(300, 2100), path="fp8", ue8m0=True, attn_quant="fp8",
                                layout="pypto"), "small", "tilesim extra",
                           "decode step: FP8 indexer -> top-k -> FP8 packed attention"),
}  # fmt: skip


# ----------------------------------------------------------------------------- parameters
def _checked(p: dict) -> dict:
    """``p`` (the merged builder parameters) checked, in place; returns ``p``."""
    check_choice(p["path"], "path", PATHS)
    ql = new_token_rows(p, unit="sequence", seq_lo=1, seq_hi=MAX_POSITION, s1_hi=MAX_DECODE_S1,
                        q_lo=1)  # fmt: skip
    if len(set(ql)) != 1:
        raise ValueError(f"q_lens: expected {len(ql)} equal values (one per sequence: the "
                         f"attention takes one s1), got {ql}")  # fmt: skip
    p["rows_per_batch"] = ql
    p["topk"] = check_int(p["topk"], "topk", lo=1, hi=MAX_POSITIONS)
    check_paged_cache(p, NOPE + ROPE, "the latent cache")
    check_bool(p["poison_unused"], "poison_unused")
    if p["cache_layout"] is not None:
        check_choice(p["cache_layout"], "cache_layout", CACHE_LAYOUTS)
    check_choice(p["weight_scale"], "weight_scale", WEIGHT_SCALES)
    return p


# ----------------------------------------------------------------------------- weights
def _grid(rng, shape, shift: int = 0) -> np.ndarray:
    """BF16 ``j / 128 * 2^-shift`` (``j`` = one random signed byte per value; exact)."""
    table = to_bf16(grid_bf16_bits().view(BF16).astype(np.float32) * np.float32(2.0**-shift))
    n = int(np.prod(shape))
    return table.take(random_bytes(rng, -(-n // 8) * 8)[:n]).reshape(shape)


def _int8_codes(rng, shape) -> np.ndarray:
    n = int(np.prod(shape))
    c = random_bytes(rng, -(-n // 8) * 8)[:n].view(np.int8)
    return np.maximum(c, np.int8(-127)).reshape(shape)


def _fp8_codes(rng, shape) -> np.ndarray:
    """E4M3 codes of ``grid * 448`` (never NaN)."""
    vals = grid_bf16_bits().view(BF16).astype(np.float32) * np.float32(FP8_E4M3_MAX)
    table = to_fp8_e4m3(vals)
    n = int(np.prod(shape))
    return table.take(random_bytes(rng, -(-n // 8) * 8)[:n]).reshape(shape)


def _col_scales(rng, n: int, qmax: float) -> np.ndarray:
    return (rng.uniform(0.05, 0.1, n).astype(np.float32) / np.float32(qmax)).astype(np.float32)


def _mla_weights(path: str, rng, weight_scale: str) -> dict:
    out = {"w_uk": _grid(rng, (HEADS, QK_NOPE, KV_LORA), 4), "gamma_cq": _grid(rng, (Q_LORA,)),
           "gamma_ckv": _grid(rng, (KV_LORA,))}  # fmt: skip
    if path == "int8":
        out.update(w_dq=_grid(rng, (HIDDEN, Q_LORA), 4), w_dkv_kr=_grid(rng, (HIDDEN, KV_A), 4),
                   w_uq_qr=_int8_codes(rng, (Q_LORA, HEADS * Q_HEAD)),
                   w_uq_qr_scale=_col_scales(rng, HEADS * Q_HEAD, 127))  # fmt: skip
        return out
    for name, (k, n) in (("w_dq", (HIDDEN, Q_LORA)), ("w_uq_qr", (Q_LORA, HEADS * Q_HEAD)),
                         ("w_dkv_kr", (HIDDEN, KV_A))):  # fmt: skip
        out[name] = _fp8_codes(rng, (k, n))
        nb = (k // BLOCK, -(-n // BLOCK))
        scale = _col_scales(rng, nb[0] * nb[1], FP8_E4M3_MAX).reshape(nb)
        out[name + "_scale"] = _ue8m0(scale) if weight_scale == "ue8m0" else scale
    return out


def _index_weights(path: str, rng) -> dict:
    gamma = to_bf16(rng.uniform(0.5, 1.5, INDEX_DIM).astype(np.float32))
    beta = to_bf16(rng.uniform(-0.1, 0.1, INDEX_DIM).astype(np.float32))
    if path == "int8":
        return {"w_qb": _int8_codes(rng, (Q_LORA, QB_COLS)),
                "w_qb_scale": _col_scales(rng, QB_COLS, 127).reshape(QB_COLS, 1),
                "w_k": _grid(rng, (HIDDEN, INDEX_DIM)), "w_proj": _grid(rng, (HIDDEN, INDEX_HEADS)),
                "ln_gamma": gamma, "ln_beta": beta, "hadamard_q": scaled_hadamard_bf16(),
                "hadamard_k": scaled_hadamard_bf16()}  # fmt: skip
    ue8m0 = np.float32(2.0**-10)
    return {"w_qb": _fp8_codes(rng, (Q_LORA, QB_COLS)),
            "w_qb_scale": np.full((Q_LORA // BLOCK, QB_COLS // BLOCK), ue8m0, np.float32),
            "w_k": _fp8_codes(rng, (HIDDEN, INDEX_DIM)),
            "w_k_scale": np.full((HIDDEN // BLOCK, 1), ue8m0, np.float32),
            "w_proj": _grid(rng, (HIDDEN, INDEX_HEADS)).astype(np.float32),
            "ln_gamma": gamma.astype(np.float32), "ln_beta": beta.astype(np.float32)}  # fmt: skip


# ----------------------------------------------------------------------------- caches
def _history_rows(p: dict, table: np.ndarray, n_rows: int) -> np.ndarray:
    """bool ``[n_rows]``: the rows of the earlier tokens (not the new ones)."""
    bs, used = p["block_size"], np.zeros(n_rows, dtype=bool)
    for b, (n, new) in enumerate(zip(p["seq_lens"], p["rows_per_batch"], strict=True)):
        pos = np.arange(n - new)
        used[table[b, pos // bs].astype(np.int64) * bs + pos % bs] = True
    return used


def _latent_cache(p: dict, rngs, n_rows: int, used, progress) -> dict:
    layout = p["cache_layout"] or PATH_CACHE_LAYOUT[p["path"]]
    cache = build_cache(n_rows, HISTORY_QUANT[p["path"]], layout, *rngs, progress=progress)
    if p["poison_unused"]:
        poison_rows(cache, ~used, layout)
    if is_packed(layout):
        return {"kv_cache": cache["nope_cache"]}
    return {"kv_cache": cache["kn_quant"], "kr_cache": cache["kr"],
            "kv_scale_cache": cache["kn_scales"]}  # fmt: skip


def _index_cache(p: dict, rng, table: np.ndarray, n_blocks: int, progress) -> dict:
    earlier = [n - new for n, new in zip(p["seq_lens"], p["rows_per_batch"], strict=True)]
    return index_key_cache(p["path"], earlier, table, n_blocks, p["block_size"], rng, ue8m0=True,
                           poison=p["poison_unused"], progress=progress,
                           desc="dsa_attention_step index cache", unit="seq")  # fmt: skip


# ----------------------------------------------------------------------------- entry point
def dsa_attention_step_make_case(name: str | None = None, *, seed: int = 0, progress=None,
                                 **params) -> dict:  # fmt: skip
    """Build one case: a named entry of :data:`CASE_INFO` (``params`` override its builder
    parameters) or, with ``name=None``, an ad-hoc one.

    Builder parameters: ``path`` (``"int8"`` / ``"fp8"``), ``seq_lens`` (lengths including
    the new tokens), ``s1`` (decode, 1..4) or ``q_lens`` (prefill rows, equal per sequence),
    ``block_size``, ``topk``, ``poison_unused``, ``spare_blocks`` (physical blocks no table
    entry names), ``cache_layout`` (the latent cache; ``None``: the path's), ``weight_scale``
    (the MLA prolog's FP8 block scales: ``"amax448"`` ``U(0.05, 0.1) / 448``, ``"ue8m0"``
    powers of two; the indexer prolog's are UE8M0 either way). ``progress``: the
    caches' bars. Returns the case dict; ``meta`` holds the seed, the builder parameters, the
    new tokens' positions and slots, ``n_blocks``."""
    if "op" in params:  # the layer's own name, or the decode step's
        check_choice(params["op"], "op", (OP, DECODE_OP))
        if params["op"] == OP and name not in _DECODE_TABLE:
            params = {k: v for k, v in params.items() if k != "op"}
    if name in _DECODE_TABLE or params.get("op") == DECODE_OP:
        return _decode_step_case(name, seed, progress, params)
    seed, p = builder_arguments("dsa_attention_step_make_case", name, seed, progress, params,
                                _DEFAULTS, _TABLE)  # fmt: skip
    p = _checked(p)
    rng_bt, rng_x, rng_w, rng_n, rng_r, rng_k = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(6)
    )
    bs = p["block_size"]
    table, n_blocks = build_block_table(p["seq_lens"], bs, rng_bt)
    n_blocks += p["spare_blocks"]
    lens, ql = np.asarray(p["seq_lens"], np.int32), np.asarray(p["rows_per_batch"], np.int32)
    slots = slots_from_block_table(table, lens, q_lens=ql, block_size=bs)
    pos = np.concatenate([np.arange(n - q, n) for n, q in zip(lens, ql, strict=True)])
    used = _history_rows(p, table, n_blocks * bs)
    inputs = {"x": _grid(rng_x, (slots.size, HIDDEN)), "block_table": table, "seq_lens": lens}
    if p["q_lens"] is not None:
        inputs["q_lens"] = ql
    inputs.update(_mla_weights(p["path"], rng_w, p["weight_scale"]))
    inputs.update(_index_weights(p["path"], rng_w))
    inputs.update(yarn_rope_inputs(p["path"], pos, MAX_POSITION))
    inputs.update(_latent_cache(p, (rng_n, rng_r), n_blocks * bs, used, progress))
    inputs.update(_index_cache(p, rng_k, table, n_blocks, progress))
    params_ = {"path": p["path"], "topk": p["topk"], "block_size": bs,
               "tiling": SaTileShapeConfig.preset("decode")}  # fmt: skip
    if p["cache_layout"] is not None:
        params_["cache_layout"] = p["cache_layout"]
    meta = {"seed": seed, "builder_params": {k: v for k, v in p.items() if k != "rows_per_batch"},
            "positions": pos.astype(np.int64), "slots": slots, "n_blocks": n_blocks}  # fmt: skip
    return make_case(name=name, op=OP, inputs=inputs, params=params_, tolerance=_tol(),
                     meta=meta)  # fmt: skip


# ----------------------------------------------------------------------------- decode step
def decode_attention_inputs(p: dict, inputs: dict, n_blocks: int, seed: int) -> tuple[dict, dict]:
    """The attention half of a decode-step case: grid-uniform BF16 queries ``[T*nq, 512]`` /
    ``[T*nq, 64]`` (``T`` = the rows of the indexer half's ``q``) and a latent cache of
    ``n_blocks * block_size`` rows built by :func:`tilesim.reference.cases.dsa.build_cache`
    (quant ``p["attn_quant"]``, default the indexer's path; layout ``p["layout"]``, default
    ``"pypto"``), its own streams from ``seed``. Returns ``(inputs, params)``."""
    quant = p["attn_quant"] or p["path"]
    layout = p["layout"] or "pypto"
    nq = DEEPSEEK_V32.num_q_heads
    rng_q, rng_nope, rng_rope = (
        np.random.default_rng(s) for s in np.random.SeedSequence([seed, 1]).spawn(3)
    )
    n_q = inputs["q"].shape[0] * nq
    qv = grid_bf16(random_bytes(rng_q, n_q * (NOPE + ROPE))).reshape(n_q, NOPE + ROPE)
    cache = build_cache(n_blocks * p["block_size"], quant, layout, rng_nope, rng_rope)
    out = {"query_nope": np.ascontiguousarray(qv[:, :NOPE]),
           "query_rope": np.ascontiguousarray(qv[:, NOPE:]), **cache}  # fmt: skip
    params = {"layout": layout, "nq": nq, "softmax_scale": DEEPSEEK_V32.test_softmax_scale,
              "tiling": SaTileShapeConfig.preset("decode")}  # fmt: skip
    return out, params


def _decode_step_case(name, seed, progress, params: dict) -> dict:
    """A decode-step case (module docstring): the indexer half by the indexer's builder (the
    same parameters but ``op``, ``attn_quant``, ``layout``), then the attention half."""
    seed, p = builder_arguments("dsa_attention_step_make_case", name, seed, progress, params,
                                _DECODE_DEFAULTS, _DECODE_TABLE)  # fmt: skip
    check_choice(p["op"], "op", (DECODE_OP,))
    check_choice(p["attn_quant"], "attn_quant", (None, *PATHS))
    check_choice(p["layout"], "layout", (None, *DECODE_LAYOUTS))
    if p["q_lens"] is not None:
        raise ValueError("q_lens: the decode step takes s1 (decode rows per batch), not q_lens")
    half = {k: p[k] for k in INDEXER_DEFAULTS if k != "op"}
    idx = dsa_indexer_make_case(None, seed=seed, progress=progress, **half)
    n_blocks = idx["meta"]["n_blocks"]
    attn_inputs, attn_params = decode_attention_inputs(p, idx["inputs"], n_blocks, seed)
    meta = {"seed": seed, "builder_params": p, "n_blocks": n_blocks}
    return make_case(name=name, op=DECODE_OP, inputs={**idx["inputs"], **attn_inputs},
                     params={**idx["params"], **attn_params}, meta=meta,
                     tolerance=tolerance(**SEEDS_TOLERANCE, mode="compare"))  # fmt: skip


def _decode_case_info(name: str) -> CaseInfo:
    build, size, status, summary = _DECODE_TABLE[name]
    return CaseInfo(
        name=name, family=OP, op=DECODE_OP, model="DeepSeek-V3.2", summary=summary, seed=0,
        size=size, tolerance=tolerance(**SEEDS_TOLERANCE, mode="compare"), builder=BUILDER,
        kind="decode_step", soc=fp8_socs() if build.get("path") == "fp8" else SIM_SOCS,
        status=status, notes={"rule": "attention out: the seeds' atol/rtol/ratio; "
                              "topk_indices / scores: the judge's score-aware id rule"},
    )  # fmt: skip


def _tol() -> dict:
    """The attention output's rule: the seeds' DeepSeek attention tolerance."""
    return tolerance(atol=1e-4, rtol=5e-3, ratio=0.005, mode="compare")


def _case_info(name: str) -> CaseInfo:
    return table_case_info(name, _TABLE, op=OP, builder=BUILDER, tolerance=_tol(),
                           rule="the attention output's (the seeds' sparse-attention rule); "
                                "each stage's own rule is its op's")  # fmt: skip


#: every named case (``dsa_attention_step_make_case(name)`` builds it), for the CLI registry
CASE_INFO: dict[str, CaseInfo] = {
    **{n: _case_info(n) for n in _TABLE},
    **{n: _decode_case_info(n) for n in _DECODE_TABLE},
}

__all__ = ["CASE_INFO", "HISTORY_QUANT", "decode_attention_inputs", "dsa_attention_step_make_case"]
